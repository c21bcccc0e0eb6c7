"""rllab's user-facing errors. Each one says what was wrong and, where it can, what to do."""

from __future__ import annotations


class RllabError(Exception):
    """Base class of rllab's user-facing errors (the CLI prints them and exits 1)."""


class UnknownKindError(RllabError, KeyError):
    """A component kind that rllab does not have."""

    def __str__(self):  # KeyError quotes its message otherwise
        return self.args[0]


class UnknownComponentError(RllabError, KeyError):
    """A component name that no loaded plugin registered."""

    def __str__(self):
        return self.args[0]


class DuplicateComponentError(RllabError):
    """Two plugins registered the same (kind, name)."""


class ConfigError(RllabError, ValueError):
    """A bad knob or a malformed config.

    ``key`` names the offending knob or setting when one is to blame, so a caller that knows
    the TOML text can point at the key's own line.
    """

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(message)
        self.key = key


class MissingExtraError(RllabError, ImportError):
    """An optional package a component needs is not installed. The message names the component and
    the ``pip install`` that brings it (``pip install 'rllab[gem]'``); the command line prints it as
    one line, and code that catches ``ImportError`` still catches it."""


class PluginLoadError(RllabError):
    """A plugin that could not be imported or failed while registering."""


class RewardError(RllabError):
    """A reward function raised or returned a non-finite value."""


class PromptError(RllabError, ValueError):
    """A prompt that cannot be rendered: malformed chat messages, or messages (or a system prompt)
    for a tokenizer without a chat template."""


class NonFiniteError(RllabError):
    """A loss, gradient or parameter became NaN or infinite.

    ``section`` names the config section of the component to blame (``policy_loss``, ``kl``, …)
    when one can be named, ``step`` the training step.
    """

    def __init__(self, message: str, *, section: str | None = None, step: int | None = None):
        super().__init__(message)
        self.section = section
        self.step = step


class EpisodeError(RewardError):
    """An environment raised or answered a model turn with something that is not a valid step
    (a non-:class:`~rllab.rollout.environment.Step`, a non-string observation, a NaN reward); the message
    names the environment, the example and the turn."""


class NoDemonstrationError(RllabError):
    """A task or environment without ``demonstration(example)`` was asked for one (the tiny model's
    supervised warm start, or a contract check that plays demonstrations)."""


class SamplerSourceError(RllabError):
    """A prompt sampler cannot draw for the run's task or environment (it serves another kind of
    source, e.g. a reasoning-gym curriculum under a task that is not reasoning-gym's)."""
