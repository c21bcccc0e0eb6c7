"""The built-in prompt samplers (rllab_tasks.samplers.pools): default, difficulty_pool, advantage_gate."""

from __future__ import annotations

import pytest
import torch

from rllab import Lab
from rllab.errors import ConfigError, UnknownComponentError
from rllab.config import load_config
from rllab.types import Example
from rllab_tasks.samplers.pools import DifficultyPool, DifficultyPoolConfig, pool_of


@pytest.fixture(scope="module")
def lab():
    return Lab()


def numbered(n, rng):
    """A source whose draw is ``n`` prompts numbered by the generator (deterministic given its state)."""
    return [Example(prompt=f"p{i}", answer="") for i in torch.randint(0, 10**9, (n,), generator=rng).tolist()]


def test_pools_by_latest_mean_reward_at_the_thresholds_by_hand():
    c = DifficultyPoolConfig()  # hard ≤ 0.25 < normal ≤ 0.75 < easy
    means = [None, 0.0, 0.25, 0.2500001, 0.5, 0.75, 0.7500001, 1.0]
    assert [pool_of(m, c) for m in means] == ["normal", "hard", "hard", "normal", "normal", "normal", "easy", "easy"]
    s = DifficultyPool(config=DifficultyPoolConfig(pool_size=len(means)))
    s.means = means
    assert s.weights().tolist() == [1.0, 0.2, 0.2, 1.0, 1.0, 1.0, 0.2, 0.2]
    assert s.counts() == {"hard": 2, "normal": 4, "easy": 2}
    custom = DifficultyPoolConfig(pool_size=3, hard_threshold=0.1, easy_threshold=0.9, hard_weight=0.0, easy_weight=3.0)
    s = DifficultyPool(config=custom)
    s.means = [0.1, 0.9, 0.95]
    assert s.weights().tolist() == [0.0, 1.0, 3.0]


def test_a_step_draws_from_the_pool_by_pool_weight(lab):
    s = lab.get("sampler", "difficulty_pool", pool_size=3)()
    first = s.draw(n=3, rng=torch.Generator().manual_seed(0), step=1, source=numbered)
    assert len({e.prompt for e in first}) == 3  # without replacement: the whole pool, each once
    pool = list(s._pool)
    assert sorted(e.prompt for e in first) == sorted(e.prompt for e in pool)
    # feedback: pool[0] always solved (easy, 0.2), pool[1] half (normal, 1.0), pool[2] never (hard, 0.2)
    s.feedback(step=1, examples=pool, rewards=[1.0, 0.5, 0.0])
    assert s.metrics()["sampler/pool_easy"] == 1 and s.metrics()["sampler/pool_hard"] == 1
    counts = {e.prompt: 0 for e in pool}
    rng = torch.Generator().manual_seed(1)
    for step in range(2, 3002):
        counts[s.draw(n=1, rng=rng, step=step, source=numbered)[0].prompt] += 1
    # P(normal) = 1.0 / (0.2 + 1.0 + 0.2) = 5/7, P(easy) = P(hard) = 1/7; within 5 standard errors
    for ex, p in zip(pool, (1 / 7, 5 / 7, 1 / 7)):
        assert abs(counts[ex.prompt] / 3000 - p) < 5 * (p * (1 - p) / 3000) ** 0.5, (ex.prompt, counts)
    assert s.metrics()["sampler/drawn_hard"] + s.metrics()["sampler/drawn_normal"] + s.metrics()["sampler/drawn_easy"] == 1


def test_a_prompt_whose_samples_all_failed_keeps_its_pool_and_unknown_prompts_are_ignored(lab):
    s = lab.get("sampler", "difficulty_pool", pool_size=2)()
    pool = s.draw(n=2, rng=torch.Generator().manual_seed(0), step=1, source=numbered)
    s.feedback(step=1, examples=pool, rewards=[0.0, 1.0])
    s.feedback(step=2, examples=[pool[0], Example(prompt="not in the pool", answer="")], rewards=[None, 0.5])
    at = [e.prompt for e in s._pool].index(pool[0].prompt)  # its place in the pool (a draw is in weighted order)
    assert s.means[at] == 0.0 and pool_of(s.means[at], s.config) == "hard"
    assert s.metrics()["sampler/pool_seen"] == 2


