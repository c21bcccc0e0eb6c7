"""Load-time checks of an experiment config that need only the config (no model, no batch).

Each refuses, with a :class:`~rllab.errors.ConfigError` naming the section, the component and its
plugin, a combination that would otherwise fail only after the model is built (or not at all):

- a policy loss that receives the rollout engine's log-probs as ``old_log_prob`` (its trait
  ``old_log_prob="rollout"``, bypass mode) with an importance correction other than ``none``,
  which would be applied on top of the loss's own;
- a rollout backend that needs the policy on CUDA for a config (its trait ``needs_cuda``, e.g.
  SGLang's ``weight_sync = "tensor"``) while ``[model] device`` is the CPU (``auto``:
  :func:`rllab.checks.run.check_backend_device`, where no CUDA device is available).

- a config that sets both ``task`` and ``env`` (before the components are built), episode limits
  with a task, an environment whose ``max_turns`` gives its episodes no bound.
- a component section the algorithm does not read, or a component that requires an input the
  algorithm does not provide (its traits ``uses`` / ``provides``);
- an advantage estimator that normalises each reward component with a task of fewer than two
  components, a ``reward_weights`` of another length, or an overlong penalty it would not read.

- a launcher and a strategy that disagree: ``WORLD_SIZE > 1`` in the environment (``torchrun``
  started several processes) with ``[model] strategy = "single"``, where each process would train
  its own copy and all would write one run directory; and a malformed ``torchrun`` environment;
- a ``[[schedule]]`` entry that changes what is fixed for a run (:data:`FROZEN_DURING_A_RUN`) or
  that cannot apply (:func:`check_schedule_applies`).

Called by :func:`rllab.config.validate` after the components are built; the checks of the run's
settings against its components' traits are :mod:`rllab.checks.run`'s.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

import attrs

from rllab.errors import ConfigError, RllabError
from rllab.lab import Lab
from rllab.parallel.launcher import launcher_env  # noqa: F401  (re-exported: read with the launcher check)
from rllab.members import member
from rllab.specs import ComponentSpec, build_config
from rllab.models.tinyconfig import TinyModelConfig, WarmStartConfig
from rllab.records.tomlio import line_of


def check_config_only(lab: Lab, components: Mapping[str, Any], model: Any, *, unused: frozenset, text: str, where: str) -> None:
    """Every check of this module, on the built ``components`` (section → ComponentRef) and the
    ``[model]`` settings; ``unused`` are the sections the algorithm does not read (not checked)."""
    if "policy_loss" not in unused and "correction" not in unused:
        _check_bypass_correction(lab, components, text=text, where=where)
    if "backend" not in unused:
        check_backend_device(lab, components, str(model.device), text=text, where=where)


def _check_bypass_correction(lab: Lab, components: Mapping[str, Any], *, text: str, where: str) -> None:
    loss, corr = components["policy_loss"], components["correction"]
    spec = lab.spec("policy_loss", loss.name)
    if spec.trait("old_log_prob", loss.config) != "rollout" or lab.spec("importance_correction", corr.name).trait("identity", corr.config):
        return
    raise ConfigError(
        f"{where}: [correction]{line_of(text, 'correction', 'name') or line_of(text, None, 'correction')} "
        f"policy_loss {loss.name!r} (plugin {spec.provider}) corrects for the sampler itself (bypass mode: it "
        f"receives the rollout engine's log-probs as old_log_prob), so correction {corr.name!r} would be applied "
        f"on top of it: set correction = \"none\", or use a policy loss without bypass mode with {corr.name!r}.",
        key="correction",
    )


def check_backend_device(lab: Lab, components: Mapping[str, Any], device: str, *, text: str = "", where: str = "<config>") -> None:
    """Refuse a backend whose ``needs_cuda`` trait is set for its config when the policy's
    ``device`` (``[model] device``, or the device ``auto`` resolved to) is not CUDA. ``auto`` is
    :func:`rllab.checks.run.check_backend_device`'s, which resolves it only for a backend that needs CUDA."""
    backend = components["backend"]
    spec = lab.spec("rollout_backend", backend.name)
    reason = spec.trait("needs_cuda", backend.config)
    if reason is None or device == "auto" or device.startswith("cuda"):
        return
    raise ConfigError(
        f"{where}: [backend]{line_of(text, 'backend', 'name') or line_of(text, None, 'backend')} rollout_backend "
        f"{backend.name!r} (plugin {spec.provider}) needs the policy on CUDA: {reason}; but the policy is on {device} "
        f"([model] device). Set [model] device = \"cuda\" on a GPU machine, or change the backend's setting.",
        key="backend",
    )


