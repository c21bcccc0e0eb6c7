"""A task's rubric: its reward functions, reward components and their weights.

:class:`Rubric` turns (example, answer text) rows into ``(reward, score)``: the scalar
reward and, for a task of several reward components, the component values in the declared
order (``score``; empty for a single-reward task). It is what a task's one-turn episode
(:class:`rllab.rollout.single_turn.SingleTurn`) calls when the model has answered; it knows
nothing of the rollout stage.

A task may define ``reward_batch(examples, completions, *, completion_ids) -> list`` (one
``reward`` result per pair; ``completion_ids`` the sampled token ids of each completion, its stop
token included): the scorer then scores a whole turn with one call (TRL-style reward functions
are batched), and calls it on each row alone when that call raises, so that a failure is charged
to its own row.

A task with several reward components (``task.reward_components``, see :class:`rllab.types.Task`)
returns a mapping name → float; the scorer checks it has exactly the declared names, and the
scalar reward is ``Σ_k w_k·r_k`` (``task.reward_weights``, default all 1). A mapping with a
missing or extra name, or a non-finite entry, is a failed row like a reward that raises.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Sequence

from rllab.rollout.chat import prompt_text
from rllab.errors import MissingExtraError, RewardError
from rllab.members import member
from rllab.types import Example


class Rubric:
    """The reward of a task's answers (see the module docstring).

    :param task: the task component's instance.
    :param name: its registered name (for messages).
    :param tokenizer: tokenizes an answer's text when its sampled ids are not given.
    """

    def __init__(self, task: Any, *, name: str, tokenizer: Any = None):
        self.task = task
        self.name = name
        self.tokenizer = tokenizer

    @property
    def names(self) -> tuple[str, ...]:
        """The task's reward component names (empty for a single-reward task)."""
        return tuple(member(self.task, "task", "reward_components"))

    def weights(self) -> list[float]:
        """w_k of the scalar reward Σ_k w_k·r_k: the task's ``reward_weights``, default all 1."""
        return component_weights(self.task, self.names, who=f"task {self.name!r}")

    def _batch_rewards(self, examples: Sequence[Example], texts: Sequence[str], ids: Sequence[list[int]]) -> list | None:
        """What ``task.reward_batch(examples, texts)`` returns for every row at once, when the task
        defines it (reward functions in TRL's batched signature are then called once per turn);
        None when it does not, or when the batch call fails — each row is then scored alone, so a
        failure is charged to its own row."""
        batch = member(self.task, "task", "reward_batch")
        if batch is None or not texts:
            return None
        try:
            out = list(batch(list(examples), list(texts), completion_ids=[list(i) for i in ids]))
        except MissingExtraError:
            raise  # a reward's package is not installed: one error naming the install, not a row's failure
        except Exception:
            return None
        return out if len(out) == len(texts) else None

    def _reward(self, ex: Example, text: str, names: tuple[str, ...], weights: list[float], given: Any = None) -> tuple[float, list[float]]:
        """(scalar reward, component values) of one answer (``given``: what the batch call
        returned for it); raises on a malformed reward."""
        out = self.task.reward(ex, text) if given is None else given
        if not names:
            r = _real(out, "returned")
            if not math.isfinite(r):
                raise ValueError(f"returned {r}")
            return r, []
        if not isinstance(out, Mapping):
            raise TypeError(f"returned {type(out).__name__}, not a mapping of its reward components {names!r}")
        if set(out) != set(names):
            missing, extra = sorted(set(names) - set(out)), sorted(set(out) - set(names))
            raise ValueError(f"returned components {sorted(out)!r}; missing {missing!r}, unexpected {extra!r} (declared {names!r})")
        values = [_real(out[n], f"returned component {n!r} as") for n in names]
        bad = [n for n, v in zip(names, values) if not math.isfinite(v)]
        if bad:
            raise ValueError(f"returned non-finite components {bad!r}: {dict(zip(names, values))!r}")
        return sum(w * v for w, v in zip(weights, values)), values

    def rows(self, examples: Sequence[Example], texts: Sequence[str], ids: Sequence[list[int]] | None) -> list:
        """Per row (``examples[i]`` answered by ``texts[i]``, sampled as ``ids[i]``): the task's
        ``(scalar reward, component values)``, or the exception its reward raised (malformed or
        non-finite rewards included). The batched ``reward_batch`` is tried first."""
        names = self.names
        weights = self.weights()
        if ids is None:
            ids = [list(self.tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
        batched = self._batch_rewards(examples, texts, ids)
        one_by_one = member(self.task, "task", "reward_batch") if batched is None else None
        out: list = []
        for i, (ex, text) in enumerate(zip(examples, texts)):
            try:
                given = batched[i] if batched is not None else None
                if one_by_one is not None:  # the batch call failed: each row alone, so the failure is its own
                    given = one_by_one([ex], [text], completion_ids=[list(ids[i])])[0]
                out.append(self._reward(ex, text, names, weights, given))
            except MissingExtraError:
                raise  # no row can score without the package: not a failure to skip or zero
            except Exception as e:
                out.append(e)
        return out

    def error_message(self, example: Example, text: str | None, e: BaseException) -> str:
        """What a task's failed reward was: the task, the prompt, the completion and the error."""
        return (
            f"reward of task {self.name!r} failed on prompt {prompt_text(example.prompt)!r} with completion {text!r}: "
            f"{type(e).__name__}: {e}."
        )


def _real(value: Any, what: str) -> float:
    """``value`` as a float when it is a real number (a bool, an int, a float, a 0-d array or
    tensor); a string, None or anything else is refused, saying ``what`` gave it."""
    if hasattr(value, "item") and not isinstance(value, numbers.Real):  # a 0-d tensor or array
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{what} {type(value).__name__} {value!r}, not a number")
    return float(value)


def component_weights(source: Any, names: Sequence[str], *, who: str) -> list[float]:
    """w_k of the scalar reward Σ_k w_k·r_k over the reward components ``names`` of ``source`` (a
    task or an environment, named ``who`` in messages): its ``reward_weights``, default all 1."""
    weights = getattr(source, "reward_weights", None)
    if weights is not None:
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
            raise RewardError(f"{who}: reward_weights = {weights!r} is not a sequence of {len(names)} numbers (one per reward component {tuple(names)!r})")
        bad = [w for w in weights if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w)]
        if bad:
            raise RewardError(f"{who}: reward_weights = {tuple(weights)!r} holds {bad[0]!r}, not a finite number (one weight per reward component {tuple(names)!r})")
    weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
    if len(weights) != len(names):
        raise RewardError(
            f"{who}: reward_weights has {len(weights)} entries for its {len(names)} reward components {tuple(names)!r}"
        )
    return weights


__all__ = ["Rubric", "component_weights"]
