"""Experiment configuration: TOML → attrs classes, validated before anything heavy loads.

A config is a TOML file (or a preset) plus dotted overrides from the command line::

    rllab run exp.toml policy_loss.clip_high=0.28 advantage=rloo train.steps=50

Component sections name a registered component and set its knobs::

    [policy_loss]
    name = "ppo_dual_clip"
    clip_c = 3.0

Each such section is validated against that component's own frozen config class (through the
:class:`~rllab.Lab`), so a typo in a knob fails at load time with the plugin, knob, value and
allowed range, and the TOML line. Overriding a section's name on the command line
(``advantage=rloo``) drops the knobs that were set for the previous component.

A ``[[schedule]]`` entry switches components or knobs at a given step::

    [[schedule]]
    step = 50
    set = { "policy_loss" = "cispo", "train.entropy_coef" = 0.0 }
"""

from __future__ import annotations

import copy
import difflib
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import attrs

from rllab.lab import ComponentSpec, ConfigError, Lab, build_config, knob

# section name -> (component kind, default component name)
COMPONENT_SECTIONS: dict[str, tuple[str, str]] = {
    "task": ("task", "addition"),
    "backend": ("rollout_backend", "hf"),
    "advantage": ("advantage_estimator", "grpo"),
    "policy_loss": ("policy_loss", "ppo_clip"),
    "correction": ("importance_correction", "none"),
    "aggregation": ("loss_aggregation", "token-mean"),
    "kl": ("kl_penalty", "k3"),
    "kl_controller": ("kl_controller", "fixed"),
    "value_loss": ("value_loss", "clipped"),
    "preference_loss": ("preference_loss", "dpo"),
}


@attrs.frozen(kw_only=True)
class ComponentRef:
    """A component chosen by name, with the knobs set for it in the config."""

    name: str
    knobs: dict = attrs.field(factory=dict, eq=False)

    def to_dict(self) -> dict:
        return {"name": self.name, **self.knobs}


@attrs.frozen(kw_only=True)
class ModelConfig:
    """Which model to train."""

    path: str | None = knob(None, help="a local Hugging Face model directory; None builds the tiny default model")
    tiny: dict = knob(factory=dict, help="overrides of the tiny model's architecture (rllab.tinymodel.TinyModelConfig)")
    warm_start: dict = knob(factory=dict, help="overrides of the supervised warm start (rllab.tinymodel.WarmStartConfig)")
    dtype: str = knob("float32", help="parameter dtype", choices=("float32", "bfloat16", "float16"))
    logprob_chunk: int = knob(1024, help="tokens per chunk when computing log-probs and entropy", ge=1)


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """How completions are sampled for training."""

    prompts_per_step: int = knob(16, help="prompts drawn per step (P)", ge=1)
    group_size: int = knob(8, help="samples per prompt (G)", ge=1)
    max_new_tokens: int = knob(8, help="response length cap", ge=1)
    temperature: float = knob(1.0, help="sampling temperature", gt=0.0)
    top_p: float = knob(1.0, help="nucleus sampling mass", gt=0.0, le=1.0)
    top_k: int = knob(-1, help="top-k sampling (-1: off)", ge=-1)
    dynamic_sampling: bool = knob(False, help="drop groups whose scores are all equal (DAPO)")
    overlong_buffer: int = knob(0, help="DAPO overlong shaping: penalise the last N tokens before the cap (0: off)", ge=0)
    overlong_penalty: float = knob(1.0, help="DAPO overlong shaping: the penalty reached at the cap", ge=0.0)
    reward_errors: str = knob(
        "raise",
        help="what a reward that raises or is NaN/inf does: raise, skip the sample's group, or score 0",
        choices=("raise", "skip", "zero"),
    )


