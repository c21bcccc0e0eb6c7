"""Verifiable toy tasks: addition, chain, countdown, sort, reverse, and prompts read from a JSONL file.

Every task follows :class:`rllab.types.Task`. Rewards are exact and deterministic: 1.0 when the
decoded completion (the response up to, not including, the end-of-sequence token) is correct,
0.0 otherwise — never partial credit, never an exception on garbage.

Held-out split
--------------
An instance belongs to the evaluation split when a hash of its prompt, salted with the task's
``seed`` knob, falls below ``eval_fraction``::

    is_eval(prompt) = blake2b(f"{seed}\\0{prompt}") / 2**64 < eval_fraction

``train_examples`` draws from the generator it is given and rejects eval instances, so the two
splits are disjoint by construction, whatever the number of training draws. ``eval_examples``
draws with a generator seeded from ``seed`` and keeps the first ``eval_size`` distinct eval
instances (fewer when the instance space is small), so the split is fixed for a given config.

Prompt formats (the tiny character-level model of :mod:`rllab.tinymodel` covers every
character used)::

    addition   "12+34="              -> "46"
    chain      "3+8-5+7="            -> "13"      (a longer, sparser addition: every term must be right)
    countdown  "make 22 from 3 5 7:" -> "3*5+7"   (any expression using each number once; default: 2 numbers)
    sort       "sort 3a1:"           -> "13a"
    reverse    "reverse abc:"        -> "cba"
    jsonl      row["prompt"]         -> row["answer"], scored by ``exact`` / ``contains`` / ``numeric``

Several reward components
-------------------------
``addition`` with ``format_weight`` set scores each completion on two named components, as a
task with several reward functions does (see :class:`rllab.types.Task`)::

    correct  1.0 when the stripped completion equals the sum, else 0.0
    format   1.0 when the completion is digits only (no sign, space or other character), else 0.0

and its scalar reward is ``correct + format_weight·format`` (``reward_weights = (1,
format_weight)``); ``format_weight < 1`` keeps "solved" equal to "correct". ``gdpo`` and
``normalize_then_sum`` normalise the two components separately; every other estimator sees the
scalar.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
import string
from pathlib import Path

import attrs
import torch

import rllab
from rllab.types import Example

# --------------------------------------------------------------------------- the held-out split


def in_eval_split(prompt: str, *, seed: int, eval_fraction: float) -> bool:
    """Whether ``prompt`` belongs to the held-out split (a salted hash below ``eval_fraction``)."""
    digest = hashlib.blake2b(f"{seed}\0{prompt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < eval_fraction


class SplitTask:
    """Shared machinery: hash split, rejection sampling of training draws, a fixed eval list.

    Subclasses set ``name`` and implement ``draw(gen, k) -> list[Example]`` (``k`` candidate
    instances drawn with ``gen``), ``reward`` and, if the answer is not the demonstration,
    ``demonstration``. The config must have ``seed``, ``eval_fraction`` and ``eval_size``.
    """

    name = ""
    max_draws = 1 << 20
    """Give up (with an error) after this many candidate draws without filling a request."""

    def __init__(self, config):
        self.config = config
        self._eval: list[Example] | None = None

    def draw(self, gen: torch.Generator, k: int) -> list[Example]:
        raise TypeError(f"{type(self).__name__} must define draw(gen, k)")

    def is_eval(self, example: Example) -> bool:
        return in_eval_split(example.prompt, seed=self.config.seed, eval_fraction=self.config.eval_fraction)

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training instances (with replacement), drawn with ``rng``; none is in the eval split."""
        out: list[Example] = []
        drawn = 0
        while len(out) < n:
            k = max(2 * (n - len(out)), 16)
            for ex in self.draw(rng, k):
                if not self.is_eval(ex):
                    out.append(ex)
                    if len(out) == n:
                        break
            drawn += k
            if drawn > self.max_draws:
                raise RuntimeError(
                    f"task {self.name!r}: found only {len(out)} of {n} training instances in {drawn} draws; "
                    f"the training split is (nearly) empty — lower eval_fraction or enlarge the task"
                )
        return out

    def eval_examples(self) -> list[Example]:
        """The held-out split: up to ``eval_size`` distinct eval instances, in a fixed order."""
        if self._eval is None:
            gen = torch.Generator().manual_seed(self.config.seed)
            seen: set[str] = set()
            out: list[Example] = []
            drawn = 0
            while len(out) < self.config.eval_size and drawn < self.max_draws:
                before = len(out)
                for ex in self.draw(gen, 1024):
                    if ex.prompt not in seen and self.is_eval(ex):
                        seen.add(ex.prompt)
                        out.append(ex)
                        if len(out) == self.config.eval_size:
                            break
                drawn += 1024
                if len(out) == before:  # a whole batch found nothing new: the split is exhausted
                    break
            self._eval = out
        return list(self._eval)

    def demonstration(self, example: Example) -> str:
        """A correct completion: the reference answer."""
        return example.answer

    def __repr__(self):
        return f"<task {self.name!r} {self.config!r}>"