def check_launcher(model: Any, text: str, where: str) -> None:
    """Refuse ``WORLD_SIZE > 1`` with a single-process strategy: every process would build and
    train its own identical model and write the same run directory (each metric row twice, a
    race on every checkpoint). Checked at load, before any model is built."""
    from rllab.parallel import placement

    _, world, _ = launcher_env()
    if world == 1 or placement.strategy(model.strategy).data_parallel:
        return
    fix = " or ".join(f"model.strategy={n}" for n in placement.names(data_parallel=True))
    raise ConfigError(
        f"{where}: WORLD_SIZE={world} in the environment (torchrun started {world} processes) but [model] strategy = "
        f"{model.strategy!r}{line_of(text, 'model', 'strategy')} (one process, one device): each of the {world} "
        f"processes would train its own copy of the model on the same data and all would write the same run "
        f"directory. Set {fix} to train one model over the {world} processes (data parallel), or run "
        f"one process (without torchrun)",
        key="strategy",
    )


def check_model_settings(model: Any, text: str, where: str) -> None:
    """Validate ``model.tiny`` / ``model.warm_start`` against the tiny model's own config classes,
    and ``model.lora`` when adapters are asked for."""
    for key, cls in (("tiny", TinyModelConfig), ("warm_start", WarmStartConfig)):
        pseudo = ComponentSpec(kind="section", name=f"model.{key}", fn=lambda: None, config=cls, provider="rllab")
        try:
            build_config(pseudo, getattr(model, key))
        except ConfigError as e:
            msg = str(e).replace(f"section 'model.{key}' (plugin rllab)", f"[model] {key}")
            raise ConfigError(f"{where}: {msg}{line_of(text, 'model', key)}") from None
    if model.lora:  # rllab.models.lora imports torch: only when adapters are asked for
        from rllab.models import lora

        lora.check_settings(model, text=text, where=where)


def _section_knobs(value: Any) -> dict:
    return {k: v for k, v in value.items() if k != "name"} if isinstance(value, Mapping) else {}


def _settings(sec: str, knobs: Mapping) -> str:
    """``knobs`` as the command line writes them: ``task.digits=3 task.seed=1``."""
    from rllab.records.tomlio import dump_toml

    return " ".join(f"{sec}.{k}={dump_toml({'v': v}).strip()[len('v = '):]}" for k, v in knobs.items())


def check_one_source(data: Mapping[str, Any], text: str, where: str, lab: Lab | None = None) -> None:
    """``task`` and ``env`` are exclusive: a config that sets both is refused, naming what was set of
    each (a component's name, or the knobs given without one, e.g. ``task.digits=3``) and, for a
    knob of the other section, the environment's (or task's) own knob of that name when it has one."""
    if "task" not in data or "env" not in data:
        return
    names = {sec: (data[sec].get("name") if isinstance(data[sec], Mapping) else data[sec]) for sec in ("task", "env")}
    knobs = {sec: _section_knobs(data[sec]) for sec in ("task", "env")}
    line = line_of(text, None, "env") or line_of(text, "env", "name")
    if names["task"] is not None and names["env"] is not None:
        raise ConfigError(
            f"{where}: both task {names['task']!r} and env {names['env']!r}{line} are set; a run draws its "
            f"examples from a task or from an environment, not both: drop one of them",
            key="env",
        )
    # one side is knobs without a component: say which settings, and where they would go on the other side
    stray, chosen = ("task", "env") if names["task"] is None else ("env", "task")
    kind = {"task": "task", "env": "environment"}
    given = _settings(stray, knobs[stray])
    if names[chosen] is None:  # knobs on both sides, no component named on either
        raise ConfigError(
            f"{where}: {given} and {_settings(chosen, knobs[chosen])} set knobs of a task and of an environment, and neither "
            f"is named; a run draws its examples from one: name it (task=NAME or env=NAME) and keep only its knobs",
            key=stray,
        )
    hint = ""
    if lab is not None:
        try:
            own = [k.name for k in lab.spec(kind[chosen], names[chosen]).knobs()]
        except KeyError:
            return  # an unknown name: the component check names it, with the names close to it
        if own is not None:
            same = [k for k in knobs[stray] if k in own]
            close = {k: difflib.get_close_matches(k, own, n=3, cutoff=0.6) for k in knobs[stray] if k not in own}
            if same:
                hint = f"; {kind[chosen]} {names[chosen]!r} has its own: {_settings(chosen, {k: knobs[stray][k] for k in same})}"
            elif any(close.values()):
                hint = f"; {kind[chosen]} {names[chosen]!r} has no knob {', '.join(map(repr, close))}, its closest: " + ", ".join(
                    f"{chosen}.{c}" for cs in close.values() for c in cs)
            else:
                hint = f"; {kind[chosen]} {names[chosen]!r} has no such knob (its knobs: {', '.join(own) or 'none'})"
    one = len(knobs[stray]) == 1
    other = f"drop {'it' if one else 'them'} to train on the {kind[chosen]}"
    if chosen == "task":
        other += ", or name an environment to play (env=NAME) in place of the task"
    article = "an" if kind[stray][0] in "aeiou" else "a"
    raise ConfigError(
        f"{where}: {given} {'sets a knob' if one else 'set knobs'} of {article} {kind[stray]}, but this config "
        f"draws its examples from {kind[chosen]} {names[chosen]!r}{line if chosen == 'env' else ''} (a run has a task or "
        f"an environment, not both): {other}{hint}",
        key=stray,
    )


