"""The one rollout path: a task's rubric on its own (:mod:`rllab.rollout.scoring`), a task as the
one-turn environment the stage plays (:mod:`rllab.rollout.single_turn`), and the batch built from
episodes in one place (:func:`rllab.rollout.stage.episode_batch`)."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch

import rllab
from rllab.rollout.environment import Step
from rllab.rollout.episodes import EpisodeResult
from rllab.errors import RewardError, RllabError
from rllab.rollout.stage import Rollouts, build_stage, episode_batch
from rllab.rollout.phases import AS_ANSWERS
from rllab.rollout.scoring import Rubric
from rllab.rollout.single_turn import SingleTurn, playable
from rllab.settings import RolloutConfig
from rllab.types import Completion, Example

from .test_accuracy_and_failures import char  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]


class TwoParts(rllab.SingleTurn):
    reward_components = ("correct", "format")
    reward_weights = (1.0, 0.25)

    def train_examples(self, n, rng):
        return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

    def eval_examples(self):
        return self.train_examples(2, None)

    def reward(self, example, completion):
        if completion == "boom":
            raise ValueError("no")
        return {"correct": float(completion == example.answer), "format": float(completion.isdigit())}

    def demonstration(self, example):
        return example.answer


def test_the_scorer_weighs_components_and_keeps_a_failure_on_its_row():
    scorer = Rubric(TwoParts(), name="two")
    ex = Example(prompt="1+1=", answer="2")
    rows = scorer.rows([ex, ex, ex], ["2", "x", "boom"], [[1], [2], [3]])
    assert rows[0] == (1.0 + 0.25 * 1.0, [1.0, 1.0])
    assert rows[1] == (0.0, [0.0, 0.0])
    assert isinstance(rows[2], ValueError)
    assert "task 'two' failed on prompt '1+1=' with completion 'boom': ValueError: no." in scorer.error_message(ex, "boom", rows[2])
    bad = TwoParts()
    bad.reward_weights = (1.0,)
    with pytest.raises(RewardError, match=r"reward_weights has 1 entries for its 2 reward components"):
        Rubric(bad, name="two").rows([ex], ["2"], [[1]])



def test_a_reward_or_weight_that_is_not_a_number_is_refused_naming_it():
    """Silently wrong: a rubric returning ``{"correct": "1", ...}`` was read through float() (every
    answer solved); a single reward "0.5" likewise. Unclear message: a weight "x" said only
    "could not convert string to float"."""
    import numpy as np

    ex = Example(prompt="1+1=", answer="2")

    class Says(TwoParts):
        def __init__(self, out):
            self.out = out

        def reward(self, example, completion):
            return self.out

    row = Rubric(Says({"correct": "1", "format": 0.0}), name="two").rows([ex], ["2"], [[1]])[0]
    assert isinstance(row, TypeError) and "returned component 'correct' as str '1', not a number" in str(row)
    single = Says("0.5")
    single.reward_components, single.reward_weights = (), None
    row = Rubric(single, name="one").rows([ex], ["2"], [[1]])[0]
    assert isinstance(row, TypeError) and "returned str '0.5', not a number" in str(row)
    ok = Says({"correct": np.float32(1.0), "format": torch.tensor(0.5)})
    assert Rubric(ok, name="two").rows([ex], ["2"], [[1]])[0] == (1.0 + 0.25 * 0.5, [1.0, 0.5])
    for weights, said in (((1.0, "x"), "holds 'x', not a finite number"), ("1,1", "is not a sequence of 2 numbers"),
                          ((1.0, float("nan")), "holds nan, not a finite number")):
        bad = TwoParts()
        bad.reward_weights = weights
        with pytest.raises(RewardError, match=rf"task 'two': reward_weights = .*{said}"):
            Rubric(bad, name="two").rows([ex], ["2"], [[1]])

def test_scoring_and_the_task_adapter_never_reach_the_rollout_stage():
    import importlib

    for module in ("rllab.rollout.scoring", "rllab.rollout.single_turn"):
        tree = ast.parse(Path(importlib.import_module(module).__file__).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "rllab.rollout.stage" not in imported and "rllab.rollout.asynchronous" not in imported, module


def test_a_task_is_a_one_turn_environment_whose_step_carries_the_rubrics_score(char):  # noqa: F811
    task = TwoParts()
    assert isinstance(task, rllab.Environment) and isinstance(task, rllab.Task) and task.max_turns == 1
    stage = build_stage(task=task, task_name="two", backend=None, tokenizer=char, seed=0, config=RolloutConfig(max_new_tokens=7),
                        context_tokens=64)
    assert stage.env is task and stage.kind == "task" and stage.reporting is AS_ANSWERS
    assert stage.limits.max_turns == 1 and stage.limits.max_new_tokens == 7 and stage.limits.context_tokens == 64
    assert stage.component_names == ("correct", "format") and stage.component_weights() == [1.0, 0.25]
    ex = Example(prompt="2+1=", answer="3")
    episode = task.start(ex)
    (step,) = task.step_batch([episode], ["3"], completion_ids=[[5]])
    assert step == Step(reward=1.25, done=True, score=(1.0, 1.0))
    assert episode.step("3") == step  # alone, as the runner's step would play it
    with pytest.raises(ValueError, match="no"):
        episode.step("boom")
    assert "task 'two' failed on prompt '2+1=' with completion 'boom'" in task.describe_error(ex, "boom", 1, ValueError("no"))
    # a finished episode pickles without its task (a checkpoint's batches sampled ahead)
    again = pickle.loads(pickle.dumps(episode))
    assert again.example == ex and again.env is None
    with pytest.raises(RllabError, match="exactly one"):
        build_stage(task=TwoParts(), env=object(), task_name="x", backend=None, tokenizer=char, seed=0, config=RolloutConfig())


class Protocol:
    """A task of the task protocol alone (no base class): played as a SingleTurn, its own members read."""

    reward_components = ("correct", "format")
    reward_weights = (2.0, 1.0)
    correct_component = "format"

    def train_examples(self, n, rng):
        return [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]

    def eval_examples(self):
        return self.train_examples(1, None)

    def reward(self, example, completion):
        return {"correct": float(completion == example.answer), "format": float(completion.isdigit())}

    def demonstration(self, example):
        return example.answer


def test_a_task_of_the_protocol_alone_is_played_as_a_single_turn_with_its_own_members(char):  # noqa: F811
    task = Protocol()
    env = playable(task, name="proto")
    assert isinstance(env, SingleTurn) and env is not task and env.max_turns == 1
    assert env.reward_components == ("correct", "format") and env.reward_weights == (2.0, 1.0) and env.correct_component == "format"
    assert env.train_examples(2, None) == task.train_examples(2, None) and env.demonstration(Example(prompt="p", answer="4")) == "4"
    (step,) = env.step_batch([env.start(Example(prompt="1+1=", answer="2"))], ["3"], completion_ids=[[1]])
    assert step == Step(reward=1.0, done=True, score=(0.0, 1.0))
    stage = build_stage(task=task, task_name="proto", backend=None, tokenizer=char, seed=0, config=RolloutConfig())
    assert stage.component_weights() == [2.0, 1.0] and stage.solved(Example(prompt="p", answer="9"), 1.0, [0.0, 1.0])
    assert stage.solved_rule == "reward component 'format' ≥ 1 (task.correct_component)"
    # an environment plays as it is
    from .test_random_reward import Turns

    turns = Turns()
    assert playable(turns, name="turns") is turns


def _episode(tokens, rewards, *, turns=1, mask=None, reward=None, shaping=0.0, score=(), index=0):
    c = Completion(prompt_ids=(9,), token_ids=tuple(tokens), log_probs=(0.0,) * len(tokens), finish_reason="stop",
                   model_mask=mask, prompt_index=index)
    return EpisodeResult(example=Example(prompt="p", answer=""), completion=c, token_rewards=tuple(rewards),
                         reward=sum(rewards) if reward is None else reward, turns=turns, score=score, shaping=shaping)


def test_one_turn_rows_get_their_shaped_reward_on_the_last_model_token():
    eps = [_episode([1, 2, 3], [0, 0, 1.0], shaping=-0.5), _episode([4], [0.0], reward=0.0, index=1)]
    batch = episode_batch(eps, pad_token_id=0)
    assert batch.rewards.tolist() == [0.5, 0.0] and batch.index.tolist() == [0, 1] and batch.turns.tolist() == [1, 1]
    assert batch.turn_rewards is None  # the default placement: the row's reward on its last model token
    assert batch.token_rewards.tolist() == [[0.0, 0.0, 0.5], [0.0, 0.0, 0.0]]
    assert batch.scores is batch.rewards  # the former name still reads


def test_a_batch_with_a_multi_turn_row_places_each_turns_reward_and_the_shaping_on_the_last():
    two = _episode([1, 2, 7, 3, 4], [0, 0.25, 0, 0, 1.0], turns=2, mask=(True, True, False, True, True), shaping=-0.5)
    one = _episode([5, 6], [0, 1.0], shaping=-0.25, index=1)
    batch = episode_batch([two, one], pad_token_id=0)
    assert batch.rewards.tolist() == [0.75, 0.75] and batch.turns.tolist() == [2, 1]
    assert batch.token_rewards.tolist() == [[0.0, 0.25, 0.0, 0.0, 0.5], [0.0, 0.75, 0.0, 0.0, 0.0]]
    assert torch.equal(batch.token_rewards.sum(-1), batch.rewards)


def test_components_of_a_failed_episode_are_zeros_and_staleness_rides_along():
    import attrs

    ok = attrs.evolve(_episode([1], [1.0], score=(1.0, 0.5)), staleness=2)
    failed = attrs.evolve(_episode([2], [0.0], score=()), staleness=0)
    batch = episode_batch([ok, failed], pad_token_id=0, component_names=("correct", "format"), component_weights=(1.0, 2.0))
    assert batch.reward_components.tolist() == [[1.0, 0.5], [0.0, 0.0]]
    assert batch.reward_component_weights == (1.0, 2.0) and batch.staleness.tolist() == [2, 0]
    rollouts = Rollouts(examples=[], episodes=[ok, attrs.evolve(failed, keep=False)], metrics={})
    assert rollouts.keep.tolist() == [True, False] and rollouts.rewards().tolist() == [1.0, 0.0]


def test_every_tensor_field_of_a_batch_is_checked_for_its_rows():
    import attrs

    eps = [attrs.evolve(_episode([1, 2], [0, 1.0], score=(1.0, 0.0), index=i), staleness=i) for i in range(2)]
    batch = episode_batch(eps, pad_token_id=0, component_names=("a", "b"), component_weights=(1.0, 1.0))
    tensors = [f.name for f in attrs.fields(type(batch)) if isinstance(getattr(batch, f.name), torch.Tensor)]
    assert {"rewards", "reward_components", "turns", "staleness"} <= set(tensors)
    for name in tensors:
        if name in ("input_ids", "response_mask"):  # their shapes are checked against each other first
            continue
        with pytest.raises(ValueError, match=name):
            attrs.evolve(batch, **{name: getattr(batch, name)[:1]})


def test_offline_dpo_builds_its_pairs_through_the_episode_loop(tmp_path, model_cache):
    """The pairs are those of main's path (generate, then score), from episodes the loop played."""
    from rllab.algorithm import seed_for
    from rllab.config import load_config
    from rllab.training.trainer import Trainer

    from .tiny import TINY, overrides

    cfg = load_config(None, [*overrides(TINY), "train.steps=1", "algorithm.pairs=6"], preset="dpo")
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    try:
        r = tr.rollout
        examples = r.task.train_examples(6, torch.Generator().manual_seed(seed_for(cfg.train.seed, 0, 3)))
        comps = r.generate(examples, r.sampling_params(10**6, n=4))
        rewards, parts, _, _ = r.score_components(examples, comps)
        worst: dict = {}
        for c, s, p in zip(comps, rewards, parts):
            if c.prompt_index not in worst or s < worst[c.prompt_index][0]:
                worst[c.prompt_index] = (s, c, p)
        expected = [(r.encode(e.prompt), r.response_ids(r.task.demonstration(e), prompt=e.prompt), list(worst[i][1].token_ids))
                    for i, e in enumerate(examples) if not r.solved(e, worst[i][0], worst[i][2])]
        played = []
        play = r.play
        r.play = lambda ex, params: played.append(len(ex)) or play(ex, params)
        r.generate = None  # not called: the pairs come from played episodes
        assert expected and tr.algorithm.pairs(tr.context()) == expected and played == [6]
    finally:
        tr.close()


def test_a_recording_with_the_former_field_names_still_replays():
    import attrs
    from rllab_suite.replay import recorded_batch

    two = _episode([1, 2, 7, 3], [0, 0.25, 0, 1.0], turns=2, mask=(True, True, False, True))
    batch = episode_batch([two, _episode([5], [1.0], index=1)], pad_token_id=0)
    fields = {f.name: getattr(batch, f.name) for f in attrs.fields(type(batch))}
    fields["scores"], fields["token_scores"] = fields.pop("rewards"), fields.pop("turn_rewards")
    again = recorded_batch(fields)
    assert torch.equal(again.rewards, batch.rewards) and torch.equal(again.token_rewards, batch.token_rewards)


def test_the_stage_takes_its_source_and_name_and_refuses_the_former_keywords():
    from rllab.rollout.stage import RolloutStage

    with pytest.raises(RllabError, match=r"got task.*RolloutStage\(source, name=...|build_stage"):
        RolloutStage(task=TwoParts(), backend=None, tokenizer=None, config=RolloutConfig(), seed=0)
    with pytest.raises(RllabError, match=r"got none"):
        RolloutStage(backend=None, tokenizer=None, config=RolloutConfig(), seed=0)
