"""A third-party environment exactly as docs/environments.md taught it in the release before the
layout moved rllab.environment (its imports unchanged): it must still load, with a warning.

The file below this docstring is examples/retry_env.py of that release.
"""
from __future__ import annotations

import attrs
import torch

import rllab
from rllab.environment import Step
from rllab.types import Example


@attrs.frozen
class RetryConfig:
    """Knobs of retry_addition."""

    tries: int = rllab.knob(2, help="model turns an episode may take (its max_turns)", ge=1, le=8)
    later: float = rllab.knob(0.5, help="reward of a right answer after the first turn", ge=0.0, le=1.0)
    digits: int = rllab.knob(1, help="digits of each operand", ge=1, le=4)


class RetryEpisode:
    def __init__(self, env: "RetryAddition", example: Example):
        self.env, self.answer, self.turn = env, example.answer, 0

    def step(self, text: str) -> Step:
        self.turn += 1
        if text.strip() == self.answer:
            return Step(reward=1.0 if self.turn == 1 else self.env.config.later, done=True, metrics={"right": 1.0})
        return Step(observation=" no, ", reward=0.0, metrics={"wrong": 1.0})


class RetryAddition:
    """Addition with retries: a wrong answer is told so and may try again."""

    def __init__(self, config: RetryConfig):
        self.config = config
        self.max_turns = config.tries

    def _example(self, a: int, b: int) -> Example:
        return Example(prompt=f"{a}+{b}=", answer=str(a + b))

    def _draw(self, n: int, rng: torch.Generator) -> list[tuple[int, int]]:
        hi = 10 ** self.config.digits
        pairs = torch.randint(0, hi, (n, 2), generator=rng).tolist()
        return [(a, b) for a, b in pairs]

    def train_examples(self, n: int, rng: torch.Generator) -> list[Example]:
        out = []
        while len(out) < n:  # held-out pairs (3a + b ≡ 0 mod 7) never train
            out += [self._example(a, b) for a, b in self._draw(n, rng) if (3 * a + b) % 7 and len(out) < n]
        return out[:n]

    def eval_examples(self) -> list[Example]:
        hi = 10 ** self.config.digits
        return [self._example(a, b) for a in range(hi) for b in range(hi) if (3 * a + b) % 7 == 0][:64]

    def start(self, example: Example) -> RetryEpisode:
        return RetryEpisode(self, example)

    def demonstration(self, example: Example) -> list[str]:
        return [example.answer]

    def solved(self, example: Example, reward: float) -> bool:
        return reward > 0


@rllab.hookimpl
def register_environments(register):
    register("retry_addition", RetryAddition, config=RetryConfig)
