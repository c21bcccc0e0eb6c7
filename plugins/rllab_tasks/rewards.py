"""Built-in reward functions, in TRL's batched signature (see :mod:`rllab.rollout.rewards`).

Each receives ``completions`` (strings, or ``[{"role": "assistant", "content": ...}]`` for chat
prompts) and ``ground_truth`` (the reference answers), and returns one float per completion::

    exact          1.0 iff the stripped completion equals the stripped answer
    contains       1.0 iff the stripped answer occurs in the completion
    numeric        1.0 iff the first number in the completion is within tolerance of the answer
    math_verify    1.0 iff math-verify finds the completion's final answer (\\boxed{...} or plain)
                   equal to the answer (LaTeX and numeric equivalence); needs the ``math`` extra
    format         1.0 iff the completion matches a regular expression (default: TRL's
                   <think>…</think><answer>…</answer> format)
    length_penalty 0 up to max_length characters, then −(length − max_length)/max_length, down to −1
"""

from __future__ import annotations

import re
import threading

import attrs

import rllab

from .tasks.files import reward_contains, reward_exact, reward_numeric


def text_of(completion) -> str:
    """The text of a completion as TRL passes it: a string, or the last message's content."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


@attrs.frozen
class NumericConfig:
    """Knobs of the numeric reward."""

    tolerance: float = rllab.knob(1e-6, help="|x − y| ≤ tolerance·max(1, |y|)", ge=0.0)


def exact(*, completions, ground_truth, config, **columns) -> list[float]:
    """1.0 iff the stripped completion equals the stripped reference answer."""
    return [reward_exact(str(a), text_of(c), 0.0) for c, a in zip(completions, ground_truth)]


def contains(*, completions, ground_truth, config, **columns) -> list[float]:
    """1.0 iff the stripped reference answer occurs in the completion."""
    return [reward_contains(str(a), text_of(c), 0.0) for c, a in zip(completions, ground_truth)]


def numeric(*, completions, ground_truth, config: NumericConfig, **columns) -> list[float]:
    """1.0 iff the first number in the completion is within tolerance of the numeric answer."""
    return [reward_numeric(str(a), text_of(c), config.tolerance) for c, a in zip(completions, ground_truth)]


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise rllab.MissingExtraError(
            "the math_verify reward needs the math-verify package: pip install 'rllab[math]'"
        ) from None
    return math_verify


def _math_timeout() -> int | None:
    """math-verify's own time limit (5 s) where it can have one: it sets it with signal.alarm, which
    only the main thread may do. Elsewhere (asynchronous rollouts score in a thread of their own) it
    runs without one, as TRL's math reward does, rather than failing every row."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def _gold(mv, answer: str, timeout: int | None):
    """The parsed reference: as written, else as a LaTeX formula (so '\\frac12' parses too)."""
    gold = mv.parse(answer, parsing_timeout=timeout)
    return gold if gold else mv.parse(f"${answer}$", parsing_timeout=timeout)


def math_verify(*, completions, ground_truth, config, **columns) -> list[float]:
    """1.0 iff math-verify finds the completion's final answer (boxed or plain) equal to the answer."""
    mv = _math_verify()
    timeout = _math_timeout()
    out = []
    for c, a in zip(completions, ground_truth):
        gold = _gold(mv, str(a), timeout)
        answer = mv.parse(text_of(c), parsing_timeout=timeout)
        out.append(1.0 if gold and answer and mv.verify(gold, answer, timeout_seconds=timeout) else 0.0)
    return out


@attrs.frozen
class FormatConfig:
    """Knobs of the format reward."""

    pattern: str = rllab.knob(
        r"<think>.*?</think>\s*<answer>.*?</answer>",
        help="a Python regular expression (DOTALL) the completion must match",
    )
    full: bool = rllab.knob(True, help="the whole stripped completion must match (False: anywhere in it)")

    def __attrs_post_init__(self):
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"pattern = {self.pattern!r} is not a regular expression: {e}") from None


def format_reward(*, completions, config: FormatConfig, **columns) -> list[float]:
    """1.0 iff the completion matches the pattern (default <think>…</think><answer>…</answer>)."""
    rx = re.compile(config.pattern, re.DOTALL)
    match = rx.fullmatch if config.full else rx.search
    return [1.0 if match(text_of(c).strip()) else 0.0 for c in completions]


@attrs.frozen
class LengthPenaltyConfig:
    """Knobs of the length penalty."""

    max_length: int = rllab.knob(200, help="completions up to this many characters are not penalised", ge=1)


def length_penalty(*, completions, config: LengthPenaltyConfig, **columns) -> list[float]:
    """0 up to max_length characters, then −(length − max_length)/max_length, down to −1."""
    m = config.max_length
    return [-min(1.0, max(0, len(text_of(c)) - m) / m) for c in completions]


SHAPING = ("length_penalty",)
"""Built-in functions that never score 1 (shaping terms): never the component accuracy reads."""


def register(register):
    """Register the built-in reward functions with ``register`` (the hook's callable)."""
    register("exact", exact)
    register("contains", contains)
    register("numeric", numeric, config=NumericConfig)
    register("math_verify", math_verify, aliases=("math",))
    register("format", format_reward, config=FormatConfig)
    register("length_penalty", length_penalty, config=LengthPenaltyConfig)
