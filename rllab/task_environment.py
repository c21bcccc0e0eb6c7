"""A single-turn task as an environment of one turn, so that every rollout goes through the
episode loop (:mod:`rllab.episodes`)."""

from __future__ import annotations

from typing import Any, Sequence

from rllab.environment import Step
from rllab.types import Example


class _TaskEpisode:
    """The one-turn episode of a task's example: its step scores the turn with the task's reward."""

    def __init__(self, adapter: "TaskEnvironment", example: Example):
        self.adapter = adapter
        self.example = example
        self.components: list[float] = []

    def step(self, text: str) -> Step:
        return self.adapter.step_batch([self], [text], completion_ids=None)[0]


class TaskEnvironment:
    """A single-turn task as an environment of one turn.

    Its step scores the model's turn exactly as the rollout stage always has
    (:meth:`rllab.rollout.RolloutStage.score_rows`: the task's ``reward_batch`` when it defines
    one, each row alone when that call fails, reward components checked and weighted), and
    ends the episode. An episode's reward components are kept on it (``episode.components``).
    """

    max_turns = 1

    def __init__(self, task: Any, stage: Any):
        self.task = task
        self.stage = stage

    def train_examples(self, n, rng):
        return self.task.train_examples(n, rng)

    def eval_examples(self):
        return self.task.eval_examples()

    def start(self, example: Example) -> _TaskEpisode:
        return _TaskEpisode(self, example)

    def demonstration(self, example: Example) -> list[str]:
        return [self.task.demonstration(example)]

    def solved(self, example: Example, reward: float, components: Sequence[float] | None = None) -> bool:
        from rllab.accuracy import is_solved

        return is_solved(self.task, example, reward, components)

    def step_batch(self, episodes: Sequence[_TaskEpisode], texts: Sequence[str], *, completion_ids) -> list:
        rows = self.stage.score_rows([e.example for e in episodes], texts, completion_ids)
        out = []
        for ep, row in zip(episodes, rows):
            if isinstance(row, BaseException):
                out.append(row)
                continue
            reward, ep.components = row
            out.append(Step(reward=reward, done=True))
        return out

    def describe_error(self, example: Example, text: str | None, turn: int, e: BaseException) -> str:
        return self.stage.reward_error_message(example, text, e)