@attrs.frozen(kw_only=True)
class TrainConfig:
    """The optimisation loop."""

    algorithm: str = knob("rl", help="rl (policy gradient), dpo (offline pairs), online_dpo", choices=("rl", "dpo", "online_dpo"))
    steps: int = knob(400, help="training steps", ge=0)
    seed: int = knob(0, help="seed for sampling, data order and initialisation")
    epochs: int = knob(1, help="passes over each step's rollouts", ge=1)
    minibatches: int = knob(1, help="optimizer steps per epoch", ge=1)
    micro_batch_size: int | None = knob(None, help="rows per forward/backward (gradient accumulation); None: whole minibatch", ge=1)
    lr: float = knob(2e-4, help="policy learning rate", gt=0.0)
    critic_lr: float = knob(1e-3, help="critic learning rate", gt=0.0)
    weight_decay: float = knob(0.0, help="AdamW weight decay", ge=0.0)
    lr_schedule: str = knob("cosine", help="learning-rate schedule", choices=("constant", "linear", "cosine"))
    warmup_steps: int = knob(10, help="linear warm-up steps", ge=0)
    max_grad_norm: float = knob(1.0, help="gradient clipping norm (0: off)", ge=0.0)
    entropy_coef: float = knob(0.0, help="entropy bonus coefficient", ge=0.0)
    vf_coef: float = knob(0.5, help="value-loss coefficient (critic estimators only)", ge=0.0)
    kl_in: str = knob("none", help="where the KL penalty to the reference applies", choices=("none", "reward", "loss"))
    eval_every: int = knob(50, help="evaluate every N steps (0: only at start and end)", ge=0)
    eval_size: int = knob(200, help="held-out examples evaluated", ge=1)
    checkpoint_every: int = knob(50, help="checkpoint every N steps (0: only at the end)", ge=0)
    dpo_pairs: int = knob(512, help="offline DPO: preference pairs generated from the task", ge=1)
    dpo_batch_size: int = knob(32, help="offline DPO: pairs per step", ge=1)
    pairs_file: str | None = knob(None, help="offline DPO: a JSONL file of {prompt, chosen, rejected}")
    rpo_alpha: float = knob(
        0.0, help="preference loops: add α·(mean per-token NLL of the chosen response), RPO (Pang et al. 2024; TRL's rpo_alpha)", ge=0.0
    )


@attrs.frozen(kw_only=True)
class ScheduleEntry:
    step: int
    set: dict


@attrs.frozen(kw_only=True)
class ExperimentConfig:
    """A whole experiment: components by name plus the loop's settings."""

    name: str = "run"
    output_dir: str = "runs"
    loggers: tuple[str, ...] = ("jsonl",)
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    components: dict = attrs.field(factory=dict)
    """section name → ComponentRef"""
    schedule: tuple[ScheduleEntry, ...] = ()

    def component(self, section: str) -> ComponentRef:
        return self.components[section]

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "output_dir": self.output_dir, "loggers": list(self.loggers)}
        for sec in ("model", "rollout", "train"):
            out[sec] = {k: v for k, v in attrs.asdict(getattr(self, sec)).items() if v is not None}
        for sec, ref in self.components.items():
            out[sec] = ref.to_dict()
        if self.schedule:
            out["schedule"] = [{"step": e.step, "set": dict(e.set)} for e in self.schedule]
        return out


PLAIN_SECTIONS = {"model": ModelConfig, "rollout": RolloutConfig, "train": TrainConfig}
TOP_LEVEL = {"name", "output_dir", "loggers", "schedule", "preset"}


# --------------------------------------------------------------------------- parsing


