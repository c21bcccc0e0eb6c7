"""One source of episodes: reward components, the sampler's gate and feedback, and the prompt limits
work alike for a multi-turn environment and for a task (its one-turn subclass, rllab.SingleTurn)."""

from __future__ import annotations

import attrs
import pytest
import torch

import rllab
from rllab.errors import EpisodeError
from rllab.rollout.environment import Step
from rllab.rollout.prompt_limits import PromptLimits
from rllab.rollout.stage import build_stage
from rllab.settings import RolloutConfig
from rllab.types import Example

from .test_accuracy_and_failures import Echo, Task, char  # noqa: F401  (char: a fixture)
from .test_sampling import Alternating, Sequence, one


class Twice(rllab.Environment):
    """Two turns: the first is rewarded 1 when the answer is "1" (components: that, and a "polite"
    component of 0.5 on every episode), the second ends the episode with reward 0."""

    max_turns = 2
    reward_components = ("correct", "polite")
    reward_weights = (1.0, 2.0)

    def __init__(self, score_size: int = 2):
        self.score_size = score_size

    def train_examples(self, n, rng):
        return [Example(prompt=f"q{i}", answer="1") for i in range(n)]

    def eval_examples(self):
        return self.train_examples(2, None)

    def start(self, example):
        env, turn = self, [0]

        class Episode:
            def step(self, text):
                turn[0] += 1
                if turn[0] == 1:
                    return Step(observation=" ok ", reward=float(text.strip() == "1"))
                correct = 0.0  # the first turn's reward is the episode's correctness; the last step gives the components
                return Step(reward=0.0, done=True, score=(correct, 0.5)[: env.score_size])

        return Episode()

    def demonstration(self, example):
        return ["1", "1"]


def test_an_environment_declares_reward_components_its_steps_score(char):  # noqa: F811
    stage = build_stage(env=Twice(), env_name="twice", backend=Echo(char, "1"), tokenizer=char, seed=0,
                        config=RolloutConfig(prompts_per_step=2, group_size=2))
    assert stage.component_names == ("correct", "polite") and stage.component_weights() == [1.0, 2.0]
    r = stage.sample(1)
    assert r.metrics["reward/correct"] == 0.0 and r.metrics["reward/polite"] == 0.5
    assert r.metrics["env/turns"] == 2.0 and r.metrics["rollout/reward"] == 1.0
    batch = stage.to_batch(r)
    assert batch.reward_components.tolist() == [[0.0, 0.5]] * 4
    assert batch.reward_component_names == ("correct", "polite") and batch.reward_component_weights == (1.0, 2.0)
    # a step whose score has another number of values than the components declared fails, naming them
    bad = build_stage(env=Twice(score_size=1), env_name="twice", backend=Echo(char, "1"), tokenizer=char, seed=0,
                      config=RolloutConfig(prompts_per_step=2, group_size=2))
    with pytest.raises(EpisodeError, match=r"score has 1 values; the environment's reward_components are \('correct', 'polite'\)"):
        bad.sample(1)


class Flip(rllab.Environment):
    """Two turns: the first answer is rewarded 1 when it is "1", the second ends the episode."""

    max_turns = 2

    def train_examples(self, n, rng):
        return [Example(prompt=f"x{i}", answer="1") for i in range(n)]

    def eval_examples(self):
        return self.train_examples(1, None)

    def start(self, example):
        turn = [0]

        class Episode:
            def step(self, text):
                turn[0] += 1
                return Step(observation=" ok ", reward=one(example, text)) if turn[0] == 1 else Step(done=True)

        return Episode()

    def demonstration(self, example):
        return ["1", "1"]


@pytest.mark.parametrize("source", ["task", "environment"])
def test_the_samplers_gate_and_feedback_work_alike_on_a_task_and_on_a_multi_turn_environment(char, source):  # noqa: F811
    s = Sequence(["f0", "v1", "f2", "f3", "v4", "v5"])
    given = {"task": Task(one)} if source == "task" else {"env": Flip(), "env_name": "flip"}
    stage = build_stage(**given, task_name="t", backend=Alternating(char), tokenizer=char, seed=0, sampler=s, sampler_name="seq",
                        gate_retries=2, config=RolloutConfig(prompts_per_step=3, group_size=2))
    r = stage.sample(1)
    # round 1: f3 into f0's place (still flat), v4 into f2's; round 2: v5 into f0's
    assert [e.prompt for e in r.examples] == ["v5", "v1", "v4"]
    m = r.metrics
    assert (m["sampler/gate_flat"], m["sampler/gate_replaced"], m["sampler/gate_left"]) == (2, 2, 0)
    assert m["rollout/groups_all_equal"] == 0 and m["rollout/reward"] == 0.5 and m["sampler/left"] == 0
    assert s.fed == [(["v5", "v1", "v4", "f3", "v4", "v5"], [0.5, 0.5, 0.5, 1.0, 0.5, 0.5])]
    assert ("env/turns" in m) == (source == "environment")  # an environment's episodes are counted by their turns


class Long(Flip):
    """Flip, one prompt in four of its draws 40 characters long."""

    def train_examples(self, n, rng):
        k = torch.randint(0, 4, (n,), generator=rng).tolist()
        return [Example(prompt=("y" * 40 if j == 0 else "") + f"x{i}", answer="1") for i, j in enumerate(k)]


