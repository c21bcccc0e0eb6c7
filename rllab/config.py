"""Experiment configuration: TOML → attrs classes, validated before anything heavy loads.

A config is a TOML file (or a preset) plus dotted overrides from the command line::

    rllab run exp.toml policy_loss.clip_high=0.28 advantage=rloo train.steps=50

Component sections name a registered component and set its knobs::

    [policy_loss]
    name = "ppo_dual_clip"
    clip_c = 3.0

A run draws its examples from a **task** (``task = "addition"``, the default) or from an
**environment** of multi-turn episodes (``env = "NAME"``, see :mod:`rllab.rollout.environment`); the two
are exclusive: a config that sets both is refused, and with ``env`` set the config has no
``[task]`` section (:attr:`ExperimentConfig.source` says which one a run uses).

Each such section is validated against that component's own frozen config class (through the
:class:`~rllab.Lab`), so a typo in a knob fails at load time with the plugin, knob, value and
allowed range, and the TOML line of the key. Overriding a section's name on the command line
(``advantage=rloo`` or ``advantage.name=rloo``; in a schedule too) drops the knobs set for the previous component; overrides act the
same in any order (a section's new name applies before its knobs), and a knob the final
component does not have is an error.

``plugins = ["my_loss.py", "some.module"]`` at the top level loads extra plugins before the
config is validated (paths relative to the TOML file); a run directory's ``config.toml`` records
them, with every knob's value and the versions in ``[provenance]``, so that
``rllab run RUN_DIR/config.toml`` reproduces the run.

A ``[[schedule]]`` entry switches components or knobs at a given step::

    [[schedule]]
    step = 50
    set = { "policy_loss" = "cispo", "train.entropy_coef" = 0.0 }

(checked at load: see :mod:`rllab.checks`).
"""

from __future__ import annotations

import copy
import difflib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import attrs

from rllab.checks import check_run
from rllab.checks.config import (
    FROZEN_DURING_A_RUN, check_algorithm_fit, check_config_only, check_episode_settings, check_launcher,
    check_model_settings, check_one_source, check_reward_components, check_schedule_applies,
    environment_rollout_defaults,
)
from rllab.errors import ConfigError
from rllab.lab import Lab
from rllab.experiment import (  # noqa: F401  (re-exported: what a config is, read here)
    COMPONENT_SECTIONS, PLAIN_SECTIONS, TOP_LEVEL, ComponentRef, ExperimentConfig, ScheduleEntry,
)
from rllab.settings import MOVED_TRAIN_SETTINGS, ModelConfig, RolloutConfig, TrainConfig  # noqa: F401  (the settings, re-exported)
from rllab.specs import SELECTOR_KEY, ComponentSpec, build_config
from rllab.records.tomlio import dump_toml, line_of, parse_value  # noqa: F401  (dump_toml, parse_value: re-exported)


# --------------------------------------------------------------------------- parsing


def apply_override(data: dict, key: str, value: Any) -> None:
    """Set dotted ``key`` in a nested dict. ``section=name`` (or ``section.name=name``) on a
    component section selects a component and drops the knobs set for the previous one."""
    parts = key.split(".")
    if parts[1:] == ["name"] and parts[0] in COMPONENT_SECTIONS:
        parts = parts[:1]  # the other knobs belong to the component named before
    if len(parts) == 1 and parts[0] in COMPONENT_SECTIONS:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r}: a component section takes a component name", key=key)
        old = data.get(parts[0])
        old_name = old.get("name") if isinstance(old, dict) else old
        if old_name != value:
            data[parts[0]] = {"name": value}
        return
    if parts[0] == "train" and len(parts) == 2 and parts[1] in MOVED_TRAIN_SETTINGS:
        raise ConfigError(f"train.{parts[1]} moved to {MOVED_TRAIN_SETTINGS[parts[1]]}", key=parts[1])
    node = data
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if isinstance(nxt, str) and p in COMPONENT_SECTIONS:  # `advantage = "rloo"` then a knob of it
            nxt = node[p] = {"name": nxt}
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set {key}: {p} is not a section", key=key)
        node = nxt
    node[parts[-1]] = value


