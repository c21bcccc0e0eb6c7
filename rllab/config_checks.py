"""Load-time checks of an experiment config that need only the config (no model, no batch).

Each refuses, with a :class:`~rllab.errors.ConfigError` naming the section, the component and its
plugin, a combination that would otherwise fail only after the model is built (or not at all):

- a policy loss that receives the rollout engine's log-probs as ``old_log_prob`` (its trait
  ``old_log_prob="rollout"``, bypass mode) with an importance correction other than ``none``,
  which would be applied on top of the loss's own;
- a rollout backend that needs the policy on CUDA for a config (its trait ``needs_cuda``, e.g.
  SGLang's ``weight_sync = "tensor"``) while ``[model] device`` is the CPU (``auto`` is checked by
  the trainer once resolved, before it builds anything).

- a config that sets both ``task`` and ``env`` (before the components are built), episode limits
  with a task, an environment whose ``max_turns`` gives its episodes no bound.

Called by :func:`rllab.config.validate` after the components are built.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from rllab.errors import ConfigError
from rllab.lab import Lab
from rllab.tomlio import line_of


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
    if spec.trait("old_log_prob", loss.config) != "rollout" or corr.name == "none":
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
    left to the trainer, which calls this with the resolved device before it builds anything
    (a config may be loaded on a machine without the run's GPU)."""
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


def check_model_settings(model: Any, text: str, where: str) -> None:
    """Validate ``model.tiny`` / ``model.warm_start`` against the tiny model's own config classes,
    and ``model.lora`` when adapters are asked for."""
    from rllab import tinymodel
    from rllab.specs import ComponentSpec, build_config

    for key, cls in (("tiny", tinymodel.TinyModelConfig), ("warm_start", tinymodel.WarmStartConfig)):
        pseudo = ComponentSpec(kind="section", name=f"model.{key}", fn=lambda: None, config=cls, provider="rllab")
        try:
            build_config(pseudo, getattr(model, key))
        except ConfigError as e:
            msg = str(e).replace(f"section 'model.{key}' (plugin rllab)", f"[model] {key}")
            raise ConfigError(f"{where}: {msg}{line_of(text, 'model', key)}") from None
    if model.lora:  # rllab.lora imports torch: only when adapters are asked for
        from rllab import lora

        lora.check_settings(model, text=text, where=where)


def check_one_source(data: Mapping[str, Any], text: str, where: str) -> None:
    """``task`` and ``env`` are exclusive: a config that sets both is refused, naming both."""
    if "task" in data and "env" in data:
        task, env = (v.get("name", "?") if isinstance(v, Mapping) else v for v in (data["task"], data["env"]))
        line = line_of(text, None, "env") or line_of(text, "env", "name")
        raise ConfigError(
            f"{where}: both task {task!r} and env {env!r}{line} are set; a run draws its "
            f"examples from a task or from an environment, not both: drop one of them",
            key="env",
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
    if env is None or "env" in unused or rollout.max_turns is not None:
        return
    spec = lab.spec("environment", env.name)
    declared = getattr(spec.fn, "max_turns", None)
    if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int) or declared < 1):
        raise ConfigError(
            f"{where}: environment {env.name!r} (plugin {spec.provider}) declares max_turns = {declared!r}; it must be "
            f"an integer ≥ 1 (or set rollout.max_turns)",
            key="max_turns",
        )


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
