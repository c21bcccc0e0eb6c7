"""The rollout stage as named phases (draw → play → shape → filter → measure): which shapers,
filters and measures a ``[rollout]`` config chooses, what each does to a step by hand, the episode
loop's own timings, and the one state the run's rollout checkpoints."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from rllab.rollout.stage import build_stage
from rllab.settings import RolloutConfig

from .test_accuracy_and_failures import Echo, Task, char  # noqa: F401  (char: a fixture)

ROOT = Path(__file__).resolve().parents[1]


def _names(steps):
    return [getattr(f, "__name__", "?") for f in steps]


def test_the_shapers_and_filters_are_chosen_from_the_config_once(char):  # noqa: F811
    plain = build_stage(task=Task(), task_name="t", backend=Echo(char), tokenizer=char, seed=0, config=RolloutConfig())
    assert plain.shapers == [] and plain.filters == []  # the default step: nothing shaped, failed samples alone left out
    every = build_stage(task=Task(), task_name="t", backend=Echo(char), tokenizer=char, seed=0, config=RolloutConfig(
        random_reward="given", overlong_buffer=2, max_new_tokens=4, reward_errors="skip", dynamic_sampling=True))
    assert _names(every.shapers) == ["random_reward", "overlong"]
    assert _names(every.filters) == ["skip_failed_groups", "drop_flat_groups"]
    assert len(every.measures) == len(plain.measures) + 1  # rollout/true_reward


def test_a_step_through_the_phases_by_hand(char):  # noqa: F811
    """Prompts 0+1= … 3+1=, 2 samples each, every answer "5" (Echo): only 4+1= would be right, so
    every reward is 0 and each group is flat; prompt 2's reward fails (it raises)."""

    def score(ex, text):
        if ex.prompt == "2+1=":
            raise ValueError("no")
        return 0.0

    cfg = RolloutConfig(prompts_per_step=4, group_size=2, reward_errors="skip", overlong_buffer=1, overlong_penalty=0.5,
                        max_new_tokens=2)
    s = build_stage(task=Task(score), task_name="t", backend=Echo(char), tokenizer=char, seed=0, config=cfg)
    out = s.sample(0)
    # shape: "5" + EOS is 2 model tokens = max_new_tokens, 1 over the 1-token buffer start: −(1/1)·0.5 each
    assert [e.shaping for e in out.episodes] == [-0.5] * 8
    # filter: the failed samples and (skip) their whole group are out; the others stay (no dynamic sampling)
    assert [e.keep for e in out.episodes] == [True, True, True, True, False, False, True, True]
    m = out.metrics
    assert m["rollout/reward_errors"] == 2.0 and m["rollout/kept_frac"] == 6 / 8
    assert m["rollout/score"] == -0.5 and m["rollout/groups_all_equal"] == 4.0
    dropped = build_stage(task=Task(score), task_name="t", backend=Echo(char), tokenizer=char, seed=0,
                          config=RolloutConfig(prompts_per_step=4, group_size=2, reward_errors="zero", dynamic_sampling=True))
    assert dropped.sample(0).metrics["rollout/kept_frac"] == 0.0  # every group flat: DAPO keeps none


def test_the_episode_loop_times_its_own_steps(char):  # noqa: F811
    s = build_stage(task=Task(lambda ex, text: time.sleep(0.05) or 1.0), task_name="t", backend=Echo(char), tokenizer=char,
                    seed=0, config=RolloutConfig(prompts_per_step=2, group_size=2))
    runner = s.runner()
    runner.play(s.draw(0, 2, None), s.sampling_params(0, n=2))
    assert set(runner.timings) >= {"generate", "step", "rollout"}
    assert runner.timings["step"] >= 4 * 0.05  # four answers scored, 50 ms each: the environment's steps
    assert runner.timings["rollout"] < runner.timings["step"]  # the fake backend's sampling is instant
    m = s.sample(0).metrics
    assert m["time/reward"] >= 4 * 0.05 and m["time/rollout"] < m["time/reward"]


def test_the_stage_state_holds_the_sampler_and_the_carried_groups(char):  # noqa: F811
    from rllab.rollout.partial import Carried
    from rllab.types import Example

    class Counting:
        def __init__(self):
            self.seen = 0

        def draw(self, *, n, rng, step, source):
            return source(n, rng)

        def feedback(self, *, step, examples, rewards):
            self.seen += len(examples)

        def state_dict(self):
            return {"seen": self.seen}

        def load_state_dict(self, state):
            self.seen = state["seen"]

    class Until(Echo):
        def generate_until(self, prompts, params, **kw):  # a backend that can stop a batch early (declared, not called)
            raise AssertionError

    cfg = RolloutConfig(prompts_per_step=2, group_size=2, over_sample=1.0, partial="continue")
    s = build_stage(task=Task(), task_name="t", backend=Until(char), tokenizer=char, seed=0, config=cfg, sampler=Counting())
    s.sampler.seen = 7
    s.partial.carried = [Carried(example=Example(prompt="1+1=", answer="2"), rows=[((5,), (-1.0,), (1,), None)] * 2)]
    state = s.state_dict(3)
    assert state == {"sampler": {"seen": 7}, "partial_rollouts": s.partial.state_dict()}
    again = build_stage(task=Task(), task_name="t", backend=Until(char), tokenizer=char, seed=0, config=cfg, sampler=Counting())
    again.load_state_dict(state)
    assert again.sampler.seen == 7 and again.partial.state_dict() == state["partial_rollouts"]
    later = build_stage(task=Task(), task_name="t", backend=Until(char), tokenizer=char, seed=0, config=cfg, sampler=Counting())
    assert s.succeeded_by(later) is later and later.sampler is s.sampler and later.partial.carried == s.partial.carried


