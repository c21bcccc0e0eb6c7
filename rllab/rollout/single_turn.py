"""A task: an environment of one turn, scored by its rubric.

:class:`SingleTurn` is the one-turn subclass of :class:`rllab.Environment` (``max_turns = 1``),
so the rollout stage has one source of episodes. A task says what it draws (``train_examples``,
``eval_examples``), a correct answer (``demonstration``: the one turn's text) and its **rubric**:
``reward(example, completion)`` — a float, or with ``reward_components`` a mapping name → float —
or ``reward_batch`` for a whole turn at once, and ``reward_weights``. Its episode takes the model's
answer and ends: the step's reward is the rubric's scalar ``Σ_k w_k·r_k``, its ``score`` the
components, which become the batch's reward components (:mod:`rllab.rollout.scoring`).

An object that follows the task protocol (:class:`rllab.types.Task`) without subclassing
:class:`SingleTurn` is played as one too (:func:`playable`); an environment of several turns may
declare ``reward_components`` as well, each :class:`~rllab.rollout.environment.Step`'s ``score``
giving them.

Example::

    class Addition(rllab.SingleTurn):
        reward_components = ("correct", "format")
        reward_weights = (1.0, 0.1)

        def train_examples(self, n, rng): ...
        def eval_examples(self): ...
        def reward(self, example, completion):
            return {"correct": float(completion.strip() == example.answer), "format": 1.0}
        def demonstration(self, example):
            return example.answer
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import attrs

from rllab.errors import EpisodeError, RewardError
from rllab.members import MEMBERS, member
from rllab.rollout.demonstrations import answer_demonstrations, episode_demonstrations, greedy_episodes, greedy_texts
from rllab.rollout.environment import Environment, Step, is_environment
from rllab.rollout.scoring import Rubric
from rllab.types import Example, Task


class Answer:
    """The one-turn episode of a task's example: its step scores the answer with the task's rubric."""

    def __init__(self, env: SingleTurn, example: Example):
        self.env = env
        self.example = example

    def step(self, text: str) -> Step:
        out = self.env.step_batch([self], [text], completion_ids=None)[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def __getstate__(self) -> dict:
        """A finished episode pickles without its task (a checkpoint's batches sampled ahead)."""
        return {"env": None, "example": self.example}


class SingleTurn(Task, Environment):
    """An environment of one turn whose step scores the answer with the task's rubric (see the
    module docstring); the base class of tasks.

    A subclass defines ``train_examples``, ``eval_examples``, ``reward`` and ``demonstration``
    (a correct answer's text), and optionally the rubric's ``reward_components``,
    ``reward_weights``, ``correct_component``, ``reward_batch`` and ``solved``
    (:data:`rllab.members.MEMBERS` ``["task"]``). ``start``, ``step_batch`` and ``describe_error``
    are the rubric's: the episode ends after the model's answer, whose reward is the rubric's.
    """

    max_turns = 1
    multi_turn = False

    def start(self, example: Example) -> Answer:
        return Answer(self, example)

    @property
    def rubric(self) -> Rubric:
        """The rubric that scores this task's answers (named for messages by :func:`playable`)."""
        return self.__dict__.get("_rubric") or Rubric(self, name=type(self).__name__)

    def step_batch(self, episodes: Sequence[Answer], texts: Sequence[str], *, completion_ids) -> list:
        """One :class:`Step` per answer (reward: the rubric's scalar, score: its components; done),
        or the exception its reward raised."""
        rows = self.rubric.rows([e.example for e in episodes], texts, completion_ids)
        return [row if isinstance(row, BaseException) else Step(reward=row[0], done=True, score=row[1]) for row in rows]

    def describe_error(self, example: Example, text: str | None, turn: int, e: BaseException) -> str:
        return self.rubric.error_message(example, text, e)


class _Adopted(SingleTurn):
    """A task that follows the task protocol without subclassing :class:`SingleTurn`, played as
    one: its own members, the rubric's episode."""

    def __init__(self, task: Any):
        self.task = task

    def train_examples(self, n, rng):
        return self.task.train_examples(n, rng)

    def eval_examples(self):
        return self.task.eval_examples()

    def reward(self, example, completion):
        return self.task.reward(example, completion)

    def demonstration(self, example):
        return self.task.demonstration(example)

    def __repr__(self) -> str:
        return repr(self.task)


def _forwarded(name: str) -> property:
    return property(lambda self: member(self.task, "task", name), doc=f"The task's own ``{name}`` (or its default).")


for _name in MEMBERS["task"]:
    setattr(_Adopted, _name, _forwarded(_name))


@attrs.frozen(kw_only=True)
class SourceKind:
    """What a run's source of episodes is, said once when the run is built (:func:`kind_of`), and
    what follows from it: its name in messages, the error a step whose every sample failed raises
    and what to fix then, and whether its episode is one response that must fit after its prompt."""

    name: str
    """``"task"`` or ``"environment"``, in messages."""
    failure: type
    """:class:`~rllab.errors.RewardError` (a task's rubric), :class:`~rllab.errors.EpisodeError` (an environment's steps)."""
    culprit: str
    """What a step whose every sample failed says to fix: ``"reward function"`` or ``"environment"``."""
    one_response: bool
    """Its episode is one response after the prompt (a task): the response's ``rollout.max_new_tokens`` must fit
    in the context with the prompt. An environment's episode loop keeps its episodes within the context itself."""
    play: Callable[..., Environment]
    """``play(source, name=, tokenizer=)``: the environment a run plays over a source of this kind (:func:`playable`)."""
    demonstrations: Callable[..., tuple]
    """``demonstrations(tokenizer, source, examples, renderer)``: the warm start's supervised batch of ``examples``
    (a task's: prompt and ``demonstration`` text; an environment's: its demonstration episodes)."""
    greedy: Callable[..., Any]
    """``greedy(model, tokenizer, source, examples, max_new_tokens, renderer)``: the warm start's probe of a model,
    its greedy answers (a task's: texts, scored afterwards; an environment's: its episodes' solved rate)."""
    cache_marks: Mapping[str, str]
    """Added to the source's config in the warm start's cache key: an environment's model (trained on demonstration
    episodes) is never the one a task of the same name and knobs would have."""


def _as_it_is(source: Any, *, name: str, tokenizer: Any = None) -> Environment:
    """An environment is played as it is."""
    return source


def _one_turn(source: Any, *, name: str, tokenizer: Any = None) -> SingleTurn:
    """A task played as an environment of one turn: a :class:`SingleTurn` itself, an object of the
    task protocol as one, with its rubric named ``name`` in messages."""
    env = source if isinstance(source, SingleTurn) else _Adopted(source)  # the base class, or the task protocol alone
    env._rubric = Rubric(source, name=name, tokenizer=tokenizer)
    return env


TASK = SourceKind(name="task", failure=RewardError, culprit="reward function", one_response=True, play=_one_turn,
                  demonstrations=answer_demonstrations, greedy=greedy_texts, cache_marks={})
ENVIRONMENT = SourceKind(name="environment", failure=EpisodeError, culprit="environment", one_response=False, play=_as_it_is,
                         demonstrations=episode_demonstrations, greedy=greedy_episodes, cache_marks={"kind": "environment"})


def kind_of(source: Any) -> SourceKind:
    """What ``source`` is: :data:`ENVIRONMENT` when its steps reward themselves, :data:`TASK` when a
    rubric scores its answers (a :class:`SingleTurn`, or an object of the task protocol)."""
    return ENVIRONMENT if is_environment(source) else TASK


def playable(source: Any, *, name: str, tokenizer: Any = None) -> Environment:
    """The environment a run plays over ``source``, its run's task or environment: an environment
    as it is; a task (a :class:`SingleTurn`, or an object of the task protocol, played as one) with
    its rubric named ``name`` in messages (``tokenizer`` tokenizes an answer given as text only)."""
    return kind_of(source).play(source, name=name, tokenizer=tokenizer)


__all__ = ["ENVIRONMENT", "TASK", "Answer", "SingleTurn", "SourceKind", "kind_of", "playable"]