def _eval_fraction():
    return rllab.knob(0.1, help="share of the instance space held out for evaluation", gt=0.0, lt=1.0)


def _eval_size():
    return rllab.knob(200, help="held-out instances returned by eval_examples()", ge=1)


def _seed():
    return rllab.knob(0, help="salts the train/eval hash split and seeds the eval draw")


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
    eval_fraction: float = _eval_fraction()
    eval_size: int = _eval_size()
    seed: int = _seed()


class AdditionTask(SplitTask):
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
    eval_fraction: float = _eval_fraction()
    eval_size: int = _eval_size()
    seed: int = _seed()


class ChainTask(SplitTask):
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
    eval_fraction: float = _eval_fraction()
    eval_size: int = _eval_size()
    seed: int = _seed()


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


class CountdownTask(SplitTask):
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


# --------------------------------------------------------------------------- sort and reverse

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
    eval_fraction: float = _eval_fraction()
    eval_size: int = _eval_size()
    seed: int = _seed()


class _StringTask(SplitTask):
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
    warm_start_defaults = {"target_accuracy": 0.1, "check_every": 2}
    """The default warm start (stop at 25%, probed every 10 steps) overshoots to ~37% held-out
    accuracy, from which GRPO gains only ~8 points in 400 steps; stopping at 10% (probed every 2
    steps) starts it at ~13% and it gains ~27."""

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


# --------------------------------------------------------------------------- jsonl

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def first_number(text: str) -> float | None:
    """The first number written in ``text`` (``-3``, ``2.5``, ``1e3``), or None."""
    m = _NUMBER.search(text)
    if m is None:
        return None
    try:
        return float(m.group())
    except ValueError:
        return None


def reward_exact(answer: str, completion: str, tolerance: float) -> float:
    """1.0 iff the completion, stripped of surrounding whitespace, equals the stripped answer."""
    return 1.0 if completion.strip() == answer.strip() else 0.0


def reward_contains(answer: str, completion: str, tolerance: float) -> float:
    """1.0 iff the stripped answer occurs anywhere in the completion."""
    return 1.0 if answer.strip() in completion else 0.0


def reward_numeric(answer: str, completion: str, tolerance: float) -> float:
    """1.0 iff the first number in the completion is within ``tolerance`` of the answer:
    ``|x − y| ≤ tolerance · max(1, |y|)`` (absolute near zero, relative for large answers)."""
    x, y = first_number(completion), float(answer)
    if x is None or not math.isfinite(x):
        return 0.0
    return 1.0 if abs(x - y) <= tolerance * max(1.0, abs(y)) else 0.0


REWARD_FNS = {"exact": reward_exact, "contains": reward_contains, "numeric": reward_numeric}


