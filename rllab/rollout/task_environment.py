"""The episode source of a run: its environment, or its task as an environment of one turn.

:func:`episode_source` builds it once, before the rollout stage, so that every rollout goes
through the episode loop (:mod:`rllab.rollout.episodes`) over one source. A single-turn task is wrapped
as :class:`TaskEnvironment`, whose step scores the model's answer with :mod:`rllab.rollout.scoring`.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from rllab.rollout.accuracy import correct_component, solved_rule, solver
from rllab.rollout.environment import Step
from rllab.rollout.episodes import EpisodeLimits
from rllab.errors import ConfigError, RllabError
from rllab.members import member
from rllab.rollout.scoring import TaskScorer
from rllab.types import Example


class _TaskEpisode:
    """The one-turn episode of a task's example: its step scores the turn with the task's reward."""

    def __init__(self, adapter: "TaskEnvironment", example: Example):
        self.adapter = adapter
        self.example = example

    def step(self, text: str) -> Step:
        return self.adapter.step_batch([self], [text], completion_ids=None)[0]

    def __getstate__(self) -> dict:
        """A finished episode pickles without its task (a checkpoint's batches sampled ahead)."""
        return {"adapter": None, "example": self.example}


class TaskEnvironment:
    """A single-turn task as an environment of one turn.

    Its step scores the model's turn with the task's reward (:meth:`rllab.rollout.scoring.TaskScorer.rows`:
    the task's ``reward_batch`` when it defines one, each row alone when that call fails, reward
    components checked and weighted), and ends the episode; its reward components are the step's
    ``score``.
    """

    max_turns = 1

    def __init__(self, task: Any, scorer: TaskScorer):
        self.task = task
        self.scorer = scorer

    def train_examples(self, n, rng):
        return self.task.train_examples(n, rng)

    def eval_examples(self):
        return self.task.eval_examples()

    def start(self, example: Example) -> _TaskEpisode:
        return _TaskEpisode(self, example)

    def demonstration(self, example: Example) -> list[str]:
        return [self.task.demonstration(example)]

    def solved(self, example: Example, reward: float, components: Sequence[float] | None = None) -> bool:
        from rllab.rollout.accuracy import is_solved

        return is_solved(self.task, example, reward, components)

    def step_batch(self, episodes: Sequence[_TaskEpisode], texts: Sequence[str], *, completion_ids) -> list:
        rows = self.scorer.rows([e.example for e in episodes], texts, completion_ids)
        out = []
        for ep, row in zip(episodes, rows):
            if isinstance(row, BaseException):
                out.append(row)
                continue
            reward, score = row
            out.append(Step(reward=reward, done=True, score=score))
        return out

    def describe_error(self, example: Example, text: str | None, turn: int, e: BaseException) -> str:
        return self.scorer.error_message(example, text, e)


@attrs.frozen(kw_only=True, eq=False)
class EpisodeSource:
    """What a run's episodes are played on, built once by :func:`episode_source`.

    ``env`` is what the episode loop plays: the run's environment, or its task wrapped as a
    :class:`TaskEnvironment`. The rest is what the rollout stage reads of it, declared here once.
    """

    env: Any
    """The environment the episode loop plays."""
    name: str
    """The task's or environment's registered name (for messages)."""
    kind: str
    """``"task"`` or ``"environment"`` (for messages)."""
    limits: EpisodeLimits
    """Its episodes' limits."""
    judge: Any
    """Whose notion of solved counts (:mod:`rllab.rollout.accuracy`): the task, or the environment."""
    task: Any = None
    """The task of a task source (its examples and demonstrations for offline pairs); None for an environment."""
    scorer: TaskScorer | None = None
    """The task's scorer (reward components and weights); None: the environment rewards its steps."""
    multi_turn: bool = False
    """Whether its episodes are an environment's, which may take several turns: a step then
    reports the episode metrics (``env/*``) and an evaluation ``eval/turns``."""

    @property
    def component_names(self) -> tuple[str, ...]:
        """The reward component names (empty for a single-reward task and for an environment)."""
        return () if self.scorer is None else self.scorer.names

    def component_weights(self) -> list[float]:
        """w_k of the scalar reward Σ_k w_k·r_k (:meth:`rllab.rollout.scoring.TaskScorer.weights`)."""
        return [] if self.scorer is None else self.scorer.weights()

    def solver(self):
        """The source's notion of solved, resolved now (:func:`rllab.rollout.accuracy.solver`)."""
        return solver(self.judge)

    @property
    def solved_rule(self) -> str:
        """What counts as solved, in words (a run's header, ``final.json``)."""
        return solved_rule(self.judge, kind=self.kind)


def episode_source(*, task: Any = None, env: Any = None, name: str = "?", config: Any, tokenizer: Any = None,
                   context_tokens: int | None = None) -> EpisodeSource:
    """The run's :class:`EpisodeSource`: ``env`` with the ``[rollout]`` episode limits (``config``)
    and the model's context (``context_tokens``: an episode that would outgrow it ends with
    "overflow"), or ``task`` as an environment of one turn (its answers scored by
    :class:`rllab.rollout.scoring.TaskScorer`; ``tokenizer`` tokenizes an answer given as text only)."""
    if (task is None) == (env is None):
        raise RllabError("an episode source is a task or an environment (env=), exactly one")
    r = config
    if task is not None:
        correct_component(task, who=f"task {name!r}")  # an unknown name is refused before any sampling
        scorer = TaskScorer(task, name=name, tokenizer=tokenizer)
        return EpisodeSource(
            env=TaskEnvironment(task, scorer), name=name, kind="task", judge=task, task=task, scorer=scorer,
            limits=EpisodeLimits(max_turns=1, max_new_tokens=r.max_new_tokens),
        )
    turns = getattr(r, "max_turns", None)
    if turns is None:
        turns = member(env, "environment", "max_turns")
        if turns is None or isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ConfigError(
                f"environment {name!r} has max_turns = {turns!r}: an episode needs a bound on its turns; give "
                f"the environment an integer max_turns ≥ 1 or set rollout.max_turns",
                key="max_turns",
            )
    limits = EpisodeLimits(
        max_turns=turns, max_new_tokens=r.max_new_tokens, max_episode_tokens=getattr(r, "max_episode_tokens", None),
        turn_limit_reward=getattr(r, "turn_limit_reward", 0.0), overflow_reward=getattr(r, "overflow_reward", 0.0),
        context_tokens=context_tokens,
    )
    return EpisodeSource(env=env, name=name, kind="environment", judge=env, limits=limits, multi_turn=True)


__all__ = ["EpisodeSource", "TaskEnvironment", "episode_source"]