def check_episode_settings(lab: Lab, components: Mapping[str, Any], rollout: Any, *, unused: frozenset, text: str, where: str) -> None:
    """The ``[rollout]`` episode settings: with a task (one turn per sample) they would do
    nothing, so setting one is refused; an environment's episodes need a bound on their turns,
    ``rollout.max_turns`` or the environment's own ``max_turns`` (read from its registration's
    factory when it is a class attribute; an instance's is checked when the run builds it)."""
    if "task" in components:
        _check_no_episode_settings(components["task"], rollout, text=text, where=where)
        return
    env = components.get("env")
    if env is not None and rollout.over_sample > 0:
        raise ConfigError(
            f"{where}: [rollout] over_sample{line_of(text, 'rollout', 'over_sample')} = {rollout.over_sample!r}: partial "
            f"rollouts stop and resume single-turn samples; environment {env.name!r} plays episodes of several turns. "
            f"Set rollout.over_sample = 0, or use a task",
            key="over_sample",
        )
    if env is None or "env" in unused or rollout.max_turns is not None:
        return
    spec = lab.spec("environment", env.name)
    declared = member(spec.fn, "environment", "max_turns")
    if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int) or declared < 1):
        raise ConfigError(
            f"{where}: environment {env.name!r} (plugin {spec.provider}) declares max_turns = {declared!r}; it must be "
            f"an integer ≥ 1 (or set rollout.max_turns)",
            key="max_turns",
        )


def environment_rollout_defaults(lab: Lab, env: Any, rollout: Any, given: Mapping[str, Any], *, where: str = "<config>") -> Any:
    """``rollout`` with the environment's own defaults (``rollout_defaults``, a dict of ``[rollout]``
    settings declared on its registered factory, e.g. ``{"max_new_tokens": 16}`` for turns that
    hold a tool call) applied to the settings the config does not set; a setting the config gives
    wins. The run's saved config shows the values used."""
    spec = lab.spec("environment", env.name)
    wanted = dict(member(spec.fn, "environment", "rollout_defaults"))
    fields = attrs.fields_dict(type(rollout))
    unknown = sorted(set(wanted) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: environment {env.name!r} (plugin {spec.provider}) declares rollout_defaults for unknown [rollout] "
            f"settings {unknown}; known: {', '.join(sorted(fields))}"
        )
    changes = {k: v for k, v in wanted.items() if k not in given}
    try:
        return attrs.evolve(rollout, **changes) if changes else rollout
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: environment {env.name!r} (plugin {spec.provider}): rollout_defaults: {e}") from None


EPISODE_SETTINGS = ("max_turns", "max_episode_tokens", "turn_limit_reward", "overflow_reward")
"""[rollout] settings that only an environment's episodes read."""


def _check_no_episode_settings(task: Any, rollout: Any, *, text: str, where: str) -> None:
    """A task's episodes have one turn: the episode limits would have no effect, so setting one is refused."""
    defaults = attrs.fields_dict(type(rollout))
    for key in EPISODE_SETTINGS:
        if getattr(rollout, key) != defaults[key].default:
            raise ConfigError(
                f"{where}: [rollout] {key}{line_of(text, 'rollout', key)} limits an environment's episodes, but this run "
                f"samples task {task.name!r} (one turn per sample), so it would have no effect; unset it or choose an "
                f"environment (env = NAME)",
                key=key,
            )


