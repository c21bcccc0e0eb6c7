"""The reasoning_gym_curriculum sampler (rllab_tasks.samplers.curriculum): levels raised by the step's mean reward."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("reasoning_gym")

from rllab import Lab  # noqa: E402
from rllab.errors import SamplerSourceError  # noqa: E402
from rllab.types import Example  # noqa: E402


@pytest.fixture(scope="module")
def lab():
    return Lab()


@pytest.fixture(scope="module")
def task(lab):
    return lab.get("task", "reasoning_gym", dataset="chain_sum", options='{"max_terms": 2}', eval_size=20)()


def terms(e: Example) -> int:
    return e.meta["entry"]["metadata"]["num_terms"]


def test_levels_rise_in_turn_once_the_window_reaches_promote_at(lab, task):
    s = lab.get("sampler", "reasoning_gym_curriculum", window=2, promote_at=0.75)()
    rng = torch.Generator().manual_seed(0)
    first = s.draw(n=8, rng=rng, step=1, source=task.train_examples)
    assert len(first) == 8 and {terms(e) for e in first} == {2}  # the lowest level: 2 terms, 1 digit
    assert s.metrics() == {"sampler/level_num_terms": 0.0, "sampler/level_num_digits": 0.0}
    s.feedback(step=1, examples=first, rewards=[1.0] * 8)
    s.feedback(step=2, examples=first, rewards=[0.5] * 7 + [None])  # window mean 0.75: promote num_terms
    assert s.levels == {"num_terms": 1, "num_digits": 0} and s.metrics().get("sampler/window_reward") is None
    harder = s.draw(n=64, rng=rng, step=3, source=task.train_examples)
    assert {terms(e) for e in harder} == {2, 3}  # level 1: 2 to 3 terms
    s.feedback(step=3, examples=harder, rewards=[1.0] * 64)
    s.feedback(step=4, examples=harder, rewards=[0.4] * 64)  # window mean 0.7 < 0.75: no promotion
    assert s.levels == {"num_terms": 1, "num_digits": 0} and s.metrics()["sampler/window_reward"] == pytest.approx(0.7)
    s.feedback(step=5, examples=harder, rewards=[1.0] * 64)  # window (0.4, 1.0): 0.7 still
    assert s.levels == {"num_terms": 1, "num_digits": 0}
    s.feedback(step=6, examples=harder, rewards=[0.9] * 64)  # window (1.0, 0.9): promote the next attribute
    assert s.levels == {"num_terms": 1, "num_digits": 1}
    held_out = {e.prompt for e in task.eval_examples()}
    assert not held_out & {e.prompt for e in s.draw(n=256, rng=rng, step=6, source=task.train_examples)}


def test_the_curriculum_resumes_exactly(lab, task):
    def run(s, steps, rng):
        out = []
        for step in steps:
            drawn = s.draw(n=4, rng=rng, step=step, source=task.train_examples)
            s.feedback(step=step, examples=drawn, rewards=[1.0] * 4)
            out.append([e.prompt for e in drawn])
        return out

    whole = run(lab.get("sampler", "reasoning_gym_curriculum", window=1)(), range(1, 7), torch.Generator().manual_seed(2))
    a, rng = lab.get("sampler", "reasoning_gym_curriculum", window=1)(), torch.Generator().manual_seed(2)
    head = run(a, range(1, 4), rng)
    b = lab.get("sampler", "reasoning_gym_curriculum", window=1)()
    b.load_state_dict(a.state_dict())
    assert b.levels == a.levels and sum(b.levels.values()) == 3
    assert head + run(b, range(4, 7), rng) == whole


def test_what_the_curriculum_cannot_serve_is_refused(lab, task):
    with pytest.raises(SamplerSourceError, match="use task = \"reasoning_gym\""):
        lab.get("sampler", "reasoning_gym_curriculum")().draw(
            n=2, rng=torch.Generator(), step=1, source=lab.get("task", "addition")().train_examples)
    with pytest.raises(ValueError, match=r"attributes = \['terms'\].*its attributes: num_terms, num_digits"):
        lab.get("sampler", "reasoning_gym_curriculum", attributes="terms")().draw(
            n=2, rng=torch.Generator(), step=1, source=task.train_examples)
