"""``reasoning_gym_retry``: a reasoning-gym data set where the model may retry a wrong answer.

The :class:`~rllab_tasks.tasks.reasoning.ReasoningGymTask`'s examples and scorer, played as an
environment of up to ``max_turns`` answers, each wrong one followed by feedback.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab.rollout.environment import Step
from rllab.types import Example

from ..tasks.reasoning import ReasoningGymConfig, ReasoningGymTask, installed


@attrs.frozen
class ReasoningGymRetryConfig(ReasoningGymConfig):
    """Knobs of the reasoning_gym_retry environment: the reasoning_gym task's, and the retries."""

    max_turns: int = rllab.knob(3, help="answers the model may give (the first and up to max_turns - 1 retries)", ge=1)
    discount: float = rllab.knob(
        1.0, help="the reward of solving on turn k (from 1) is discount**(k-1): 1 rewards any solving turn alike", gt=0.0, le=1.0
    )
    feedback: str = rllab.knob(
        "Incorrect, try again.\n", help="the observation after an answer the data set does not score 1"
    )


class ReasoningGymRetryEpisode:
    """One question: each turn is an answer, scored by the data set; wrong answers get ``feedback``."""

    def __init__(self, env: "ReasoningGymRetryEnvironment", example: Example):
        self.env, self.example, self.turn = env, example, 0

    def step(self, text: str) -> Step:
        self.turn += 1
        cfg = self.env.config
        score = self.env.task.reward(self.example, text)
        if score >= 1.0:
            return Step(reward=cfg.discount ** (self.turn - 1), done=True)
        return Step(observation=cfg.feedback, metrics={"wrong_answers": 1.0})


class ReasoningGymRetryEnvironment(rllab.Environment):
    """A reasoning-gym data set where the model may retry: the :class:`ReasoningGymTask`'s examples
    and scorer, played over up to ``max_turns`` answers.

    Turn ``k`` (from 1) is scored ``s = score_answer(answer=turn.strip(), entry)``. ``s ≥ 1``
    solves the question: the episode ends with reward ``discount**(k-1)`` on that turn. Otherwise
    the turn's reward is 0 and the model reads ``feedback`` and answers again; the episode loop
    ends it unsolved after ``max_turns`` answers (the environment's ``max_turns``, which the run's
    ``rollout.max_turns`` overrides; finish reason ``max_turns``), with total reward 0 (plus the
    run's ``turn_limit_reward``). Partial scores (``0 < s < 1``) earn nothing: only a solving turn is rewarded.
    An episode is solved when its total reward is positive.
    """

    name = "reasoning_gym_retry"

    def __init__(self, config: ReasoningGymRetryConfig):
        self.config = config
        self.max_turns = config.max_turns
        task_config = ReasoningGymConfig(**{f.name: getattr(config, f.name) for f in attrs.fields(ReasoningGymConfig)})
        self.task = ReasoningGymTask(task_config)

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        """The reasoning_gym task's training entries (see :meth:`ReasoningGymTask.train_examples`)."""
        return self.task.train_examples(n, rng)

    def eval_examples(self) -> list[Example]:
        """The reasoning_gym task's held-out entries."""
        return self.task.eval_examples()

    def start(self, example: Example) -> ReasoningGymRetryEpisode:
        return ReasoningGymRetryEpisode(self, example)

    def solved(self, example: Example, reward: float) -> bool:
        """Solved on some turn: only a solving turn earns a (positive) reward."""
        return reward > 0.0

    def demonstration(self, example: Example) -> list[str]:
        """One turn: the entry's reference answer."""
        return [self.task.demonstration(example)]

    def __repr__(self):
        return f"<environment {self.name!r} {self.config!r}>"


def reasoning_gym_retry(*, config: ReasoningGymRetryConfig) -> ReasoningGymRetryEnvironment:
    """A reasoning-gym data set where a wrong answer gets "Incorrect, try again." and another turn."""
    return ReasoningGymRetryEnvironment(config)


reasoning_gym_retry.check_installed = installed