def test_the_pool_state_resumes_exactly(lab):
    def run(steps, sampler, rng):
        out = []
        for step in steps:
            drawn = sampler.draw(n=2, rng=rng, step=step, source=numbered)
            sampler.feedback(step=step, examples=drawn, rewards=[float(len(e.prompt) % 3) / 2 for e in drawn])
            out.append([e.prompt for e in drawn])
        return out

    a = lab.get("sampler", "difficulty_pool", pool_size=5)()
    rng = torch.Generator().manual_seed(3)
    whole = run(range(1, 9), a, rng)
    b = lab.get("sampler", "difficulty_pool", pool_size=5)()
    rng = torch.Generator().manual_seed(3)
    head = run(range(1, 5), b, rng)
    state = b.state_dict()
    c = lab.get("sampler", "difficulty_pool", pool_size=5)()  # a new process: the pool is drawn again from its seed
    c.load_state_dict(state)
    assert head + run(range(5, 9), c, rng) == whole
    d = lab.get("sampler", "difficulty_pool", pool_size=6)()
    with pytest.raises(ValueError, match="pool_size=5"):
        d.load_state_dict(state)


def test_the_default_sampler_is_the_tasks_own_draw(lab):
    task = lab.get("task", "addition")()
    sampler = lab.get("sampler", "default")()
    for seed in (0, 7):
        mine = sampler.draw(n=16, rng=torch.Generator().manual_seed(seed), step=1, source=task.train_examples)
        theirs = task.train_examples(16, torch.Generator().manual_seed(seed))
        assert [(e.prompt, e.answer) for e in mine] == [(e.prompt, e.answer) for e in theirs]
    assert lab.spec("sampler", "default").trait("stateless") is True


@pytest.mark.parametrize(
    "knobs, words",
    [
        ({"hard_weight": -0.5}, ["difficulty_pool", "hard_weight", "-0.5", "0.0"]),
        ({"easy_weight": float("nan")}, ["difficulty_pool", "easy_weight", "nan"]),
        ({"hard_threshold": 0.8, "easy_threshold": 0.5}, ["difficulty_pool", "hard_threshold = 0.8", "easy_threshold = 0.5", "in order"]),
        ({"hard_weight": 0.0, "normal_weight": 0.0, "easy_weight": 0.0}, ["difficulty_pool", "all 0"]),
        ({"hard_threshold": float("nan")}, ["difficulty_pool", "hard_threshold = nan", "finite"]),
        ({"pool_size": 0}, ["difficulty_pool", "pool_size", "0"]),
    ],
)
def test_bad_pool_knobs_are_refused_naming_the_sampler_and_value(lab, knobs, words):
    with pytest.raises(ConfigError) as e:
        lab.get("sampler", "difficulty_pool", **knobs)
    for w in words:
        assert w in str(e.value)


def test_bad_gate_knob_and_unknown_sampler_are_refused(lab):
    with pytest.raises(ConfigError, match="advantage_gate.*max_retries"):
        lab.get("sampler", "advantage_gate", max_retries=0)
    with pytest.raises(UnknownComponentError) as e:
        Lab().get("sampler", "difficulty")
    assert "Known sampler names: advantage_gate, default, difficulty_pool" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["sampler=difficulty"])
    assert "[sampler] name" in str(e.value) and "Did you mean 'difficulty_pool'?" in str(e.value)


def test_a_sampler_section_from_the_command_line_and_its_knobs():
    cfg = load_config(None, ["sampler=difficulty_pool", "sampler.pool_size=32"])
    assert cfg.component("sampler").name == "difficulty_pool" and cfg.component("sampler").config.pool_size == 32
    assert load_config(None, []).component("sampler").name == "default"
    with pytest.raises(ConfigError, match="difficulty_pool.*has no knob 'pool'"):
        load_config(None, ["sampler=difficulty_pool", "sampler.pool=32"])