def test_the_trainer_names_none_of_the_rollout_state():
    """The sampler, the carried groups and the batches sampled ahead are the run's rollout's: the
    trainer checkpoints them through its one state_dict and checks nothing itself."""
    text = "".join((ROOT / "rllab" / "training" / f).read_text(encoding="utf-8") for f in ("trainer.py", "evaluation.py"))
    for name in (r"\bprefetch\b", r"\.partial\b", r"self\.sampler\b", r"\bsampling\.", r"\brollout_ahead\b", r"partial_rollouts",
                 r"\bcheck_(settings|algorithm|data_parallel|backend_device)\b", r"AsyncRollout", r"VersionedBackend"):
        assert not re.search(name, text), name


def test_what_a_run_may_not_change_mid_run_is_refused_by_the_checks():
    import attrs

    from rllab.checks.config import check_change
    from rllab.config import load_config
    from rllab.errors import RllabError

    ahead = load_config(None, ["rollout.max_staleness=1"])
    check_change(ahead, ahead)
    with pytest.raises(RllabError, match=r"\[rollout\] cannot change during a run with rollout.max_staleness > 0"):
        check_change(ahead, attrs.evolve(ahead, rollout=attrs.evolve(ahead.rollout, temperature=0.5)))
    sync = load_config(None, [])
    check_change(sync, attrs.evolve(sync, rollout=attrs.evolve(sync.rollout, temperature=0.5)))  # sampled each step: it may
    with pytest.raises(RllabError, match="train.seed cannot change during a run"):
        check_change(sync, attrs.evolve(sync, train=attrs.evolve(sync.train, seed=1)))


def test_how_the_episodes_are_reported_is_chosen_once_from_the_multi_turn_trait(char):  # noqa: F811
    """A task's episodes are answers: no env/* measure, no eval/turns, partial rollouts built even
    with rollout.max_turns set; an environment's are episodes of turns (env/*, eval/turns, partial
    rollouts refused), unless it declares multi_turn = False."""
    import torch

    from rllab.errors import RllabError
    from rllab.rollout.partial import PartialRollouts
    from rllab.rollout.phases import AS_ANSWERS, AS_TURNS, StepEpisodes, mean_turns, turn_metrics
    from rllab.rollout.single_turn import SingleTurn

    from .test_one_source import Twice

    class Until(Echo):  # a backend that can stop a batch early (never asked to here)
        def generate_until(self, *args, **kwargs):
            raise AssertionError("not sampled")

    task = build_stage(task=Task(), task_name="t", backend=Until(char), tokenizer=char, seed=0,
                       config=RolloutConfig(over_sample=0.5, max_turns=3))
    assert task.reporting is AS_ANSWERS and isinstance(task.partial, PartialRollouts)
    plain = build_stage(task=Task(), task_name="t", backend=Echo(char), tokenizer=char, seed=0, config=RolloutConfig())
    assert turn_metrics not in plain.measures and "eval/turns" not in plain.evaluate(2)
    env = build_stage(env=Twice(), env_name="twice", backend=Echo(char, "1"), tokenizer=char, seed=0, config=RolloutConfig())
    assert env.reporting is AS_TURNS and turn_metrics in env.measures and env.evaluate(2)["eval/turns"] == 2.0
    with pytest.raises(RllabError, match="environment 'twice' plays episodes of several turns"):
        build_stage(env=Twice(), env_name="twice", backend=Echo(char, "1"), tokenizer=char, seed=0,
                    config=RolloutConfig(over_sample=0.5))

    class Flat(Twice):
        multi_turn = False

    flat = build_stage(env=Flat(), env_name="flat", backend=Until(char, "1"), tokenizer=char, seed=0,
                       config=RolloutConfig(over_sample=0.5))
    assert flat.reporting is AS_ANSWERS and isinstance(flat.partial, PartialRollouts)
    # the random-reward control's base rate: the solved fraction for turns, the reward as played for answers
    s = StepEpisodes(step=0, prompts=1, examples=[])
    s.raw, s.solved = torch.tensor([0.25, 1.5]), torch.tensor([0.0, 1.0])
    assert AS_TURNS.base_rate(s).tolist() == [0.0, 1.0] and AS_ANSWERS.base_rate(s).tolist() == [0.25, 1.5]

    class Played:
        def __init__(self, turns):
            self.turns = turns

    class Ranks:  # two ranks' counts summed: this one's 1 + 3 turns and the other's 2
        def sum(self, x):
            return x + 2.0

    assert mean_turns([Played(1), Played(3)], Ranks(), 3.0) == {"eval/turns": 2.0}
    assert AS_ANSWERS.evaluated([Played(1)], Ranks(), 1.0) == {}
    assert SingleTurn.multi_turn is False
