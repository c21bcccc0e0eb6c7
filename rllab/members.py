"""Optional members: what the kernel reads from a plugin's object when it is there, and the default
it applies when it is not.

The protocols (:class:`rllab.rollout.environment.Environment`, :class:`rllab.types.Task`,
:class:`rllab.types.RolloutBackend`, :class:`rllab.algorithm.Algorithm`'s objects) name the
members every object has. Beside them, an object may define the optional members listed in
:data:`MEMBERS`; the base classes (``rllab.Environment``, ``rllab.Task``, ``rllab.RolloutBackend``)
carry every default, so a subclass defines only what it changes. The kernel reads an optional
member through :func:`member`, which applies the declared default to an object that does not
subclass a base (duck typing stays supported): one table, no default repeated at a call site.

Traits (:mod:`rllab.traits`) are the other seam: what a component declares in its registration,
read before anything is built.
"""

from __future__ import annotations

import abc
from types import MappingProxyType
from typing import Any

import attrs

_MISSING = object()
NO_DEFAULTS = MappingProxyType({})


@attrs.frozen(kw_only=True)
class Member:
    """One optional member of a protocol: its meaning and its default."""

    help: str
    default: Any = None
    none_is_default: bool = True
    """A value of None reads as the default too (False: None is kept, and refused where it is read)."""


_KNOB_DEFAULTS = dict(
    rollout_defaults=Member(
        help="a dict of [rollout] settings the component needs (on the registered factory, e.g. a class attribute: "
        "{'max_new_tokens': 16} for turns that hold a tool call), applied to those the config does not set",
        default=NO_DEFAULTS,
    ),
    warm_start_defaults=Member(
        help="a dict of model.warm_start knobs for the tiny default model, applied to those the config leaves at "
        "their defaults", default=NO_DEFAULTS,
    ),
    tiny_model_defaults=Member(
        help="a dict of model.tiny knobs for the tiny default model ({'max_position_embeddings': 1024} for prompts "
        "longer than its 256 positions), applied to those the config leaves at their defaults", default=NO_DEFAULTS,
    ),
)

_SOLVED = Member(help="solved(example, reward) -> bool: what counts as solved for rollout/accuracy and eval/accuracy; "
                 "None: the default rule (rllab.rollout.accuracy)")

