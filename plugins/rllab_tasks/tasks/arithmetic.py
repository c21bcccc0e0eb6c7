"""Arithmetic tasks: ``addition``, ``chain`` and ``countdown``.

Rewards are exact: 1.0 when the decoded completion is correct, else 0.0. Prompt formats::

    addition   "12+34="              -> "46"
    chain      "3+8-5+7="            -> "13"      (a longer, sparser addition: every term must be right)
    countdown  "make 22 from 3 5 7:" -> "3*5+7"   (any expression using each number once; default: 2 numbers)

``addition`` with ``format_weight`` set scores each completion on two named components,
``correct`` (the stripped completion equals the sum) and ``format`` (digits only), with the scalar
reward ``correct + format_weight·format``. Each task holds out an evaluation split defined by a
salted hash of the prompt (:mod:`rllab_tasks.split`).
"""

from __future__ import annotations

import ast
import re

import attrs
import torch

import rllab
from rllab.types import Example

from ..split import SplitTask, eval_fraction_knob, eval_size_knob, seed_knob

# --------------------------------------------------------------------------- addition


@attrs.frozen
class AdditionConfig:
    """Knobs of the addition task."""

    digits: int = rllab.knob(
        2, help="digits of each operand (uniform over numbers with exactly that many)", ge=1, le=18
    )
    format_weight: float | None = rllab.knob(
        None,
        help="score two reward components, correct and format (digits only), with reward = correct + "
        "format_weight·format; None: one exact-match reward",
        ge=0.0, lt=1.0,
    )
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


class AdditionTask(SplitTask, rllab.SingleTurn):
    """Multi-digit addition: ``"12+34="`` → ``"46"``. Reward: the stripped completion equals the sum.

    Both operands have exactly ``digits`` digits (0–9 when ``digits`` is 1), so every prompt
    has the same layout.
    """

    name = "addition"

    def __init__(self, config):
        super().__init__(config)
        if config.format_weight is not None:
            self.reward_components = COMPONENTS
            self.reward_weights = (1.0, config.format_weight)

    def draw(self, gen, k):
        d = self.config.digits
        lo, hi = (0 if d == 1 else 10 ** (d - 1)), 10**d
        a = torch.randint(lo, hi, (k,), generator=gen).tolist()
        b = torch.randint(lo, hi, (k,), generator=gen).tolist()
        return [Example(prompt=f"{x}+{y}=", answer=str(x + y), meta={"a": x, "b": y}) for x, y in zip(a, b)]

    def reward(self, example: Example, completion: str) -> float | dict[str, float]:
        correct = 1.0 if completion.strip() == example.answer else 0.0
        if self.config.format_weight is None:
            return correct
        return {"correct": correct, "format": 1.0 if _DIGITS.fullmatch(completion) else 0.0}


COMPONENTS = ("correct", "format")
_DIGITS = re.compile(r"[0-9]+")


def addition(*, config: AdditionConfig) -> AdditionTask:
    """Multi-digit addition ("12+34=" -> "46"), exact-match reward (or correct + format components)."""
    return AdditionTask(config)


# --------------------------------------------------------------------------- chain


@attrs.frozen
class ChainConfig:
    """Knobs of the chain task."""

    terms: int = rllab.knob(4, help="numbers in the expression (≥ 2)", ge=2, le=12)
    digits: int = rllab.knob(
        1,
        help="digits of each number (uniform over numbers with exactly that many); with 2, the tiny model's default run does not learn",
        ge=1,
        le=9,
    )
    subtract: bool = rllab.knob(True, help="allow '-' between terms (instances with a negative result are redrawn)")
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