@pytest.mark.parametrize("source", ["task", "environment"])
def test_the_prompt_limits_filter_the_draw_the_sampler_sees_on_a_task_and_on_an_environment(char, source):  # noqa: F811
    if source == "task":
        class LongTask(Task):
            def train_examples(self, n, rng):
                return Long().train_examples(n, rng)

        src, given = LongTask(one), {}
    else:
        src, given = Long(), {"env_name": "long"}
    cfg = RolloutConfig(prompts_per_step=4, group_size=2, max_prompt_tokens=20, max_new_tokens=4)
    limits = PromptLimits(src, tokenizer=char, rollout=cfg, context_tokens=64, name="long").check(cfg)
    seen = []

    class Passing(rllab.Sampler):
        def draw(self, *, n, rng, step, source):
            out = source(n, rng)
            seen.append([e.prompt for e in out])
            return out

    stage = build_stage(**{"task" if source == "task" else "env": src}, **given, task_name="long", backend=Echo(char, "1"),
                        tokenizer=char, seed=0, sampler=Passing(), sampler_name="passing", config=cfg, prompt_limits=limits,
                        context_tokens=64)
    r = stage.sample(3)
    assert len(r.examples) == 4 and all(len(p) < 20 for p in seen[0]) and seen[0] == [e.prompt for e in r.examples]
    raw = [e.prompt for e in src.train_examples(4, torch.Generator().manual_seed(0))]
    drawn = [e.prompt for e in stage.draw(3, 4, torch.Generator().manual_seed(0))]
    assert any(len(p) > 20 for p in raw) and len(drawn) == 4 and not any(len(p) > 20 for p in drawn)
    assert [p for p in raw if len(p) < 20] == drawn[: sum(len(p) < 20 for p in raw)]  # the kept ones, in order, then redraws


class OneGuess(rllab.Environment):
    """An environment of one turn (not a task): "1" scores 2.0; "boom" makes its step raise."""

    def train_examples(self, n, rng):
        return [Example(prompt=f"g{i}", answer="1") for i in range(n)]

    def eval_examples(self):
        return self.train_examples(1, None)

    def start(self, example):
        class Episode:
            def step(self, text):
                if text.strip() == "boom":
                    raise ValueError("no")
                return Step(reward=2.0 if text.strip() == "1" else 0.0, done=True)

        return Episode()

    def demonstration(self, example):
        return ["1"]


def test_completions_sampled_apart_are_scored_as_one_turn_episodes_and_refused_for_several_turns(char):  # noqa: F811
    from rllab.errors import RewardError

    examples = [Example(prompt="g0", answer="1"), Example(prompt="g1", answer="1")]
    for reward_errors, expected in (("zero", ([2.0, 0.0], [True, True], 1)), ("skip", ([2.0, 0.0], [True, False], 1))):
        stage = build_stage(env=OneGuess(), env_name="one", backend=Echo(char, "1"), tokenizer=char, seed=0,
                            config=RolloutConfig(reward_errors=reward_errors))
        good = stage.generate(examples[:1], stage.sampling_params(0, n=1))[0]
        bad = attrs.evolve(Echo(char, "boom").generate([stage.encode("g1")], stage.sampling_params(0, n=1))[0], prompt_index=1)
        assert stage.score(examples, [good, bad]) == expected
    stage = build_stage(env=OneGuess(), env_name="one", backend=Echo(char, "boom"), tokenizer=char, seed=0, config=RolloutConfig())
    with pytest.raises(RewardError, match=r"environment 'one' failed: ValueError\('no'\)"):
        stage.score(examples[:1], stage.generate(examples[:1], stage.sampling_params(0, n=1)))
    two = build_stage(env=Twice(), env_name="twice", backend=Echo(char, "1"), tokenizer=char, seed=0, config=RolloutConfig())
    with pytest.raises(Exception, match=r"environment 'twice' plays episodes of up to 2 turns: a completion sampled apart"):
        two.score(examples[:1], two.generate(examples[:1], two.sampling_params(0, n=1)))


def test_what_a_source_is_is_asked_once_and_its_labels_and_errors_follow(char):  # noqa: F811
    from rllab.errors import RewardError
    from rllab.rollout.episode_stats import check_step
    from rllab.rollout.episodes import EpisodeLimits
    from rllab.rollout.single_turn import ENVIRONMENT, TASK, SingleTurn, kind_of, playable

    task, env = Task(), Twice()
    assert kind_of(task) is TASK and kind_of(env) is ENVIRONMENT
    assert (TASK.name, TASK.failure, TASK.culprit, TASK.one_response) == ("task", RewardError, "reward function", True)
    assert (ENVIRONMENT.name, ENVIRONMENT.failure, ENVIRONMENT.one_response) == ("environment", EpisodeError, False)
    assert playable(env, name="twice") is env  # an environment as it is
    played = playable(task, name="t")  # a task of the protocol alone, as a SingleTurn scored by its rubric named "t"
    assert isinstance(played, SingleTurn) and played.rubric.name == "t"
    stage = build_stage(env=env, env_name="twice", backend=Echo(char), tokenizer=char, seed=0, config=RolloutConfig())
    assert stage.source_kind is ENVIRONMENT and stage.kind == "environment" and stage.env is env

    @attrs.frozen
    class Failed:
        error: str = "boom."
        finish_reason: str = "stop"

    # the error class and the fix are the caller's (the source's kind), not derived from the label
    with pytest.raises(EpisodeError, match=r"environment 'twice' is broken.*boom\. Fix the environment \(run"):
        check_step([Failed()] * 2, kind="environment", name="twice", policy="skip", limits=EpisodeLimits(max_turns=2),
                   failure=ENVIRONMENT.failure, culprit=ENVIRONMENT.culprit)
    with pytest.raises(RewardError, match=r"task 't' is broken.*Fix the reward function") as e:
        check_step([Failed()] * 2, kind="task", name="t", policy="zero", limits=None)  # the defaults: a task's
    assert type(e.value) is RewardError