MEMBERS: dict[str, dict[str, Member]] = {
    "environment": {
        "max_turns": Member(
            help="the most model turns an episode may take (an integer ≥ 1); rollout.max_turns overrides it",
            default=1, none_is_default=False,
        ),
        "solved": _SOLVED,
        "describe_error": Member(
            help="describe_error(example, text, turn, error) -> str: the message of a failed episode; None: the "
            "kernel's own (the environment, the turn, the text and the error)",
        ),
        "step_batch": Member(
            help="step_batch(episodes, texts, *, completion_ids) -> list of Step (or the exception): called once per "
            "turn instead of each episode's step; None: each episode's step",
        ),
        "tools": Member(help="the tools the environment exposes (rllab.rollout.tools), listed by `rllab plugins show NAME`",
                        default=()),
        "reward_components": Member(help="the names of the reward components (K ≥ 2) each Step.score gives, in order; "
                                    "empty: one reward", default=()),
        "reward_weights": Member(help="K floats w_k: the step's reward is Σ_k w_k·r_k of its score; None: all 1"),
        "correct_component": Member(help="the component that says whether an episode is solved; None: the first"),
        "multi_turn": Member(
            help="whether its episodes are reported as episodes of turns: env/* counters with each step, eval/turns with "
            "each evaluation, the random-reward control drawn at its solved rate (per-turn rewards are of any scale), "
            "and partial rollouts refused; rllab.SingleTurn sets False", default=True,
        ),
        **_KNOB_DEFAULTS,
    },
    "episode": {
        "close": Member(help="close() -> None: release what the episode holds, called when it ends; None: nothing to release"),
    },
    "task": {
        "reward_components": Member(help="the names of the reward components (K ≥ 2) its reward returns; empty: one reward",
                                    default=()),
        "reward_weights": Member(help="K floats w_k of the scalar reward Σ_k w_k·r_k; None: all 1"),
        "correct_component": Member(help="the component that says whether an answer is correct; None: the first"),
        "solved": _SOLVED,
        "reward_batch": Member(
            help="reward_batch(examples, texts, *, completion_ids) -> list: every completion's reward at once; None: "
            "reward per completion",
        ),
        "warm_start_defaults": _KNOB_DEFAULTS["warm_start_defaults"],
        "tiny_model_defaults": _KNOB_DEFAULTS["tiny_model_defaults"],
        "train": Member(
            help="every training row, a list of Example, when the task holds them (a data set): the prompt-length "
            "check then measures all of them; None: it measures a sample of train_examples",
        ),
    },
    "rollout_backend": {
        "last_metrics": Member(
            help="last_metrics() -> mapping name → float: counters of the last generate (required of a backend a run "
            "uses; the base class answers {}); None: no counters",
        ),
        "follow_weights": Member(
            help="follow_weights() -> metrics or None: servers every data-parallel rank shares; another rank pushed the "
            "weights, count them. None: each rank's backend takes the weights itself",
        ),
        "pushes_in_flight": Member(
            help="True: a weight sync need not wait for the batch being sampled (asynchronous rollouts overlap them)",
            default=False,
        ),
        "generate_until": Member(
            help="generate_until(prompts, params, *, caps, groups, needed) -> one completion per prompt (n = 1 each; "
            "row i at most caps[i] new tokens, in group groups[i], a group's rows consecutive): sampling stops once `needed` groups have "
            "every row finished, the unfinished rows come back with finish_reason 'abort' and their tokens so far "
            "(partial rollouts, rollout.over_sample). None: the backend cannot stop a batch early",
        ),
    },
    "sampler": {
        "feedback": Member(help="feedback(*, step, examples, rewards) -> None: each drawn prompt's mean group reward "
                           "after the step's rollout; None: the sampler takes no feedback"),
        "state_dict": Member(help="state_dict() -> dict: what a checkpoint saves of the sampler; None: it has no state"),
        "load_state_dict": Member(help="load_state_dict(state) -> None: restore a checkpoint's state_dict on resume"),
        "metrics": Member(help="metrics() -> dict name → float: logged as sampler/... with each step; None: none"),
    },
    "algorithm": {
        "reconfigure": Member(help="reconfigure(components) -> None: take a [[schedule]] entry's new components; None: "
                              "the algorithm is rebuilt"),
    },
}
"""Every optional member, by protocol."""


def member(obj: Any, protocol: str, name: str) -> Any:
    """``obj.name`` when ``obj`` defines it, else the default :data:`MEMBERS` declares for it (a
    value of None reads as the default too, unless the member says otherwise)."""
    spec = MEMBERS[protocol][name]
    value = getattr(obj, name, _MISSING)
    if value is _MISSING or (value is None and spec.none_is_default):
        return spec.default
    return value


def defaults(protocol: str) -> dict[str, Any]:
    """Each optional member of ``protocol`` → its default (what a base class carries)."""
    return {name: m.default for name, m in MEMBERS[protocol].items()}


def with_defaults(protocol: str):
    """A class decorator giving a base class every optional member of ``protocol`` it does not
    define itself, with its declared default."""

    def apply(cls):
        for name, value in defaults(protocol).items():
            if name not in cls.__dict__:
                setattr(cls, name, value)
        return cls

    return apply


class _StructuralMeta(abc.ABCMeta):
    def __instancecheck__(cls, instance):
        if super().__instancecheck__(instance):
            return True
        required = cls.__dict__.get("_required")
        return required is not None and all(hasattr(instance, name) for name in required)


class Structural(metaclass=_StructuralMeta):
    """A base class that is a protocol too: ``isinstance(obj, Base)`` holds for a subclass's
    instance and for any object with every member the base names in its own ``_required`` (as a
    ``runtime_checkable`` protocol checks); a subclass of the base checks by inheritance only."""

    @classmethod
    def __subclasshook__(cls, other):
        required = cls.__dict__.get("_required")
        if required is None:
            return NotImplemented
        return all(any(name in base.__dict__ for base in other.__mro__) for name in required) or NotImplemented