class ChainTask(SplitTask, rllab.SingleTurn):
    """A chain of additions and subtractions: ``"3+8-5+7="`` → ``"13"``. Exact-match reward.

    Harder than ``addition``: the answer depends on every term and every carry, so the reward is
    sparse (one wrong digit anywhere scores 0) and the model must carry state over a longer
    prompt. The result is never negative. With the defaults (4 one-digit terms) the default GRPO
    run lifts held-out accuracy from 23.5% to 40.5%; with ``digits = 2`` it stays near 5%.
    """

    name = "chain"

    def draw(self, gen, k):
        c = self.config
        lo, hi = (0 if c.digits == 1 else 10 ** (c.digits - 1)), 10**c.digits
        out = []
        while len(out) < k:
            m = 2 * (k - len(out)) + 8
            nums = torch.randint(lo, hi, (m, c.terms), generator=gen).tolist()
            ops = torch.randint(0, 2 if c.subtract else 1, (m, c.terms - 1), generator=gen).tolist()
            for ns, os_ in zip(nums, ops):
                expr = str(ns[0]) + "".join("+-"[o] + str(n) for o, n in zip(os_, ns[1:]))
                value = ns[0] + sum(n if o == 0 else -n for o, n in zip(os_, ns[1:]))
                if value >= 0:
                    out.append(Example(prompt=f"{expr}=", answer=str(value), meta={"terms": ns, "value": value}))
                    if len(out) == k:
                        break
        return out

    def reward(self, example: Example, completion: str) -> float:
        return 1.0 if completion.strip() == example.answer else 0.0


def chain(*, config: ChainConfig) -> ChainTask:
    """A chain of additions/subtractions ("12+34-7+58=" -> "97"), exact match: longer, sparser than addition."""
    return ChainTask(config)


# --------------------------------------------------------------------------- countdown

_OPS = "+-*"
_COUNTDOWN_CHARS = set("0123456789+-*() ")


@attrs.frozen
class CountdownConfig:
    """Knobs of the countdown task."""

    count: int = rllab.knob(
        2,
        help="how many numbers are given (the tiny model's warm start never solves 3 in its budget: every reward would be 0)",
        ge=2,
        le=6,
    )
    max_number: int = rllab.knob(20, help="numbers are uniform in [1, max_number] (20: about 60 held-out instances with count = 2)", ge=1, le=100)
    max_target: int = rllab.knob(100, help="instances whose target is outside [0, max_target] are redrawn", ge=1)
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


def evaluate_countdown(expression: str) -> tuple[int, list[int]] | None:
    """Value of an expression of non-negative integers, ``+ - *`` and parentheses, and the
    integers it uses; None if it is anything else (other operators, unary minus, names, ...)."""
    if len(expression) > 200 or not set(expression) <= _COUNTDOWN_CHARS:
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None
    used: list[int] = []

    def value(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
        raise ValueError("not allowed")

    try:
        return value(tree.body), used
    except ValueError:
        return None


class CountdownTask(SplitTask, rllab.SingleTurn):
    """Countdown: reach the target using every given number exactly once with ``+ - *``.

    ``"make 22 from 3 5 7:"`` → e.g. ``"3*5+7"``. The numbers are listed in ascending order;
    parentheses are allowed. Reward 1.0 iff the expression's integers are exactly the given
    multiset and its value (usual precedence) equals the target.
    """

    name = "countdown"

    def draw(self, gen, k):
        c = self.config
        out = []
        while len(out) < k:
            m = 2 * (k - len(out)) + 8
            nums = torch.randint(1, c.max_number + 1, (m, c.count), generator=gen).tolist()
            ops = torch.randint(0, len(_OPS), (m, c.count - 1), generator=gen).tolist()
            for ns, os_ in zip(nums, ops):
                expr = str(ns[0]) + "".join(_OPS[o] + str(n) for o, n in zip(os_, ns[1:]))
                target, _ = evaluate_countdown(expr)
                if 0 <= target <= c.max_target:
                    listed = " ".join(map(str, sorted(ns)))
                    out.append(
                        Example(
                            prompt=f"make {target} from {listed}:",
                            answer=expr,
                            meta={"numbers": sorted(ns), "target": target},
                        )
                    )
                    if len(out) == k:
                        break
        return out

    def reward(self, example: Example, completion: str) -> float:
        result = evaluate_countdown(completion.strip())
        if result is None:
            return 0.0
        val, used = result
        ok = val == example.meta["target"] and sorted(used) == list(example.meta["numbers"])
        return 1.0 if ok else 0.0


def countdown(*, config: CountdownConfig) -> CountdownTask:
    """Countdown ("make 22 from 3 5 7:" -> "3*5+7"): reach the target with + - *."""
    return CountdownTask(config)
