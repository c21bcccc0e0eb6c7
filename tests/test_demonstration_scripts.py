"""Demonstration episodes when several examples share a prompt and a first turn."""

from __future__ import annotations

from rllab.rollout.chat import PromptRenderer
from rllab.rollout.environment import Step
from rllab.rollout.demonstrations import demonstration_episodes
from rllab.models.tokenizer import build_tokenizer
from rllab.types import Example


class _Secret:
    """Guess a hidden letter: every example has the same prompt; the hint is the only difference."""

    max_turns = 4

    def start(self, example):
        secret = example.answer

        class Episode:
            def step(self, text):
                if text == secret:
                    return Step(reward=1.0, done=True)
                return Step(observation="no\n")

        return Episode()

    def demonstration(self, example):
        return ["a"] if example.answer == "a" else ["a", example.answer]


def test_examples_with_one_prompt_keep_their_own_scripts_when_one_ends_early():
    tok = build_tokenizer()
    examples = [Example(prompt="guess:", answer=s) for s in ("a", "b", "a", "c")]
    results = demonstration_episodes(_Secret(), examples, PromptRenderer(tok), name="secret")
    assert [r.texts for r in results] == [("a",), ("a", "b"), ("a",), ("a", "c")]
    assert [r.reward for r in results] == [1.0, 1.0, 1.0, 1.0]
