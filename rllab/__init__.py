"""rllab: a plugin-based laboratory for reinforcement learning on language models.

Public API for plugin authors and users::

    import rllab

    @rllab.hookimpl
    def register_policy_losses(register):
        register("my_loss", my_loss, config=MyConfig)

    lab = rllab.Lab()
    loss = lab.get("policy_loss", "ppo_clip", clip_high=0.28)
"""

from rllab import ops
from rllab.hookspecs import hookimpl
from rllab.lab import (
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
from rllab.ops import RowError
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
)

__version__ = "0.1.0"

__all__ = [
    "KINDS",
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
    "hookimpl",
    "knob",
    "ops",
]
