"""Built-in environments the tiny model learns: ``calculator``, ``search`` and ``guess``.

Each follows :class:`rllab.rollout.environment.Environment`; transcripts (string prompts, the tiny
character-level model's; ``⏎`` is a newline, ``|`` the end of a model turn)::

    calculator  "123*45="  <calc(123*45)>|  5535⏎  5535|          reward 1 for the product
    search      "pin of kqz?"  <find(kqz,pin)>|  417⏎  417|      reward 1 for the stored value
    guess       "guess 1-16:"  8|  higher⏎  12|  lower⏎  10|      +1 for the secret, -turn_cost per miss

Tool calls use the compact format of :mod:`rllab.rollout.tools` (``<name(arguments)>``; the hermes
``<tool_call>{...}</tool_call>`` form is read too); a malformed call gets an error observation,
or ends the episode with ``failed_parse_reward`` when that is set. A turn without a call is the
answer: the episode ends there.

What the warm start is shown
----------------------------
The demonstrations are played through the environment itself: its observations are the
environment's own answers. ``calculator`` and ``search`` call the tool with operands copied
from the prompt, then copy the tool's result — the skill is calling and reading, and the answer
is only ever in an observation (the demonstration never shows an answer the model could not
read off its context). ``guess`` plays binary search: each guess follows from the feedback so
far, the secret is never shown. As with the single-turn tasks, the warm start stops early
(``warm_start_defaults``: the first probe with 50% greedy accuracy), so RL has the rest to
learn; the rollouts sample at temperature 0.5 (``rollout_defaults``), because at 1.0 the
barely warm-started model's multi-character turns almost never come out exact.

Held-out split
--------------
``calculator`` and ``search`` hold out prompts by the salted hash of :mod:`rllab_tasks.split`;
``search`` draws each example's store (names and values) at random, so no answer can be
memorised. ``guess`` has one prompt: its evaluation plays every secret once (a greedy policy
is a fixed function of the feedback, so that is its exact success rate), and training draws
secrets uniformly.
"""

from __future__ import annotations

import string
from typing import Awaitable

import attrs
import torch

import rllab
from rllab.rollout.environment import Step
from rllab.rollout.tools import Tool, format_tool_call, tool_step
from rllab.types import Example

from ..tasks.arithmetic import evaluate_countdown
from ..split import SplitTask, eval_fraction_knob, eval_size_knob, seed_knob

TOOL_FORMATS = ("compact", "hermes")
OBSERVATION_WRAP = "{}\n"
"""Tool results end with a newline, so the model sees where the observation stops."""


def _failed_parse_reward_knob():
    return rllab.knob(
        None,
        help="a malformed tool call ends the episode with this reward (None: an error observation, the episode goes on)",
        optional=True,
        ge=-10.0,
        le=10.0,
    )


def _terse_errors_knob():
    return rllab.knob(
        True, help="error observations name the kind of error only (a few tokens of the tiny model's context); false: the full message"
    )


def _max_turns_knob(default: int, help: str):
    return rllab.knob(default, help=help, ge=1, le=32)


class _ToolEnvironment(SplitTask, rllab.Environment):
    """A split of examples whose episodes call the environment's tools and then answer.

    Subclasses define ``draw``, ``tools_for(example)`` and ``demonstration``; the answer turn
    scores 1.0 when it equals ``example.answer`` (stripped), else 0.0, and ends the episode.
    """

    rollout_defaults = {"max_new_tokens": 16, "temperature": 0.5}
    """A turn holds a call of up to 15 characters and its end token. Sampled at 0.5: the
    warm-started tiny model's per-character distribution is flat, and at 1.0 a 20-character
    episode almost never comes out exact (rollout accuracy 0 at a greedy accuracy of 52%, so
    GRPO had nothing to learn from). A config's own settings win."""
    warm_start_defaults = {"target_accuracy": 0.5, "check_every": 2}
    """Copying operands and results is learnt suddenly (greedy accuracy jumps from ~5% to ~75%
    within a few warm-start steps); stopping at the first probe ≥ 50% lands on the jump."""

    def __init__(self, config):
        super().__init__(config)
        self.max_turns = config.max_turns

    def tools_for(self, example: Example) -> list[Tool]:
        raise TypeError(f"{type(self).__name__} must define tools_for(example)")

    def start(self, example: Example) -> "ToolEpisode":
        return ToolEpisode(example, self.tools_for(example), self.config)

    def solved(self, example: Example, reward: float) -> bool:
        return reward >= 1.0


