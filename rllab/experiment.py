"""What an experiment config is, once read: :class:`ExperimentConfig` (the plain sections
``[model]``, ``[rollout]``, ``[train]`` and every component chosen by name, :class:`ComponentRef`,
with its frozen config) and the one map from config sections to component kinds
(:data:`COMPONENT_SECTIONS`). Reading, merging and validating one is :mod:`rllab.config`'s, which
publishes these names too."""

from __future__ import annotations

from typing import Any

import attrs

from rllab.errors import ConfigError
from rllab.settings import ModelConfig, RolloutConfig, TrainConfig

# section name -> (component kind, default component name): the one map from config sections to
# registries; the trainer, `rllab settings` and the schedule all read it. A section whose default
# is None is optional: it exists only when the config sets it.
COMPONENT_SECTIONS: dict[str, tuple[str, str | None]] = {
    "algorithm": ("algorithm", "rl"),
    "task": ("task", "addition"),
    "env": ("environment", None),
    "backend": ("rollout_backend", "hf"),
    "advantage": ("advantage_estimator", "grpo"),
    "policy_loss": ("policy_loss", "ppo_clip"),
    "correction": ("importance_correction", "none"),
    "aggregation": ("loss_aggregation", "token-mean"),
    "kl": ("kl_penalty", "k3"),
    "kl_controller": ("kl_controller", "fixed"),
    "value_loss": ("value_loss", "clipped"),
    "preference_loss": ("preference_loss", "dpo"),
    "sampler": ("sampler", "default"),
}


@attrs.frozen(kw_only=True)
class ComponentRef:
    """A component chosen by name: the knobs set for it and its validated frozen config."""

    name: str
    knobs: dict = attrs.field(factory=dict, eq=False)
    """The knobs the config set (the rest take their defaults)."""
    config: Any = None
    """The component's frozen config, built once when the experiment config was validated."""

    def to_dict(self) -> dict:
        """``name`` plus every knob's value, defaults included."""
        values = attrs.asdict(self.config, recurse=False) if self.config is not None and attrs.has(type(self.config)) else dict(self.knobs)
        return {"name": self.name, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items()}}


@attrs.frozen(kw_only=True)
class ScheduleEntry:
    step: int
    set: dict


@attrs.frozen(kw_only=True)
class ExperimentConfig:
    """A whole experiment: components by name plus the loop's settings."""

    name: str = "run"
    output_dir: str = "runs"
    loggers: tuple[ComponentRef, ...] = ()
    plugins: tuple[str, ...] = ()
    """Extra plugins this experiment loads (absolute ``.py`` paths or module names)."""
    provenance: dict = attrs.field(factory=dict, eq=False)
    """What a run directory's config recorded about the run that wrote it (informational)."""
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    components: dict = attrs.field(factory=dict)
    """section name → ComponentRef"""
    schedule: tuple[ScheduleEntry, ...] = ()
    unused: frozenset = frozenset()
    """Component sections the chosen algorithm does not read (left at their defaults, not written)."""

    def component(self, section: str) -> ComponentRef:
        if section not in self.components and section in ("task", "env"):
            other = self.source
            raise ConfigError(
                f"this config has no [{section}] section: its examples come from {other} {self.components[other].name!r}",
                key=section,
            )
        return self.components[section]

    @property
    def source(self) -> str:
        """The section the run draws its examples from: ``"env"`` when an environment is chosen,
        else ``"task"``."""
        return "env" if "env" in self.components else "task"

    def to_dict(self) -> dict:
        """The experiment as TOML-ready data: every setting and every knob, defaults included."""
        out: dict[str, Any] = {"name": self.name, "output_dir": self.output_dir}
        if self.plugins:
            out["plugins"] = list(self.plugins)
        out["loggers"] = [ref.to_dict() if ref.knobs else ref.name for ref in self.loggers]
        for sec in ("model", "rollout", "train"):
            out[sec] = {k: v for k, v in attrs.asdict(getattr(self, sec)).items() if v is not None}
        for sec, ref in self.components.items():
            if sec not in self.unused:
                out[sec] = ref.to_dict()
        if self.schedule:
            out["schedule"] = [{"step": e.step, "set": dict(e.set)} for e in self.schedule]
        return out


PLAIN_SECTIONS = {"model": ModelConfig, "rollout": RolloutConfig, "train": TrainConfig}
TOP_LEVEL = {"name", "output_dir", "loggers", "schedule", "preset", "plugins", "provenance"}