@attrs.frozen
class JsonlConfig:
    """Knobs of the jsonl task."""

    path: str = rllab.knob(help='JSONL file with one {"prompt": ..., "answer": ...} object per line (required)')
    reward: str = rllab.knob("exact", help="how a completion is scored", choices=tuple(REWARD_FNS))
    tolerance: float = rllab.knob(1e-6, help="numeric reward: |x − y| ≤ tolerance·max(1, |y|)", ge=0.0)
    eval_fraction: float = _eval_fraction()
    eval_size: int = rllab.knob(1_000_000, help="at most this many held-out rows", ge=1)
    seed: int = _seed()


class JsonlTask:
    """Prompts and answers from a JSONL file, scored by a named reward function.

    Each line is an object with string ``prompt`` and ``answer`` (a number is accepted as the
    answer and kept as its text). Optional keys: ``demonstration`` (used by the warm start
    instead of the answer) and ``split`` (``"train"`` or ``"eval"``, overriding the hash split);
    every other key lands in ``Example.meta``. Blank lines are skipped.
    """

    name = "jsonl"

    def __init__(self, config: JsonlConfig):
        self.config = config
        path = Path(config.path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"task 'jsonl': no such file: {path}")
        if config.reward not in REWARD_FNS:
            raise ValueError(f"task 'jsonl': unknown reward {config.reward!r}; known: {', '.join(REWARD_FNS)}")
        self.reward_fn = REWARD_FNS[config.reward]
        self.train: list[Example] = []
        self.eval: list[Example] = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                ex, split = self._parse(path, lineno, line)
                is_eval = split == "eval" if split is not None else in_eval_split(
                    ex.prompt, seed=config.seed, eval_fraction=config.eval_fraction
                )
                (self.eval if is_eval else self.train).append(ex)
        if not self.train:
            raise ValueError(f"task 'jsonl': {path} has no training rows ({len(self.eval)} eval rows)")
        self.eval = self.eval[: config.eval_size]

    def _parse(self, path: Path, lineno: int, line: str) -> tuple[Example, str | None]:
        where = f"task 'jsonl': {path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
        for key in ("prompt", "answer"):
            if key not in row:
                raise ValueError(f"{where}: missing key {key!r}")
        prompt, answer = row.pop("prompt"), row.pop("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(prompt, str) or not isinstance(answer, str):
            raise ValueError(f"{where}: prompt and answer must be strings")
        if self.config.reward == "numeric":
            try:
                float(answer)
            except ValueError:
                raise ValueError(f"{where}: answer {answer!r} is not a number (reward 'numeric')") from None
        split = row.pop("split", None)
        if split not in (None, "train", "eval"):
            raise ValueError(f"{where}: split must be 'train' or 'eval', got {split!r}")
        demo = row.pop("demonstration", None)
        if demo is not None:
            row["demonstration"] = str(demo)
        return Example(prompt=prompt, answer=answer, meta=row), split

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training rows drawn uniformly with replacement using ``rng``."""
        idx = torch.randint(0, len(self.train), (n,), generator=rng).tolist()
        return [self.train[i] for i in idx]

    def eval_examples(self) -> list[Example]:
        """The held-out rows, in file order."""
        return list(self.eval)

    def reward(self, example: Example, completion: str) -> float:
        return self.reward_fn(example.answer, completion, self.config.tolerance)

    def demonstration(self, example: Example) -> str:
        """The row's ``demonstration`` if it has one, else its answer."""
        return example.meta.get("demonstration", example.answer)

    def __repr__(self):
        return f"<task 'jsonl' {self.config!r}>"


def jsonl(*, config: JsonlConfig) -> JsonlTask:
    """Prompt/answer rows from a JSONL file, scored by exact, contains or numeric match."""
    return JsonlTask(config)


# --------------------------------------------------------------------------- registration


@rllab.hookimpl
def register_tasks(register):
    register(
        "addition", addition, config=AdditionConfig,
        reward_components=lambda config: COMPONENTS if config.format_weight is not None else (),
    )
    register("chain", chain, config=ChainConfig)
    register("countdown", countdown, config=CountdownConfig)
    register("sort", sort, config=StringTaskConfig)
    register("reverse", reverse, config=StringTaskConfig)
    register("jsonl", jsonl, config=JsonlConfig)