class ToolEpisode:
    """Calls the tools a turn names (:func:`rllab.rollout.tools.tool_step`); a turn without a call is the
    answer, scored by exact match and ending the episode."""

    def __init__(self, example: Example, tools: list[Tool], config):
        self.example = example
        self.tools = tools
        self.config = config

    def step(self, text: str) -> "Step | Awaitable[Step]":
        step = tool_step(
            text, self.tools, formats=TOOL_FORMATS, failed_parse_reward=self.config.failed_parse_reward,
            wrap=OBSERVATION_WRAP, terse_errors=self.config.terse_errors,
        )
        if step is not None:
            return step
        correct = text.strip() == self.example.answer
        return Step(reward=1.0 if correct else 0.0, done=True)


# --------------------------------------------------------------------------- calculator


@attrs.frozen
class CalculatorConfig:
    """Knobs of the calculator environment."""

    digits_a: int = rllab.knob(3, help="digits of the first factor", ge=1, le=9)
    digits_b: int = rllab.knob(2, help="digits of the second factor", ge=1, le=9)
    tool: bool = rllab.knob(
        True,
        help="expose the calc tool (false: the control — no tool, and the warm start shows the bare answer)",
    )
    max_turns: int = _max_turns_knob(2, "most model turns per episode (2: call, answer)")
    failed_parse_reward: float | None = _failed_parse_reward_knob()
    terse_errors: bool = _terse_errors_knob()
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


def calculate(expression: str) -> int:
    """Evaluate an expression of non-negative integers with + - * and parentheses."""
    result = evaluate_countdown(expression)
    if result is None:
        raise ValueError(f"cannot evaluate {expression!r}: integers, + - * and parentheses only")
    return result[0]


CALC = Tool(
    name="calc",
    function=calculate,
    description="Evaluate an arithmetic expression of integers with + - * and parentheses.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 123*45"}},
        "required": ["expression"],
    },
)


class CalculatorEnvironment(_ToolEnvironment):
    """Products the tiny model cannot compute unaided: ``"123*45="``; it calls ``calc`` and
    answers the result. Reward 1.0 for the exact product, else 0.0."""

    name = "calculator"

    def draw(self, gen, k):
        c = self.config
        a = _uniform_digits(gen, c.digits_a, k)
        b = _uniform_digits(gen, c.digits_b, k)
        return [Example(prompt=f"{x}*{y}=", answer=str(x * y), meta={"a": x, "b": y}) for x, y in zip(a, b)]

    @property
    def tools(self) -> list[Tool]:
        return [CALC] if self.config.tool else []

    def tools_for(self, example):
        return self.tools

    def demonstration(self, example):
        if not self.config.tool:
            return [example.answer]
        return [format_tool_call("calc", [f"{example.meta['a']}*{example.meta['b']}"]), example.answer]


def _uniform_digits(gen, digits: int, k: int) -> list[int]:
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits
    return torch.randint(lo, hi, (k,), generator=gen).tolist()


# --------------------------------------------------------------------------- search

ATTRIBUTES = ("pin", "age", "zip", "lot", "row", "bay")


@attrs.frozen
class SearchConfig:
    """Knobs of the search environment."""

    names: int = rllab.knob(3, help="entities in each example's store (random 3-letter names)", ge=1, le=20)
    attributes: int = rllab.knob(
        3, help=f"attributes per entity, the first of {', '.join(ATTRIBUTES)}", ge=1, le=len(ATTRIBUTES)
    )
    value_digits: int = rllab.knob(3, help="digits of each stored value (drawn at random per example)", ge=1, le=9)
    max_turns: int = _max_turns_knob(2, "most model turns per episode (2: query, answer)")
    failed_parse_reward: float | None = _failed_parse_reward_knob()
    terse_errors: bool = _terse_errors_knob()
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


class SearchEnvironment(_ToolEnvironment):
    """A question whose answer sits in a key–value store only a tool reads: ``"pin of kqz?"``;
    ``find(name, attribute)`` returns the stored value (or ``no entry``). Every example draws
    its own store — ``names`` random names × ``attributes`` attributes, random values — so the
    answer cannot be memorised and a query for another entity or attribute returns a
    distractor. Reward 1.0 for the asked value, else 0.0."""

    name = "search"

    def draw(self, gen, k):
        c = self.config
        letters = string.ascii_lowercase
        attrs_ = ATTRIBUTES[: c.attributes]
        out = []
        for _ in range(k):
            names: list[str] = []
            while len(names) < c.names:
                idx = torch.randint(0, len(letters), (3,), generator=gen).tolist()
                name = "".join(letters[i] for i in idx)
                if name not in names:
                    names.append(name)
            values = _uniform_digits(gen, c.value_digits, len(names) * len(attrs_))
            store = {f"{n} {a}": str(values[i * len(attrs_) + j]) for i, n in enumerate(names) for j, a in enumerate(attrs_)}
            who = names[int(torch.randint(0, len(names), (1,), generator=gen))]
            what = attrs_[int(torch.randint(0, len(attrs_), (1,), generator=gen))]
            out.append(Example(prompt=f"{what} of {who}?", answer=store[f"{who} {what}"], meta={"store": store, "name": who, "attribute": what}))
        return out

    @property
    def tools(self) -> list[Tool]:
        """The tool as listed (its function needs an example's store: see :meth:`tools_for`)."""
        return [self._find({})]

    def tools_for(self, example):
        return [self._find(example.meta["store"])]

    @staticmethod
    def _find(store: dict) -> Tool:
        def find(name: str, attribute: str) -> str:
            return store.get(f"{name} {attribute}", "no entry")

        return Tool(
            name="find",
            function=find,
            description="Look up an attribute of a named entity in the store.",
            parameters={
                "type": "object",
                "properties": {"name": {"type": "string"}, "attribute": {"type": "string"}},
                "required": ["name", "attribute"],
            },
        )

    def demonstration(self, example):
        m = example.meta
        return [format_tool_call("find", [m["name"], m["attribute"]]), example.answer]


