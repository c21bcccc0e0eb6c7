"""Environments: multi-turn episodes, the protocol a plugin's environment follows.

An **environment** draws examples like a task and then plays an episode per sample: the model
answers the opening prompt (``example.prompt``, a string or chat messages), the environment
consumes that turn and answers with a :class:`Step` — an observation to append, a reward for the
turn, and whether the episode is over — and so on until it ends or a limit is reached.

It is modelled on the ``reset``/``step`` shape the field uses (TRL's environments, verifiers,
Tinker's cookbook): :meth:`Environment.start` is ``reset`` for one example, and
:meth:`Episode.step` consumes one decoded model turn. ``step`` may be a coroutine function
(``async def``): the rollout loop awaits every live episode's step together, so a tool that
waits does not stall the batch.

Token-in/token-out: an episode's token ids are the opening prompt's ids, then each turn's sampled
ids (its stop token included), then each observation's ids — never a re-tokenisation of the
decoded transcript. Only the sampled ids are the model's (the loss mask); observation ids are
context. A step's ``reward`` is placed on the last model token of its turn.

Example (a one-guess game)::

    class GuessEpisode:
        def __init__(self, secret):
            self.secret = secret
        def step(self, text):
            if text.strip() == self.secret:
                return Step(reward=1.0, done=True)
            return Step(observation="wrong, again:", reward=0.0)

    class Guess(Environment):       # every optional member not set here keeps its default
        max_turns = 3
        def train_examples(self, n, rng): ...
        def eval_examples(self): ...
        def start(self, example):
            return GuessEpisode(example.answer)
        def demonstration(self, example):
            return ["7", example.answer]
"""

from __future__ import annotations

import abc
import math
import numbers
from typing import Awaitable, Mapping, Protocol, Sequence, runtime_checkable

import attrs

from rllab.errors import NoDemonstrationError
from rllab.members import Structural as _Structural
from rllab.members import with_defaults

OBSERVATION_ROLES = ("user", "tool")
"""The roles an observation may take when the prompt is rendered with a chat template."""


def _finite_reward(inst, attribute, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Step.reward must be a float, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"Step.reward must be finite, got {value!r}")


def _observation(inst, attribute, value):
    if value is not None and not isinstance(value, str):
        raise TypeError(f"Step.observation must be a string or None, got {type(value).__name__} {value!r}")


def _role(inst, attribute, value):
    if value not in OBSERVATION_ROLES:
        raise ValueError(
            f"Step.role = {value!r} is not a role an observation can take; use one of {', '.join(map(repr, OBSERVATION_ROLES))} "
            f"(the model's own turns are the assistant's)"
        )


def _metrics(inst, attribute, value):
    if not isinstance(value, Mapping):
        raise TypeError(f"Step.metrics must be a mapping of name → number, got {type(value).__name__} {value!r}")
    for key, v in value.items():
        if not isinstance(key, str):
            raise TypeError(f"Step.metrics: key {key!r} is a {type(key).__name__}, not a string")
        if not isinstance(v, numbers.Real) and callable(getattr(v, "item", None)) and getattr(v, "ndim", 0) == 0:
            v = v.item()  # a 0-d tensor or array
        if not isinstance(v, numbers.Real):
            raise TypeError(
                f"Step.metrics[{key!r}] = {v!r} is a {type(v).__name__}, not a number; a step's metrics are counts summed "
                f"over a batch's episodes (env/{key})"
            )
        if not math.isfinite(v):
            raise ValueError(f"Step.metrics[{key!r}] = {v!r} must be finite")


@attrs.frozen(kw_only=True)
class Step:
    """What an environment answers to one model turn.

    :param observation: text appended after the model's turn before its next one (None: nothing).
        With a chat prompt it becomes a message of ``role`` rendered with the chat template's own
        tokens for it; with a string prompt it is tokenized and appended as it is. Ignored when
        ``done``.
    :param reward: this turn's reward (finite), placed on the turn's last model token. An
        environment that rewards only at the end returns 0 until its last step.
    :param done: the episode is over.
    :param role: the observation's chat role, ``"user"`` or ``"tool"``.
    :param metrics: counters of this step (``tool_calls``, ``tool_errors``, ``parse_failures``,
        or the environment's own), summed over a batch's episodes into ``env/<name>``.
    :param score: the turn's reward components in their declared order, of which ``reward`` is
        the weighted sum (a task's one-turn episode: ``task.reward_components``); empty: one reward.
    """

    observation: str | None = attrs.field(default=None, validator=_observation)
    reward: float = attrs.field(default=0.0, validator=_finite_reward)
    done: bool = False
    role: str = attrs.field(default="user", validator=_role)
    metrics: Mapping[str, float] = attrs.field(factory=dict, validator=_metrics)
    score: tuple[float, ...] = attrs.field(default=(), converter=lambda v: tuple(float(x) for x in v))


