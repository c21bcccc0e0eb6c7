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

from rllab import algorithm, ops  # noqa: E402
from rllab.algorithm import Algorithm, KLSample, OptimizerStep, RunContext, StepReport  # noqa: E402
from rllab.errors import NonFiniteError, RewardError  # noqa: E402
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
from rllab.ops import RowError  # noqa: E402
from rllab.optimizer import Optimizers, StepOutcome  # noqa: E402
from rllab.rollout import RecordedRollout  # noqa: E402
from rllab.types import (  # noqa: E402
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

__version__ = "0.1.0"

__all__ = [
    "KINDS",
    "Algorithm",
    "KLSample",
    "NonFiniteError",
    "OptimizerStep",
    "Optimizers",
    "RecordedRollout",
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
    "Example",
    "Lab",
    "NoConfig",
    "PluginLoadError",
    "PreferencePair",
    "RllabError",
    "RolloutBackend",
    "RolloutBatch",
    "RowError",
    "SamplingParams",
    "Task",
    "UnknownComponentError",
    "check_mask",
    "check_same_shape",
    "check_tensor",
    "hookimpl",
    "knob",
    "ops",
]
