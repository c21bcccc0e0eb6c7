"""What counts as solved: the one notion of "correct" behind ``rollout/accuracy``,
``eval/accuracy`` and the tiny model's warm-start probe.

In this order: the task's (or environment's) own ``solved(example, reward)``; else, for a task of
several reward components, its correctness component ≥ 1 (``correct_component``, default the
first, primary component); else a reward ≥ 1. Never the weighted sum of several components: a
negative shaping term (a length penalty weighted 0.01) would put every correct answer under 1.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rllab.errors import ConfigError, RllabError
from rllab.members import member


def correct_component(task: Any, *, who: str = "the task") -> str | None:
    """The reward component that says whether an answer is correct: the task's
    ``correct_component`` when it names one, else its first (primary) ``reward_components`` name;
    None for a single-reward task. A name that is not one of the components is refused
    (:class:`~rllab.errors.ConfigError` listing them)."""
    names = tuple(member(task, "task", "reward_components"))
    chosen = member(task, "task", "correct_component")
    if chosen is None:
        return names[0] if names else None
    if not names:
        raise ConfigError(
            f"{who}: correct_component = {chosen!r}, but it has a single reward, no components: leave correct_component "
            f"unset (a reward ≥ 1 is solved); it chooses among two or more reward components", key="correct_component",
        )
    if chosen not in names:
        raise ConfigError(
            f"{who}: correct_component = {chosen!r} is not one of its reward components; its reward components are "
            f"{', '.join(map(repr, names))}. Name one of them (task.correct_component), or leave it unset for the first",
            key="correct_component",
        )
    return chosen


def solved_rule(task: Any, *, kind: str = "task") -> str:
    """What counts as solved for ``task`` (:func:`is_solved`), in words, for a run's header and
    ``final.json``."""
    if member(task, "task", "solved") is not None:
        return f"the {kind}'s own solved(example, reward) is true"
    name = correct_component(task)
    if name is None:
        return "reward ≥ 1"
    how = "task.correct_component" if member(task, "task", "correct_component") is not None else "the first, primary component"
    return f"reward component {name!r} ≥ 1 ({how})"


def solver(task: Any):
    """``task``'s notion of solved resolved once, as ``fn(example, reward, components=None) -> bool``
    (:func:`is_solved` without looking the task's members up again: the rollout stage asks it of
    every sample)."""
    own = member(task, "task", "solved")
    if own is not None:
        return lambda example, reward, components=None: bool(own(example, reward))
    name = correct_component(task)
    if name is None:
        return lambda example, reward, components=None: reward >= 1.0
    names = tuple(member(task, "task", "reward_components"))

    def by_component(example: Any, reward: float, components: Mapping[str, float] | Sequence[float] | None = None) -> bool:
        if not components:
            raise RllabError(
                f"is_solved: the task has reward components {names!r} and no solved(); pass the answer's components "
                f"(accuracy comes from component {name!r}, never from the weighted sum)"
            )
        if not isinstance(components, Mapping):
            components = dict(zip(names, components))
        return float(components[name]) >= 1.0

    return by_component


def is_solved(task: Any, example: Any, reward: float, components: Mapping[str, float] | Sequence[float] | None = None) -> bool:
    """Whether an answer is solved (see :class:`Task`): ``task.solved(example, reward)`` when the
    task defines it; else, for a task of several reward components, its correctness component
    (:func:`correct_component`) ≥ 1, read from ``components`` (a mapping name → value, or the
    values in the declared order); else ``reward ≥ 1``."""
    return solver(task)(example, reward, components)


def scalar_reward(task: Any, value: Any) -> float:
    """The scalar reward of what ``task.reward`` returned: the value itself for a single-reward
    task; ``Σ_k w_k·r_k`` over ``task.reward_components`` (weights ``task.reward_weights``,
    default all 1) for a mapping of components."""
    if not isinstance(value, Mapping):
        return float(value)
    names = tuple(member(task, "task", "reward_components") or value)
    weights = member(task, "task", "reward_weights") or (1.0,) * len(names)
    return sum(float(w) * float(value[n]) for w, n in zip(weights, names))
