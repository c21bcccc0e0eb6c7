"""String tasks: ``sort`` and ``reverse`` over a configurable alphabet.

Rewards are exact: 1.0 when the decoded completion is correct, else 0.0. Prompt formats::

    sort       "sort 3a1:"           -> "13a"
    reverse    "reverse abc:"        -> "cba"

Each task holds out an evaluation split defined by a salted hash of the prompt
(:mod:`rllab_tasks.split`).
"""

from __future__ import annotations

import string

import attrs
import torch

import rllab
from rllab.types import Example

from ..split import SplitTask, eval_fraction_knob, eval_size_knob, seed_knob

_ALPHABETS = {
    "digits": string.digits,
    "letters": string.ascii_lowercase,
    "mixed": string.digits + string.ascii_lowercase,
}


def _check_lengths(inst, attribute, value):
    if value < inst.min_length:
        raise ValueError(f"max_length = {value} is below min_length = {inst.min_length}")


@attrs.frozen
class StringTaskConfig:
    """Knobs of the sort and reverse tasks."""

    min_length: int = rllab.knob(3, help="shortest input string", ge=1, le=64)
    max_length: int = rllab.knob(6, help="longest input string (≥ min_length)", ge=1, le=64, validator=_check_lengths)
    alphabet: str = rllab.knob("digits", help="characters drawn from", choices=tuple(_ALPHABETS))
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


class _StringTask(SplitTask, rllab.SingleTurn):
    verb = ""

    def transform(self, s: str) -> str:
        raise TypeError(f"{type(self).__name__} must define transform(s)")

    def draw(self, gen, k):
        c = self.config
        chars = _ALPHABETS[c.alphabet]
        lengths = torch.randint(c.min_length, c.max_length + 1, (k,), generator=gen).tolist()
        idx = torch.randint(0, len(chars), (k, c.max_length), generator=gen).tolist()
        out = []
        for n, row in zip(lengths, idx):
            s = "".join(chars[i] for i in row[:n])
            out.append(Example(prompt=f"{self.verb} {s}:", answer=self.transform(s), meta={"input": s}))
        return out

    def reward(self, example: Example, completion: str) -> float:
        return 1.0 if completion.strip() == example.answer else 0.0


class SortTask(_StringTask):
    """Sort the characters of a short string: ``"sort 3a1:"`` → ``"13a"`` (code-point order)."""

    name = "sort"
    verb = "sort"
    warm_start_defaults = {"target_accuracy": 0.2, "check_every": 2}
    """Stop the warm start at 20% on the probe (checked every 2 steps): it starts at 17.5% held-out
    and GRPO gains +27.5 points on each of seeds 0–2 in 400 steps. At 10% the sampling policy is
    too flat (entropy ~2.9 nats per token, rollout accuracy ~0.1%) and the gain ranged from −5.5
    to +26 over seeds 0–2; at 30% it starts at 27% and gains +18. Every run levels off at 45%
    by step ~250."""

    def transform(self, s):
        return "".join(sorted(s))


class ReverseTask(_StringTask):
    """Reverse a short string: ``"reverse abc:"`` → ``"cba"``."""

    name = "reverse"
    verb = "reverse"

    def transform(self, s):
        return s[::-1]


def sort(*, config: StringTaskConfig) -> SortTask:
    """Sort a short string of digits/letters ("sort 31a:" -> "13a"), exact match."""
    return SortTask(config)


def reverse(*, config: StringTaskConfig) -> ReverseTask:
    """Reverse a short string ("reverse abc:" -> "cba"), exact match."""
    return ReverseTask(config)
