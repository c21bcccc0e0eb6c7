"""Prompt samplers: which examples of the run's task (or environment) a step trains on.

A sampler is a component of kind ``sampler`` (``register_samplers``, the ``[sampler]`` section).
The rollout stage asks it for each step's prompts instead of drawing them from the task itself::

    examples = sampler.draw(n=P, rng=step_generator, step=step, source=env.train_examples)
    ... play a group per prompt ...
    sampler.feedback(step=step, examples=examples, rewards=mean_reward_per_prompt)

A run without a ``[sampler]`` section uses the default one, whose draw is the source's own. What a
sampler keeps (pools, per-prompt rewards) is saved in the run's checkpoints (``state_dict`` /
``load_state_dict``) and its counters are logged each step as ``sampler/…`` (``metrics``).

:class:`Sampler` is the base class: subclass it for the defaults of the optional members
(:data:`rllab.members.MEMBERS` ``["sampler"]``); a duck-typed object with ``draw`` works too.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rllab.errors import ConfigError, RllabError
from rllab.members import Structural, member
from rllab.types import Example

Source = Callable[[int, Any], list[Example]]
"""``source(n, rng)``: ``n`` examples drawn with the torch generator ``rng`` (the task's ``train_examples``)."""


class Sampler(Structural):
    """The base class of prompt samplers (see the module docstring).

    ``isinstance(obj, Sampler)`` holds for any object with a ``draw`` method.
    """

    _required = ("draw",)

    def draw(self, *, n: int, rng: Any, step: int, source: Source) -> list[Example]:
        """The step's ``n`` examples; ``rng`` the step's torch generator, ``source`` the run's draw.
        Every sampler defines it (``_required``); the base only says so."""
        raise RllabError(f"sampler {type(self).__name__} defines no draw(n=, rng=, step=, source=); a sampler must")

    def feedback(self, *, step: int, examples: Sequence[Example], rewards: Sequence[float | None]) -> None:
        """Each drawn prompt's mean group reward after the step (None: every sample failed). Default: ignored."""

    def state_dict(self) -> dict:
        """What a checkpoint saves (default: nothing)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s value on resume (default: nothing to restore)."""

    def metrics(self) -> dict[str, float]:
        """Counters logged with the step as ``sampler/…`` (default: none)."""
        return {}


def feedback(sampler: Any, *, step: int, examples: Sequence[Example], rewards: Sequence[float | None]) -> None:
    """Give ``sampler`` its feedback, when it takes any."""
    fn = member(sampler, "sampler", "feedback")
    if fn is not None:
        fn(step=step, examples=list(examples), rewards=list(rewards))


def metrics(sampler: Any, *, name: str) -> dict[str, float]:
    """The sampler's ``sampler/…`` metrics (refused, naming ``name``, when a key is not namespaced so)."""
    fn = member(sampler, "sampler", "metrics")
    out = dict(fn() or {}) if fn is not None else {}
    bad = [k for k in out if not str(k).startswith("sampler/")]
    if bad:
        raise ConfigError(f"sampler {name!r}: metrics {bad} must be namespaced 'sampler/…' (e.g. 'sampler/{bad[0]}')")
    return {k: float(v) for k, v in out.items()}


def state(sampler: Any) -> dict | None:
    """The sampler's checkpoint state (None: it keeps none)."""
    fn = member(sampler, "sampler", "state_dict")
    return None if fn is None else fn()


def restore(sampler: Any, saved: dict | None) -> None:
    """Set back a checkpoint's :func:`state` (nothing saved, or a sampler without state: nothing)."""
    fn = member(sampler, "sampler", "load_state_dict")
    if saved is not None and fn is not None:
        fn(saved)


__all__ = ["Sampler", "Source", "feedback", "metrics", "restore", "state"]
