"""``rollout.mask_truncated``: a cut-off completion stays in its group but none of its tokens is trained on."""

from __future__ import annotations

import pytest
import torch

from rllab.settings import RolloutConfig
from tests.test_episodes import Env, Scripted


@pytest.fixture(scope="module")
def char():
    from rllab.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _stage(char, turns, *, mask, max_turns=1, done_at=1, max_new_tokens=3):
    from rllab.rollout.stage import build_stage

    env = Env(max_turns=max_turns, rewards=(0.25, 1.0)[:max(done_at, 1)] + (0.0,) * 2, done_at=done_at)
    return build_stage(env=env, env_name="fake", backend=Scripted(turns), tokenizer=char, seed=0,
                       config=RolloutConfig(prompts_per_step=1, group_size=4, max_new_tokens=max_new_tokens, mask_truncated=mask))


def test_a_truncated_completion_is_in_its_group_but_not_in_the_loss(char):
    eos = char.eos_token_id
    a, b = char("12", add_special_tokens=False).input_ids[:1], char("7", add_special_tokens=False).input_ids[:1]
    # rows 0 and 2 stop (end of sequence); rows 1 and 3 run into max_new_tokens = 3
    answers = [[a[0], eos], [a[0]] * 3, [b[0], b[0], eos], [b[0]] * 5]
    off = _stage(char, [answers], mask=False)
    on = _stage(char, [answers], mask=True)
    rollouts_off, rollouts_on = off.sample(0), on.sample(0)
    assert [e.finish_reason for e in rollouts_on.episodes] == ["stop", "length", "stop", "length"]
    assert rollouts_on.metrics["rollout/truncated_frac"] == 0.5
    plain, masked = off.to_batch(rollouts_off), on.to_batch(rollouts_on)
    # every row is kept, with its reward (the group's baseline is unchanged)
    assert masked.input_ids.shape == plain.input_ids.shape and torch.equal(masked.rewards, plain.rewards)
    assert masked.response_mask.sum(-1).tolist() == [2, 0, 3, 0]
    assert plain.response_mask.sum(-1).tolist() == [2, 3, 3, 3]
    assert torch.equal(masked.attention_mask, plain.attention_mask)


def test_an_episode_whose_last_turn_is_cut_off_is_masked_whole(char):
    eos = char.eos_token_id
    x = char("5", add_special_tokens=False).input_ids[0]
    # two turns each; episode 1's second turn runs into the cap, the others stop
    first = [[x, eos]] * 4
    second = [[x, eos], [x] * 4, [x, eos], [x, eos]]
    stage = _stage(char, [first, second], mask=True, max_turns=2, done_at=2)
    rollouts = stage.sample(0)
    assert [e.finish_reason for e in rollouts.episodes] == ["stop", "length", "stop", "stop"]
    batch = stage.to_batch(rollouts)
    assert batch.turns.tolist() == [2] * 4
    lens = batch.response_mask.sum(-1).tolist()
    assert lens[1] == 0 and all(n > 0 for i, n in enumerate(lens) if i != 1)  # both of its turns left out