# --------------------------------------------------------------------------- guess


def _check_turn_cost(inst, attribute, value):
    if value * (inst.max_turns - 1) >= 1.0:
        raise ValueError(
            f"turn_cost = {value} with max_turns = {inst.max_turns}: a win on the last turn must still score above 0 "
            f"(need turn_cost·(max_turns − 1) < 1)"
        )


@attrs.frozen
class GuessConfig:
    """Knobs of the guess environment."""

    high: int = rllab.knob(16, help="the secret is uniform in 1..high", ge=2, le=999)
    max_turns: int = _max_turns_knob(5, "guesses allowed (binary search needs ceil(log2(high + 1)))")
    turn_cost: float = rllab.knob(
        0.1, help="reward of each wrong or invalid guess, negated (on its turn)", ge=0.0, validator=_check_turn_cost
    )


class GuessEnvironment(rllab.Environment):
    """Higher/lower: guess a secret in ``1..high`` from feedback. ``"guess 1-16:"`` → ``"8"`` →
    ``"higher"`` → ... A right guess scores +1 and ends the episode; each wrong (or invalid:
    not an integer in range) guess scores ``-turn_cost`` on its turn, so an episode's reward is
    ``1 − turn_cost·(turns − 1)`` when solved — fewer turns, more reward — and
    ``−turn_cost·turns`` when the guesses run out. Solved: the total is above 0."""

    name = "guess"
    warm_start_defaults = {"target_accuracy": 0.5, "check_every": 2}
    rollout_defaults = {"temperature": 0.5}
    """As for the tool environments: stopped at a 25% probe the warm-started model's sampled
    guesses (at 1.0) were nearly all invalid, and rollout accuracy was ~2% at a greedy 25%."""

    def __init__(self, config: GuessConfig):
        self.config = config
        self.max_turns = config.max_turns

    @property
    def prompt(self) -> str:
        return f"guess 1-{self.config.high}:"

    def _example(self, secret: int) -> Example:
        return Example(prompt=self.prompt, answer=str(secret), meta={"secret": secret})

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        return [self._example(s) for s in torch.randint(1, self.config.high + 1, (n,), generator=rng).tolist()]

    def eval_examples(self) -> list[Example]:
        """Every secret once, in order."""
        return [self._example(s) for s in range(1, self.config.high + 1)]

    def start(self, example: Example) -> "GuessEpisode":
        return GuessEpisode(example.meta["secret"], self.config)

    def solved(self, example: Example, reward: float) -> bool:
        return reward > 0.0

    def demonstration(self, example: Example) -> list[str]:
        """Binary search: each guess is the midpoint of the range the feedback leaves."""
        lo, hi, secret, turns = 1, self.config.high, example.meta["secret"], []
        while True:
            guess = (lo + hi) // 2
            turns.append(str(guess))
            if guess == secret:
                return turns
            lo, hi = (guess + 1, hi) if secret > guess else (lo, guess - 1)

    def __repr__(self):
        return f"<environment {self.name!r} {self.config!r}>"


class GuessEpisode:
    """One higher/lower game (see :class:`GuessEnvironment`)."""

    def __init__(self, secret: int, config: GuessConfig):
        self.secret = secret
        self.config = config

    def step(self, text: str) -> Step:
        cost = -self.config.turn_cost
        s = text.strip()
        if not (s.isdigit() and 1 <= int(s) <= self.config.high):
            return Step(observation="invalid\n", reward=cost, metrics={"invalid_guesses": 1})
        guess = int(s)
        if guess == self.secret:
            return Step(reward=1.0, done=True)
        return Step(observation="higher\n" if self.secret > guess else "lower\n", reward=cost)