def parse_value(text: str) -> Any:
    """A command-line value as TOML would read it (numbers, booleans, lists); else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict, key: str, value: Any) -> None:
    """Set dotted ``key`` in a nested dict. ``section=name`` on a component section selects a
    component and drops the knobs set for the previous one."""
    parts = key.split(".")
    if len(parts) == 1 and parts[0] in COMPONENT_SECTIONS:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r}: a component section takes a component name")
        old = data.get(parts[0])
        if not isinstance(old, dict) or old.get("name") != value:
            data[parts[0]] = {"name": value}
        return
    node = data
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set {key}: {p} is not a section")
        node = nxt
    node[parts[-1]] = value


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
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and k not in COMPONENT_SECTIONS:
            out[k] = _deep_merge(out[k], v)
        elif k in COMPONENT_SECTIONS and isinstance(v, Mapping) and isinstance(out.get(k), dict):
            # same component: merge knobs; another component: replace the section
            out[k] = _deep_merge(out[k], v) if v.get("name", out[k].get("name")) == out[k].get("name") else dict(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_config(
    source: str | Path | Mapping | None = None,
    overrides: list[str] | list[tuple[str, Any]] = (),
    *,
    lab: Lab | None = None,
    preset: str | None = None,
) -> ExperimentConfig:
    """Read, merge and validate a config.

    :param source: a TOML path, a TOML string's parsed dict, or None for the defaults.
    :param overrides: ``"key=value"`` strings or ``(key, value)`` pairs, applied last.
    :param lab: the Lab that validates component sections (a new one if None).
    :param preset: a preset name to start from (a file may also say ``preset = "grpo"``).
    """
    text = ""
    data: dict[str, Any] = {}
    where = "<config>"
    if isinstance(source, Mapping):
        data = copy.deepcopy(dict(source))
    elif source is not None:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        text = path.read_text()
        where = str(path)
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
    for k, v in pairs:
        apply_override(data, k, v)
    return validate(data, lab=lab, text=text, where=where)


def _line_of(text: str, section: str | None, key: str) -> str:
    """' (line N)' for ``key`` inside ``[section]`` of a TOML text, when it can be found."""
    if not text:
        return ""
    lines = text.splitlines()
    in_section = section is None
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("["):
            in_section = section is not None and s.strip("[] ") == section
            continue
        if in_section and re.match(rf"{re.escape(key)}\s*=", s):
            return f" (line {i})"
    return ""


def validate(data: Mapping[str, Any], *, lab: Lab | None = None, text: str = "", where: str = "<config>") -> ExperimentConfig:
    """Turn a nested dict into a validated :class:`ExperimentConfig`."""
    lab = lab or Lab()
    data = dict(data)
    known = TOP_LEVEL | set(PLAIN_SECTIONS) | set(COMPONENT_SECTIONS)
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{_line_of(text, None, key)}.{hint} Known: {', '.join(sorted(known))}.")

    plain = {}
    for sec, cls in PLAIN_SECTIONS.items():
        values = data.get(sec, {})
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: [{sec}] must be a table, got {values!r}")
        plain[sec] = _build_plain(cls, sec, values, text, where)

    _check_tiny_model(plain["model"], text, where)

    components = {}
    for sec, (kind, default) in COMPONENT_SECTIONS.items():
        raw = data.get(sec, {})
        if isinstance(raw, str):
            raw = {"name": raw}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: [{sec}] must be a table or a component name, got {raw!r}")
        raw = dict(raw)
        name = raw.pop("name", default)
        try:
            spec = lab.spec(kind, name)
            build_config(spec, raw)
        except ConfigError as e:
            bad = next((k for k in raw if k in str(e)), "name")
            raise ConfigError(f"{where}: [{sec}]{_line_of(text, sec, bad)}: {e}") from None
        except KeyError as e:
            raise ConfigError(f"{where}: [{sec}] name{_line_of(text, sec, 'name')}: {e}") from None
        components[sec] = ComponentRef(name=spec.name, knobs=raw)

    loggers = data.get("loggers", ("jsonl",))
    if isinstance(loggers, str):
        loggers = (loggers,)
    for lg in loggers:
        try:
            lab.spec("logger", lg)
        except KeyError as e:
            raise ConfigError(f"{where}: loggers: {e}") from None

    schedule = []
    for i, entry in enumerate(data.get("schedule", ())):
        if not isinstance(entry, Mapping) or "step" not in entry or "set" not in entry:
            raise ConfigError(f"{where}: schedule entry {i} must have 'step' and 'set', got {entry!r}")
        if not isinstance(entry["step"], int) or entry["step"] < 0:
            raise ConfigError(f"{where}: schedule entry {i}: step must be a non-negative integer, got {entry['step']!r}")
        schedule.append(ScheduleEntry(step=entry["step"], set=dict(entry["set"])))
    schedule.sort(key=lambda e: e.step)

    cfg = ExperimentConfig(
        name=str(data.get("name", "run")),
        output_dir=str(data.get("output_dir", "runs")),
        loggers=tuple(loggers),
        components=components,
        schedule=tuple(schedule),
        **plain,
    )
    # every scheduled change must itself be valid
    for entry in cfg.schedule:
        try:
            apply_schedule(cfg, entry, lab=lab)
        except ConfigError as e:
            raise ConfigError(f"{where}: schedule at step {entry.step}: {e}") from None
    return cfg


def _build_plain(cls: type, sec: str, values: Mapping, text: str, where: str):
    fields = attrs.fields_dict(attrs.resolve_types(cls))
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{where}: [{sec}] has no setting {key!r}{_line_of(text, sec, key)}.{hint} Settings: {', '.join(fields)}."
            )
    pseudo = ComponentSpec(kind="section", name=sec, fn=lambda: None, config=cls, provider="rllab")
    try:
        return build_config(pseudo, values)
    except ConfigError as e:
        bad = next((k for k in values if re.search(rf"\b{re.escape(k)}\b", str(e))), None)
        line = _line_of(text, sec, bad) if bad else ""
        msg = str(e).replace(f"section {sec!r} (plugin rllab)", f"[{sec}]")
        raise ConfigError(f"{where}: {msg}{line}") from None


def _check_tiny_model(model: ModelConfig, text: str, where: str) -> None:
    """Validate ``model.tiny`` / ``model.warm_start`` against the tiny model's own config classes."""
    from rllab import tinymodel

    for key, cls in (("tiny", tinymodel.TinyModelConfig), ("warm_start", tinymodel.WarmStartConfig)):
        pseudo = ComponentSpec(kind="section", name=f"model.{key}", fn=lambda: None, config=cls, provider="rllab")
        try:
            build_config(pseudo, getattr(model, key))
        except ConfigError as e:
            msg = str(e).replace(f"section 'model.{key}' (plugin rllab)", f"[model] {key}")
            raise ConfigError(f"{where}: {msg}{_line_of(text, 'model', key)}") from None


