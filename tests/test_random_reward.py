"""The spurious-rewards control (``rollout.random_reward``) and the rollout's length-by-outcome metrics.

A random reward replaces each training sample's reward by a Bernoulli(p) draw seeded by
(seed, step, prompt, sample) alone; accuracy (rollout and held-out) still scores the task's own
reward; an environment's episode gets the draw alone, in place of every turn's reward; what it
cannot replace (reward components, offline DPO's pairs) is refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from rllab.config import load_config
from rllab.errors import ConfigError
from rllab.rollout.phases import lengths_by_outcome
from rllab.rollout.rewards import random_rewards
from rllab.rollout.stage import build_stage
from rllab.settings import RolloutConfig

from .test_accuracy_and_failures import Echo, Task, char  # noqa: F401  (char: a fixture)


def _u(seed, step, i, j):
    return np.random.default_rng([seed, step, i, j]).random()


def test_random_rewards_draw_one_bernoulli_per_sample_at_its_threshold():
    u = _u(3, 7, 1, 0)
    # a draw is 1 exactly when its uniform is below p: just above the threshold it is 1, at it 0
    assert random_rewards(3, 7, [1], u) == [0.0]
    assert random_rewards(3, 7, [1], min(1.0, u + 1e-12)) == [1.0]
    assert random_rewards(3, 7, [0, 0, 1, 1], 0.0) == [0.0] * 4
    assert random_rewards(3, 7, [0, 0, 1, 1], 1.0) == [1.0] * 4
    with pytest.raises(ValueError, match="p = 1.5"):
        random_rewards(0, 0, [0], 1.5)


def test_random_rewards_depend_on_seed_step_prompt_and_sample_alone():
    prompt_major = random_rewards(0, 5, [0, 0, 0, 1, 1, 1], 0.5)
    # the same samples listed in another order draw the same values (sample j of prompt i)
    interleaved = random_rewards(0, 5, [0, 1, 0, 1, 0, 1], 0.5)
    assert interleaved == [prompt_major[k] for k in (0, 3, 1, 4, 2, 5)]
    many = [random_rewards(s, 1, [0] * 64, 0.5) for s in range(4)]
    assert len({tuple(m) for m in many}) == 4  # another seed, other draws
    assert random_rewards(0, 1, [0] * 64, 0.5) != random_rewards(0, 2, [0] * 64, 0.5)  # another step too
    draws = random_rewards(1, 1, list(range(4000)), 0.3)
    assert abs(np.mean(draws) - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 4000)  # Bernoulli(0.3): within 4 standard errors


def _five(ex, text):
    """1 when the completion is the answer: the Echo backend answers "5", right only for 4+1=."""
    return 1.0 if text.strip() == ex.answer else 0.0


def test_a_given_random_reward_trains_on_the_draws_and_counts_the_true_accuracy(char):  # noqa: F811
    s = build_stage(task=Task(_five), task_name="t", backend=Echo(char), tokenizer=char, seed=4,
                     config=RolloutConfig(prompts_per_step=8, group_size=4, random_reward="given", random_reward_p=0.5))
    scored = s.sample(3)
    index = [c.prompt_index for c in scored.completions]
    expected = random_rewards(4, 3, index, 0.5)
    assert scored.rewards().tolist() == expected and s.to_batch(scored).rewards.tolist() == expected
    m = scored.metrics
    assert m["rollout/reward"] == pytest.approx(sum(expected) / 32)
    assert m["rollout/accuracy"] == pytest.approx(4 / 32)  # prompt 4+1= only, all four samples: the true score
    assert m["rollout/true_reward"] == pytest.approx(4 / 32)
    assert 0 < sum(expected) < 32  # not the task's reward (4 ones, all on one prompt)


def test_a_matched_random_reward_draws_at_the_steps_own_success_rate(char):  # noqa: F811
    s = build_stage(task=Task(_five), task_name="t", backend=Echo(char), tokenizer=char, seed=4,
                     config=RolloutConfig(prompts_per_step=8, group_size=4, random_reward="matched"))
    scored = s.sample(3)
    index = [c.prompt_index for c in scored.completions]
    assert scored.rewards().tolist() == random_rewards(4, 3, index, 4 / 32)


def test_without_the_control_the_task_reward_trains_and_no_true_reward_is_logged(char):  # noqa: F811
    s = build_stage(task=Task(_five), task_name="t", backend=Echo(char), tokenizer=char, seed=4,
                     config=RolloutConfig(prompts_per_step=8, group_size=4))
    scored = s.sample(3)
    assert scored.rewards().tolist() == [1.0 if c.prompt_index == 4 else 0.0 for c in scored.completions]
    assert "rollout/true_reward" not in scored.metrics
    assert scored.metrics["rollout/tokens"] == 32 * 2  # "5" and EOS per sample


def test_response_length_of_correct_and_incorrect_samples():
    import torch

    out = lengths_by_outcome(torch.tensor([2.0, 4.0, 6.0, 9.0]), [True, False, True, False])
    assert out == {"rollout/response_length_correct": 4.0, "rollout/response_length_incorrect": 6.5}
    assert lengths_by_outcome(torch.tensor([3.0]), [False]) == {"rollout/response_length_incorrect": 3.0}


def test_what_the_random_reward_cannot_replace_is_refused():
    with pytest.raises(ConfigError, match=r"random_reward_p = 0.3 applies only with random_reward = 'given'"):
        load_config(None, ["rollout.random_reward_p=0.3"])
    with pytest.raises(ConfigError, match=r"random_reward_p = 0.3 applies only.*'matched'"):
        load_config(None, ["rollout.random_reward=matched", "rollout.random_reward_p=0.3"])
    assert load_config(None, ["env=guess", "rollout.random_reward=given"]).rollout.random_reward == "given"  # see below
    with pytest.raises(ConfigError, match=r"random_reward.*'gdpo'.*reward components"):
        load_config(None, ["advantage=gdpo", "task.format_weight=0.1", "rollout.random_reward=given"])
    with pytest.raises(ConfigError, match=r"random_reward.*'remax'.*greedy answer"):
        load_config(None, ["advantage=remax", "rollout.random_reward=given"])
    cfg = load_config(None, ["rollout.random_reward=given", "rollout.random_reward_p=0.25"])
    assert (cfg.rollout.random_reward, cfg.rollout.random_reward_p) == ("given", 0.25)


def test_offline_dpo_refuses_a_random_reward():
    from types import SimpleNamespace

    from rllab import Lab

    algo = Lab().get("algorithm", "dpo")()
    ctx = SimpleNamespace(rollout=SimpleNamespace(config=RolloutConfig(random_reward="given")))
    with pytest.raises(ConfigError, match=r"offline DPO.*no effect.*online_dpo"):
        algo.pairs(ctx)


def test_a_multi_component_task_trains_on_the_draw_alone_and_logs_its_true_components(char):  # noqa: F811
    task = Task(lambda ex, text: {"correct": _five(ex, text), "format": 1.0}, reward_components=("correct", "format"))
    s = build_stage(task=task, task_name="t", backend=Echo(char), tokenizer=char, seed=4,
                     config=RolloutConfig(prompts_per_step=8, group_size=4, random_reward="given"))
    scored = s.sample(3)
    assert s.to_batch(scored).reward_components is None  # nothing of the task's reward reaches training
    assert scored.rewards().tolist() == random_rewards(4, 3, [c.prompt_index for c in scored.completions], 0.5)
    assert scored.metrics["reward/correct"] == pytest.approx(4 / 32) and scored.metrics["reward/format"] == 1.0
    assert scored.metrics["rollout/true_reward"] == pytest.approx(1 + 4 / 32)


def test_a_data_parallel_rank_draws_what_one_process_draws_for_its_prompts(char):  # noqa: F811
    def stage():
        return build_stage(task=Task(_five), task_name="t", backend=Echo(char), tokenizer=char, seed=4,
                            config=RolloutConfig(prompts_per_step=8, group_size=4, random_reward="given"))

    whole = stage().sample(3).rewards().tolist()
    second = stage()
    second.shard = (1, 2)  # rank 1 of 2: prompts 4…7 of the step, numbered 0…3 in its own batch
    assert second.sample(3).rewards().tolist() == whole[16:]


class Turns:
    """An environment of three turns whatever is said: rewards 0.5, −0.25 and, on the last, 1 when
    the prompt's number is even (prompts 0, 2, 4, 6 of the 8: their episodes total 1.25, the others 0.25)."""

    max_turns = 3

    def train_examples(self, n, rng):
        from rllab.types import Example

        return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

    def eval_examples(self):
        return self.train_examples(2, None)

    def start(self, example):
        from rllab.rollout.environment import Step

        even, turn = int(example.prompt.split("+")[0]) % 2 == 0, [0]

        class Episode:
            def step(self, text):
                turn[0] += 1
                if turn[0] < 3:
                    return Step(observation=" again ", reward=0.5 if turn[0] == 1 else -0.25)
                return Step(reward=1.0 if even else 0.0, done=True)

        return Episode()

    def demonstration(self, example):
        return ["1"]


def test_an_environments_episodes_train_on_the_draw_alone_at_its_solved_rate(char):  # noqa: F811
    import torch

    for mode in ("given", "matched"):
        s = build_stage(env=Turns(), env_name="turns", backend=Echo(char), tokenizer=char, seed=4,
                         config=RolloutConfig(prompts_per_step=8, group_size=4, random_reward=mode))
        scored = s.sample(2)
        m = scored.metrics
        assert all(e.turns == 3 for e in scored.episodes)
        assert m["rollout/true_reward"] == pytest.approx((4 * 1.25 + 4 * 0.25) / 8)  # the true score still counts
        solved = m["rollout/accuracy"]
        assert 0 < solved < 1
        index = [c.prompt_index for c in scored.completions]
        draws = random_rewards(4, 2, index, 0.5 if mode == "given" else solved)  # matched: the solved fraction
        assert scored.rewards().tolist() == draws
        # every turn's reward replaced: each row's token rewards hold its draw alone, on one token
        placed = s.to_batch(scored).token_rewards
        assert torch.allclose(placed.sum(-1), torch.tensor(draws))
        assert int((placed != 0).sum()) == int(sum(draws))