def check_algorithm_fit(lab: Lab, components: dict, *, kinds: Mapping[str, str], explicit: set[str], text: str, where: str) -> frozenset:
    """Refuse what the chosen algorithm cannot honour: a component section it never reads (when
    the config set it), or a component that requires an input the algorithm does not provide.
    ``kinds``: each section's component kind (:data:`rllab.config.COMPONENT_SECTIONS`). Returns
    the sections the algorithm does not use."""
    algo = components["algorithm"]
    algo_spec = lab.spec("algorithm", algo.name)
    uses, provides = algo_spec.trait("uses"), algo_spec.trait("provides")
    unused: set[str] = set()
    for sec, ref in components.items():
        if sec == "algorithm":
            continue
        if uses is not None and sec not in uses:
            if sec in explicit:
                raise ConfigError(
                    f"{where}: [{sec}]{line_of(text, None, sec) or line_of(text, sec, 'name')} is set, but algorithm "
                    f"{algo.name!r} does not use it, so it would have no effect. Algorithm {algo.name!r} uses: "
                    f"{', '.join(sorted(uses))}.",
                    key=sec,
                )
            unused.add(sec)
            continue
        spec = lab.spec(kinds[sec], ref.name)
        missing = [r for r in spec.requires if r not in provides.get(spec.kind, ())]
        if missing:
            have = ", ".join(sorted(provides.get(spec.kind, ()))) or "none"
            raise ConfigError(
                f"{where}: [{sec}] {spec.kind} {ref.name!r} (plugin {spec.provider}) requires {', '.join(missing)}, which "
                f"algorithm {algo.name!r} does not provide to a {spec.kind} (it provides: {have}).",
                key=sec,
            )
    return frozenset(unused)


def check_reward_components(lab: Lab, components: dict, rollout: Any, *, text: str, where: str) -> None:
    """An estimator that ``requires=("reward_components",)`` needs K ≥ 2 task reward components (the
    task's ``reward_components`` trait; when undeclared, checked on the first batch), K
    ``reward_weights`` and no overlong penalty (it shapes only the scalar score)."""
    adv, task = components["advantage"], components["task"]
    est = lab.spec("advantage_estimator", adv.name)
    if getattr(rollout, "random_reward", "off") != "off" and "reward_baselines" in est.requires:
        raise ConfigError(
            f"{where}: [rollout] random_reward{line_of(text, 'rollout', 'random_reward')}: advantage_estimator {adv.name!r} "
            f"(plugin {est.provider}) subtracts the task reward of a greedy answer, which the random reward does not "
            f"replace (it would tell training which prompts are solved); use a group estimator (grpo, rloo) for the control",
            key="random_reward",
        )
    if "reward_components" not in est.requires:
        return
    names = lab.spec("task", task.name).trait("reward_components", task.config)
    if names is None:
        return
    who = f"advantage_estimator {adv.name!r} (plugin {est.provider})"
    if getattr(rollout, "random_reward", "off") != "off":
        raise ConfigError(
            f"{where}: [rollout] random_reward{line_of(text, 'rollout', 'random_reward')}: the random reward replaces the "
            f"scalar reward, but {who} reads task {task.name!r}'s reward components, which it does not replace; use a "
            f"scalar estimator (grpo, rloo) for the control",
            key="random_reward",
        )
    if len(names) < 2:
        raise ConfigError(
            f"{where}: [advantage]{line_of(text, 'advantage', 'name') or line_of(text, None, 'advantage')} {who} "
            f"normalises each reward component on its own, but task {task.name!r} has "
            f"{'one reward' if not names else f'one reward component {names[0]!r}'}: with one component it is GRPO's "
            f"group normalisation followed by batch whitening. Use a task with several reward components (e.g. "
            f"task.format_weight = 0.1 on 'addition') or another estimator (grpo, reinforce_plus_plus_baseline).",
            key="advantage",
        )
    weights = est.trait("component_weights", adv.config)
    if weights is not None and len(weights) != len(names):
        raise ConfigError(
            f"{where}: [advantage] reward_weights{line_of(text, 'advantage', 'reward_weights')}: {who} has "
            f"{len(weights)} weight{'s' * (len(weights) != 1)} for the {len(names)} reward components {names!r} of task {task.name!r}.",
            key="reward_weights",
        )
    if getattr(rollout, "overlong_buffer", 0) > 0:
        raise ConfigError(
            f"{where}: [rollout] overlong_buffer{line_of(text, 'rollout', 'overlong_buffer')}: the overlong penalty "
            f"shapes the scalar score, which {who} does not read (it reads task {task.name!r}'s reward components); "
            f"set rollout.overlong_buffer = 0.",
            key="overlong_buffer",
        )