def apply_overrides(data: dict, pairs: list[tuple[str, Any]]) -> None:
    """Apply overrides so that their order does not matter: every ``section=name`` (or ``section.name=``)
    first (each drops the file's knobs of a replaced component), then every setting and knob."""
    selects = set(COMPONENT_SECTIONS) | {f"{sec}.name" for sec in COMPONENT_SECTIONS}
    for k, v in sorted(pairs, key=lambda kv: 0 if kv[0] in selects else 1):
        apply_override(data, k, v)


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. policy_loss.clip_high=0.28)")
        k, v = item.split("=", 1)
        out.append((k.strip(), parse_value(v.strip())))
    return out


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("rllab.presets").iterdir() if p.name.endswith(".toml"))


def preset_text(name: str) -> str:
    names = preset_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown preset {name!r}.{hint} Presets: {', '.join(names)}.")
    return resources.files("rllab.presets").joinpath(f"{name}.toml").read_text()


def _deep_merge(base: dict, over: Mapping) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if k in COMPONENT_SECTIONS and isinstance(out.get(k), str):
            out[k] = {"name": out[k]}
        if k in COMPONENT_SECTIONS and isinstance(v, str):
            v = {"name": v}
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and k not in COMPONENT_SECTIONS:
            out[k] = _deep_merge(out[k], v)
        elif k in COMPONENT_SECTIONS and isinstance(v, Mapping) and isinstance(out.get(k), dict):
            # same component: merge knobs; another component: replace the section
            out[k] = _deep_merge(out[k], v) if v.get("name", out[k].get("name")) == out[k].get("name") else dict(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


LOGGER_OUTPUT_KNOBS = ("filename", "subdir")
"""Logger knobs that name what a logger writes in the run directory: two loggers of one kind
with the same value would write the same file."""


def _refuse_repeated_loggers(refs: list, where: str) -> None:
    """Refuse a logger given twice (every row would be logged twice, into one file), or two of one
    kind writing the same file; two of a kind with other outputs (other projects, files) are kept."""
    seen: dict[str, list] = {}
    for ref in refs:
        mine = ref.to_dict()
        for other in seen.get(ref.name, ()):
            if other == mine:
                raise ConfigError(f"{where}: loggers: logger {ref.name!r} is given twice with the same knobs ({mine!r}); "
                                  "give it once", key="loggers")
            same = [k for k in LOGGER_OUTPUT_KNOBS if k in mine and other.get(k) == mine[k]]
            if same:
                raise ConfigError(f"{where}: loggers: two {ref.name!r} loggers would both write {same[0]} = {mine[same[0]]!r}; "
                                  f"give each its own {same[0]}", key="loggers")
        seen.setdefault(ref.name, []).append(mine)


def load_config(
    source: str | Path | Mapping | None = None,
    overrides: list[str] | list[tuple[str, Any]] = (),
    *,
    lab: Lab | None = None,
    preset: str | None = None,
) -> ExperimentConfig:
    """Read, merge and validate a config.

    :param source: a TOML path, a TOML string's parsed dict, or None for the defaults.
    :param overrides: ``"key=value"`` strings or ``(key, value)`` pairs, applied last, in an
        order that does not matter (see :func:`apply_overrides`).
    :param lab: the Lab that validates component sections (a new one if None). Plugins named in
        the config's ``plugins`` list are loaded into it.
    :param preset: a preset name to start from (a file may also say ``preset = "grpo"``).
    """
    text = ""
    data: dict[str, Any] = {}
    where = "<config>"
    base_dir = Path.cwd()
    if isinstance(source, Mapping):
        data = copy.deepcopy(dict(source))
    elif source is not None:
        path = Path(source)
        if path.is_dir():
            hint = f"; it is a run directory: continue it with --resume {path}, or start from its config: {path / 'config.toml'}" if (path / "config.toml").is_file() else ""
            raise ConfigError(f"config file {path} is a directory{hint}")
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not text (a recording or checkpoint .pt?): a config is a TOML file") from None
        where = str(path)
        base_dir = path.resolve().parent
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{where}: not valid TOML: {e}") from None
    preset = preset or data.pop("preset", None)
    if preset:
        base = tomllib.loads(preset_text(preset))
        data = _deep_merge(base, data)
        text = text or preset_text(preset)
        where = where if source is not None else f"preset {preset}"
    pairs = parse_overrides(list(overrides)) if overrides and isinstance(next(iter(overrides)), str) else list(overrides)
    apply_overrides(data, pairs)
    lab = lab or Lab()
    if "plugins" in data:
        data["plugins"] = load_plugins(lab, data["plugins"], base_dir=base_dir, where=where)
    return validate(data, lab=lab, text=text, where=where)


def load_plugins(lab: Lab, plugins: Any, *, base_dir: Path, where: str) -> list[str]:
    """Load a config's ``plugins`` list into ``lab``; returns them as recorded (absolute paths
    for files, module names as given)."""
    if isinstance(plugins, str):
        plugins = [plugins]
    if not isinstance(plugins, (list, tuple)) or not all(isinstance(p, str) for p in plugins):
        raise ConfigError(f"{where}: plugins must be a list of .py paths or module names, got {plugins!r}", key="plugins")
    out = []
    for p in plugins:
        if p.endswith(".py"):
            path = Path(p).expanduser()
            path = path if path.is_absolute() else base_dir / path
            if not path.is_file():
                raise ConfigError(f"{where}: plugin file {p!r} not found (looked for {path})", key="plugins")
            p = str(path.resolve())
        lab.add_plugin(p)
        broken = next((i for i in lab.plugins if i.name == p and not i.ok), None)
        if broken is not None:
            raise ConfigError(f"{where}: plugin {p!r} failed to load: {broken.error}", key="plugins")
        out.append(p)
    return out


def _component(lab: Lab, sec: str, kind: str, raw: Any, default: str, text: str, where: str) -> ComponentRef:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: [{sec}] must be a table or a component name, got {raw!r}", key=sec)
    raw = dict(raw)
    name = raw.pop(SELECTOR_KEY, default)
    if name is None:  # a section without a default component, given knobs but no name (env.max_turns=3 alone)
        from rllab.checks.config import _settings

        raise ConfigError(f"{where}: {_settings(sec, raw)} {'sets a knob' if len(raw) == 1 else 'set knobs'} of [{sec}], "
                          f"which names no {kind}: choose one with {sec}=NAME (one of {', '.join(lab.names(kind))})", key=SELECTOR_KEY)
    if name == "" and raw:
        name = _lost_name(lab, sec, kind, raw, where)
    if name == "":
        where_ = "loggers" if sec == "loggers" else f"[{sec}]"
        raise ConfigError(f"{where}: {where_} name{line_of(text, sec, SELECTOR_KEY)} is empty: it must name the {kind} to use "
                          f"(one of {', '.join(lab.names(kind))})", key=SELECTOR_KEY)
    try:
        spec = lab.spec(kind, name)
    except KeyError as e:
        line = line_of(text, sec, "name") or line_of(text, None, sec)
        raise ConfigError(f"{where}: [{sec}] name{line}: {e}", key="name") from None
    try:
        built = build_config(spec, raw, section=sec)
    except ConfigError as e:
        raise ConfigError(f"{where}: [{sec}]{line_of(text, sec, e.key)}: {e}", key=e.key) from None
    return ComponentRef(name=spec.name, knobs=raw, config=built)


def _lost_name(lab: Lab, sec: str, kind: str, raw: Mapping, where: str) -> str:
    """The component of a table whose ``name`` is ``""`` but whose knobs are all set: a config.toml
    written before knobs called ``name`` were renamed, in which the knob's empty default overwrote
    the component's name. Its knobs are every knob of the component but that one, so the one
    component whose knobs are the table's keys and one more is the one meant (else "")."""
    import warnings

    keys = set(raw)
    fits = [n for n in lab.names(kind) if keys < (knobs := {k.name for k in lab.spec(kind, n).knobs()}) and len(knobs - keys) == 1]
    if len(fits) != 1:
        return ""
    where_ = "loggers" if sec == "loggers" else f"[{sec}]"
    warnings.warn(f"{where}: {where_} has name = \"\" and the knobs of {kind} {fits[0]!r}: read as {fits[0]!r} (a config.toml "
                  f"written by an older rllab, whose knob 'name' took the component's name); write name = \"{fits[0]}\" in it",
                  FutureWarning, stacklevel=2)
    return fits[0]


def validate(data: Mapping[str, Any], *, lab: Lab | None = None, text: str = "", where: str = "<config>") -> ExperimentConfig:
    """Turn a nested dict into a validated :class:`ExperimentConfig`.

    Every component's frozen config is built here, once; each component's ``requires`` is
    checked against what the chosen algorithm provides, and a component section the algorithm
    does not use is refused rather than silently ignored.
    """
    lab = lab or Lab()
    data = dict(data)
    known = TOP_LEVEL | set(PLAIN_SECTIONS) | set(COMPONENT_SECTIONS)
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{line_of(text, None, key)}.{hint} Known: {', '.join(sorted(known))}.", key=key)

    plain = {}
    for sec, cls in PLAIN_SECTIONS.items():
        values = data.get(sec, {})
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: [{sec}] must be a table, got {values!r}", key=sec)
        plain[sec] = _build_plain(cls, sec, values, text, where)

    check_model_settings(plain["model"], text, where)
    check_launcher(plain["model"], text, where)  # torchrun's WORLD_SIZE against [model] strategy, before any model exists

    check_one_source(data, text, where, lab)
    components = {
        sec: _component(lab, sec, kind, data.get(sec, {}), default, text, where)
        for sec, (kind, default) in COMPONENT_SECTIONS.items()
        if (default is not None or sec in data) and not (sec == "task" and "env" in data)
    }
    unused = check_algorithm_fit(lab, components, kinds={sec: kind for sec, (kind, _) in COMPONENT_SECTIONS.items()}, explicit={sec for sec in COMPONENT_SECTIONS if sec in data}, text=text, where=where)
    if "env" in components and "env" not in unused:
        plain["rollout"] = environment_rollout_defaults(lab, components["env"], plain["rollout"], data.get("rollout", {}), where=where)
    check_episode_settings(lab, components, plain["rollout"], unused=unused, text=text, where=where)
    if "advantage" not in unused and "task" in components and "task" not in unused:
        check_reward_components(lab, components, plain["rollout"], text=text, where=where)
    check_config_only(lab, components, plain["model"], unused=unused, text=text, where=where)

    loggers = data.get("loggers", ("jsonl",))
    if isinstance(loggers, (str, Mapping)):
        loggers = (loggers,)
    refs = []
    for lg in loggers:
        try:
            refs.append(_component(lab, "loggers", "logger", lg, "jsonl", text, where))
        except ConfigError as e:
            said = str(e).replace("[loggers]", "loggers")
            if isinstance(lg, Mapping) and SELECTOR_KEY not in lg:  # a table that forgot its name is the default, jsonl
                said += (f" This table names no logger, so it is read as 'jsonl': name the one meant, e.g. "
                         f"{{ name = \"wandb\", ... }} (one of {', '.join(lab.names('logger'))})")
            raise ConfigError(said, key="loggers") from None
    _refuse_repeated_loggers(refs, where)

    schedule = []
    entries = data.get("schedule", ())
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(
            f"{where}: schedule must be a list of entries ([[schedule]] tables, each with step and set), "
            f"got {type(entries).__name__} {entries!r}",
            key="schedule",
        )
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or "step" not in entry or "set" not in entry:
            raise ConfigError(f"{where}: schedule entry {i} must have 'step' and 'set', got {entry!r}")
        extra = sorted(set(entry) - {"step", "set"})
        if extra:
            raise ConfigError(
                f"{where}: schedule entry {i} has unknown key(s) {', '.join(map(repr, extra))}: an entry takes "
                f"step and set only (the settings go in set = {{...}})",
                key="schedule",
            )
        if isinstance(entry["step"], bool) or not isinstance(entry["step"], int) or entry["step"] < 0:
            raise ConfigError(f"{where}: schedule entry {i}: step must be a non-negative integer, got {entry['step']!r}")
        if not isinstance(entry["set"], Mapping):
            raise ConfigError(
                f"{where}: schedule entry {i}: set must be a table of settings, e.g. "
                f'set = {{ "train.lr" = 5e-5 }}, got {type(entry["set"]).__name__} {entry["set"]!r}',
                key="schedule",
            )
        schedule.append(ScheduleEntry(step=entry["step"], set=dict(entry["set"])))
    schedule.sort(key=lambda e: e.step)

    provenance = data.get("provenance", {})
    if not isinstance(provenance, Mapping):
        raise ConfigError(f"{where}: provenance must be a table, got {provenance!r}", key="provenance")
    cfg = ExperimentConfig(
        name=str(data.get("name", "run")),
        output_dir=str(data.get("output_dir", "runs")),
        loggers=tuple(refs),
        plugins=tuple(data.get("plugins", ())),
        provenance=dict(provenance),
        components=components,
        schedule=tuple(schedule),
        unused=unused,
        **plain,
    )
    check_run(cfg, lab)  # the settings against the components' traits (rllab.checks.run)
    # every scheduled change must be valid mid-run, on the config the entries before it made (as the trainer applies them)
    current = cfg
    for entry in cfg.schedule:
        try:
            current = apply_schedule(current, entry, lab=lab)
        except ConfigError as e:
            raise ConfigError(f"{where}: schedule at step {entry.step}: {e}") from None
    check_schedule_applies(cfg.schedule, steps=cfg.train.steps, where=where)
    return cfg


def _build_plain(cls: type, sec: str, values: Mapping, text: str, where: str):
    fields = attrs.fields_dict(attrs.resolve_types(cls))
    for key in values:
        if sec == "train" and key in MOVED_TRAIN_SETTINGS:
            raise ConfigError(f"{where}: [train] {key}{line_of(text, sec, key)} moved to {MOVED_TRAIN_SETTINGS[key]}.", key=key)
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{where}: [{sec}] has no setting {key!r}{line_of(text, sec, key)}.{hint} Settings: {', '.join(fields)}.",
                key=key,
            )
    pseudo = ComponentSpec(kind="section", name=sec, fn=lambda: None, config=cls, provider="rllab")
    try:
        return build_config(pseudo, values)
    except ConfigError as e:
        msg = str(e).replace(f"section {sec!r} (plugin rllab)", f"[{sec}]")
        raise ConfigError(f"{where}: {msg}{line_of(text, sec, e.key)}", key=e.key) from None


def apply_schedule(cfg: ExperimentConfig, entry: ScheduleEntry, *, lab: Lab | None = None) -> ExperimentConfig:
    """The config after a schedule entry's changes (validated)."""
    for key in entry.set:
        key_ = "algorithm.name" if key == "algorithm" else key
        frozen = next((f for f in FROZEN_DURING_A_RUN if key_ == f or key_.startswith(f + ".")), None)
        if frozen is not None:
            raise ConfigError(f"{key} cannot change during a run: {FROZEN_DURING_A_RUN[frozen]}", key=key)
    data = cfg.to_dict()
    data.pop("schedule", None)
    data.pop("plugins", None)
    apply_overrides(data, list(entry.set.items()))
    new = validate(data, lab=lab, where=f"schedule step {entry.step}")
    return attrs.evolve(new, schedule=cfg.schedule, plugins=cfg.plugins, provenance=cfg.provenance)