@runtime_checkable
class Episode(Protocol):
    """One episode of an environment, started for one example."""

    def step(self, text: str) -> "Step | Awaitable[Step]":
        """Consume the model's turn (decoded up to its stop token) and answer with a :class:`Step`
        (or an awaitable of one)."""


@with_defaults("environment")
class Environment(_Structural):
    """A source of examples whose episodes span model turns; the base class of environments, and the
    rollout stage's one source of episodes (a task is its one-turn subclass,
    :class:`rllab.rollout.single_turn.SingleTurn`).

    An environment has ``train_examples``, ``eval_examples``, ``start`` and ``demonstration``.
    ``isinstance(obj, Environment)`` holds for any object with those four (duck typing); a
    subclass also inherits the default of every optional member (:data:`rllab.members.MEMBERS`
    ``["environment"]``), which the kernel applies to an object that does not subclass too:

    - ``max_turns`` (int, default 1): the most model turns an episode may take; the
      ``rollout.max_turns`` setting overrides it.
    - ``solved(example, reward) -> bool`` (default None): what counts as solved for
      ``rollout/accuracy`` and ``eval/accuracy``, given the episode's total reward (None: total
      reward ≥ 1).
    - ``describe_error(example, text, turn, error) -> str`` (default None): the message of a
      failed episode (None: the kernel's own).
    - ``step_batch(episodes, texts, *, completion_ids) -> list`` (default None): one :class:`Step`
      (or the exception it raised) per live episode; the rollout loop then calls it once per turn
      instead of each episode's ``step`` (a batched reward model or checker).
    - ``tools`` (default ``()``): the tools the environment exposes (see :mod:`rllab.rollout.tools`), listed
      by ``rllab plugins show NAME``.
    - ``reward_components`` (default ``()``), ``reward_weights`` (default None: all 1),
      ``correct_component`` (default None: the first): the names of the K ≥ 2 reward components
      each :class:`Step`'s ``score`` gives, in order, and their weights; logged as ``reward/<name>``
      and carried by the batch, as a task's (:class:`rllab.rollout.single_turn.SingleTurn`).
    - ``multi_turn`` (default True): its episodes are reported as episodes of turns (``env/*``
      with each step, ``eval/turns`` with each evaluation); a task's are not.
    - ``rollout_defaults`` (on the registered factory, e.g. a class attribute; default ``{}``): a
      dict of ``[rollout]`` settings the environment needs (``{"max_new_tokens": 16}`` for turns
      that hold a tool call), applied to those the config does not set.
    - ``warm_start_defaults`` / ``tiny_model_defaults`` (default ``{}``): dicts of
      ``model.warm_start`` / ``model.tiny`` knobs for the tiny default model
      (``{"max_position_embeddings": 1024}`` for prompts longer than its 256 positions), applied
      to those the config leaves at their defaults.
    """

    _required = ("train_examples", "eval_examples", "start", "demonstration")

    @abc.abstractmethod
    def train_examples(self, n: int, rng) -> list:
        """Draw ``n`` training :class:`rllab.types.Example` s using the ``torch.Generator`` ``rng``
        (deterministic given its state)."""

    @abc.abstractmethod
    def eval_examples(self) -> list:
        """The held-out evaluation split (fixed)."""

    @abc.abstractmethod
    def start(self, example) -> Episode:
        """A fresh episode for ``example``; its opening prompt is ``example.prompt``."""

    def demonstration(self, example) -> Sequence[str]:
        """The model turns of a demonstration episode for the supervised warm start; the
        observations between them are the environment's own answers to them."""
        raise NoDemonstrationError(
            f"{type(self).__name__} has no demonstration(example): the tiny model's supervised warm start needs one; define it, "
            f"or skip the warm start (model.warm_start.steps=0), or train a model of your own (model.path=...)"
        )


def is_environment(source) -> bool:
    """Whether a run's example source is an environment whose steps reward themselves (it starts
    episodes) rather than a task, whose answers its rubric scores (``reward``; a
    :class:`rllab.rollout.single_turn.SingleTurn` starts episodes too)."""
    return callable(getattr(source, "start", None)) and not callable(getattr(source, "reward", None))