# --------------------------------------------------------------------------- [[schedule]] entries

FROZEN_DURING_A_RUN = {
    "model": "the model is built once",
    "task": "the task's data order is fixed for the run",
    "env": "the environment's data order is fixed for the run",
    "backend": "the rollout backend is started once",
    "sampler": "the prompt sampler is built once and keeps what it learned from the run's rewards",
    "algorithm.name": "the algorithm owns the run's data (pairs, buffers); its knobs may change",
    "train.seed": "every step's data derives from the seed",
    "train.steps": "extend a run with `rllab run --resume RUN_DIR train.steps=N`",
    "train.lr_schedule": "the schedule's shape is fixed; schedule train.lr instead",
    "train.warmup_steps": "the schedule's shape is fixed; schedule train.lr instead",
    "train.lr_schedule_unit": "the schedule's shape is fixed; schedule train.lr instead",
    "train.lr_warmup": "the schedule's shape is fixed; schedule train.lr instead",
    "train.lr_schedule_steps": "the schedule's shape is fixed; schedule train.lr instead",
    "output_dir": "the run directory exists already",
    "name": "the run directory exists already",
    "loggers": "loggers are opened once",
    "plugins": "plugins load before the run",
}
"""Keys a ``[[schedule]]`` entry may not change, and why."""


def check_change(old: Any, new: Any) -> None:
    """Refuse ``new`` in place of ``old`` during a run (a swap, a schedule entry, a checkpoint's
    config): the model, task, environment, backend and sampler are built once, the algorithm owns
    the run's data (its knobs may change), every step's data derives from ``train.seed``, and
    batches sampled ahead (``rollout.max_staleness > 0``) were sampled with the ``[rollout]`` in force."""
    for frozen in ("model", "task", "env", "backend", "sampler"):
        if new.to_dict().get(frozen) != old.to_dict().get(frozen):
            raise RllabError(f"[{frozen}] cannot change during a run")
    if new.component("algorithm").name != old.component("algorithm").name:
        raise RllabError("the algorithm cannot change during a run (its knobs can)")
    if new.train.seed != old.train.seed:
        raise RllabError("train.seed cannot change during a run")
    if old.rollout.max_staleness > 0 and new.rollout != old.rollout:
        raise RllabError("[rollout] cannot change during a run with rollout.max_staleness > 0 (batches are sampled ahead)")


def _schedule_key(key: str) -> str:
    """The setting a schedule key names: ``policy_loss`` and ``policy_loss.name`` are one."""
    return key[: -len(".name")] if key.endswith(".name") and key.count(".") == 1 else key


def check_schedule_applies(schedule, *, steps: int, where: str) -> None:
    """Refuse ``[[schedule]]`` entries that would do nothing: one that sets nothing, one at a step
    the run never reaches (a run of ``train.steps`` = N applies entries at steps 0 … N−1), and two
    entries at one step that set the same key (the later would silently replace the earlier)."""
    seen: dict[tuple[int, str], int] = {}
    for i, entry in enumerate(schedule):
        if not entry.set:
            raise ConfigError(f"{where}: schedule entry at step {entry.step} sets nothing; give it a 'set' table or remove it",
                              key="schedule")
        if entry.step >= steps:
            raise ConfigError(
                f"{where}: schedule entry at step {entry.step} (set {dict(entry.set)!r}) can never apply: train.steps = "
                f"{steps} runs steps 0 … {steps - 1}. Raise train.steps or move the entry.",
                key="schedule",
            )
        for key in entry.set:
            k = (entry.step, _schedule_key(key))
            if k in seen:
                first = schedule[seen[k]]
                raise ConfigError(
                    f"{where}: two schedule entries at step {entry.step} set {k[1]!r} ({dict(first.set)!r} and "
                    f"{dict(entry.set)!r}): only the later would apply. Merge them into one entry.",
                    key="schedule",
                )
            seen[k] = i
