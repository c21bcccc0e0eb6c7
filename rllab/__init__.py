"""rllab: a plugin-based laboratory for reinforcement learning on language models.

Public API for plugin authors and users::

    import rllab

    @rllab.hookimpl
    def register_policy_losses(register):
        register("my_loss", my_loss, config=MyConfig)

    lab = rllab.Lab()
    loss = lab.get("policy_loss", "ppo_clip", clip_high=0.28)
"""

import os as _os

# On small shared CPUs, OpenMP threads that spin while waiting make 2-thread torch ops up to
# ~100x slower when another process is busy; passive waiting costs nothing when the machine is
# idle. Only takes effect if torch has not been imported yet; an explicit setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib as _importlib  # noqa: E402
from typing import TYPE_CHECKING as _TYPE_CHECKING  # noqa: E402

from rllab import _compat  # noqa: E402
from rllab.errors import MissingExtraError, NonFiniteError, RewardError  # noqa: E402
from rllab.former import FormerPaths, RllabDeprecationWarning  # noqa: E402
from rllab.hookspecs import hookimpl  # noqa: E402
from rllab.lab import (  # noqa: E402
    KINDS,
    Component,
    ComponentSpec,
    ConfigError,
    DuplicateComponentError,
    Lab,
    NoConfig,
    PluginLoadError,
    RllabError,
    UnknownComponentError,
    knob,
)
from rllab.specs import FloatOrFloats, FloatOrFloatsOrNone, StrOrStrs, StrOrStrsOrNone  # noqa: E402  (knob types)

# The part of the API built on torch comes from its module on first use (``rllab.RolloutBatch``,
# ``rllab.ops``), so that ``import rllab`` -- every plugin's first line -- stays cheap and
# ``rllab --help`` or a config error answers without loading torch.
_ON_FIRST_USE = {
    "rllab.algorithm": ("Algorithm", "KLSample", "OptimizerStep", "Rollout", "RunContext", "StepReport"),
    "rllab.rollout.environment": ("Environment", "Episode", "Step"),
    "rllab.rollout.single_turn": ("SingleTurn",),
    "rllab.rollout.tools": ("Tool", "tool", "tool_step"),
    "rllab.config": ("load_config",),
    "rllab.training.trainer": ("Trainer",),
    "rllab.models.forward": ("grouped_response_logprobs",),
    "rllab.ops": ("RowError",),
    "rllab.training.optimizer": ("Optimizers", "StepOutcome"),
    "rllab.rollout.recorded": ("RecordedRollout",),
    "rllab.sampling": ("Sampler",),
    "rllab.records.provenance": ("note_data_file",),
    "rllab.types": (
        "Completion", "Example", "PreferencePair", "RolloutBackend", "RolloutBatch", "SamplingParams", "Task",
        "check_mask", "check_same_shape", "check_tensor",
    ),
}  # fmt: skip
_SUBMODULES_ON_FIRST_USE = ("algorithm", "ops")

if _TYPE_CHECKING:
    from rllab import algorithm, ops
    from rllab.algorithm import Algorithm, KLSample, OptimizerStep, Rollout, RunContext, StepReport
    from rllab.rollout.environment import Environment, Episode, Step
    from rllab.rollout.single_turn import SingleTurn
    from rllab.rollout.tools import Tool, tool, tool_step
    from rllab.config import load_config
    from rllab.training.trainer import Trainer
    from rllab.models.forward import grouped_response_logprobs
    from rllab.ops import RowError
    from rllab.training.optimizer import Optimizers, StepOutcome
    from rllab.rollout.recorded import RecordedRollout
    from rllab.sampling import Sampler
    from rllab.records.provenance import note_data_file
    from rllab.types import (
        Completion,
        Example,
        PreferencePair,
        RolloutBackend,
        RolloutBatch,
        SamplingParams,
        Task,
        check_mask,
        check_same_shape,
        check_tensor,
    )


def __getattr__(name: str):
    """A name of :data:`_ON_FIRST_USE` (or one of its submodules), imported now and kept."""
    if name in _SUBMODULES_ON_FIRST_USE:
        return _importlib.import_module(f"rllab.{name}")  # the import sets rllab.<name>
    module = next((m for m, names in _ON_FIRST_USE.items() if name in names), None)
    if module is None:
        raise AttributeError(f"module 'rllab' has no attribute {name!r}")
    value = globals()[name] = getattr(_importlib.import_module(module), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


from rllab.lab import __version__  # noqa: E402,F401  (the version runs record)

_compat.install()  # the import paths of earlier releases: they warn and forward until 1.0

__all__ = [
    "KINDS",
    "Algorithm",
    "KLSample",
    "MissingExtraError",
    "NonFiniteError",
    "OptimizerStep",
    "Optimizers",
    "RecordedRollout",
    "Rollout",
    "RewardError",
    "RunContext",
    "StepOutcome",
    "StepReport",
    "algorithm",
    "Completion",
    "Component",
    "ComponentSpec",
    "ConfigError",
    "DuplicateComponentError",
    "Environment",
    "Episode",
    "FloatOrFloats",
    "FloatOrFloatsOrNone",
    "Example",
    "FormerPaths",
    "Lab",
    "NoConfig",
    "PluginLoadError",
    "PreferencePair",
    "RllabError",
    "RllabDeprecationWarning",
    "RolloutBackend",
    "RolloutBatch",
    "RowError",
    "SamplingParams",
    "Sampler",
    "SingleTurn",
    "Step",
    "StrOrStrs",
    "StrOrStrsOrNone",
    "Task",
    "Tool",
    "Trainer",
    "UnknownComponentError",
    "check_mask",
    "check_same_shape",
    "check_tensor",
    "grouped_response_logprobs",
    "hookimpl",
    "knob",
    "load_config",
    "ops",
    "tool",
    "tool_step",
]