def apply_schedule(cfg: ExperimentConfig, entry: ScheduleEntry, *, lab: Lab | None = None) -> ExperimentConfig:
    """The config after a schedule entry's changes (validated)."""
    data = cfg.to_dict()
    data.pop("schedule", None)
    for k, v in entry.set.items():
        apply_override(data, k, v)
    new = validate(data, lab=lab, where=f"schedule step {entry.step}")
    return attrs.evolve(new, schedule=cfg.schedule)


def dump_toml(data: Mapping[str, Any]) -> str:
    """A minimal TOML writer for resolved configs (tables, scalars, lists, inline dicts)."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f"{_key(k)} = {val(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"cannot write {v!r} to TOML")

    def _key(k: str) -> str:
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else val(k)

    lines = []
    tables = []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            tables.append((k, v))
        elif k == "schedule":
            continue
        else:
            lines.append(f"{_key(k)} = {val(v)}")
    for k, v in tables:
        lines.append(f"\n[{k}]")
        lines.extend(f"{_key(kk)} = {val(vv)}" for kk, vv in v.items() if vv is not None)
    for e in data.get("schedule", ()):
        lines.append("\n[[schedule]]")
        lines.append(f"step = {e['step']}")
        lines.append(f"set = {val(e['set'])}")
    return "\n".join(lines) + "\n"
