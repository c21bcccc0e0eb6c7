"""Several reward components from the task to the advantage, against verl 0.9.1 and TRL 1.16.

A multi-component task (``addition`` with ``format_weight``) is sampled on the tiny model; the
rollout batch's ``reward_components`` (B, K) reach ``gdpo`` / ``normalize_then_sum`` through the
``rl`` step's ``prepare``, whose advantages must equal verl's ``compute_gdpo_outcome_advantage``
(the components given as its ``gdpo_reward_keys`` columns, as verl's reward manager stores a
``compute_score`` dict) and TRL's ``normalize_then_sum`` (one reward function per component).
The task's reward is wrapped so the second component varies within groups (the tiny model's
completions are nearly always well-formed digits).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from rllab.config import load_config
from rllab.training.trainer import Trainer

from ..tiny import TINY, overrides
from .test_vs_trl_variants import trl_normalize_then_sum
from .test_vs_verl import assert_close, ca


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _sampled(tmp_path, *extra):
    cfg = load_config(
        None,
        [*overrides(TINY), "train.steps=1", "rollout.prompts_per_step=4", "rollout.group_size=4",
         "task.format_weight=0.25", *extra],
    )  # fmt: skip
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    task = tr.rollout.task
    reward = task.reward

    def varied(example, completion):
        out = dict(reward(example, completion))
        out["format"] = out["format"] * (zlib.crc32(f"{example.prompt}|{completion}".encode()) % 5) / 4
        return out

    task.reward = varied
    batch = tr.rollout.to_batch(tr.rollout.sample(0))
    assert batch is not None and batch.reward_component_names == ("correct", "format")
    assert batch.reward_components[:, 1].unique().numel() > 1
    return tr, batch


@pytest.mark.parametrize("weights", [None, (1.0, 0.5)])
def test_gdpo_through_the_rl_step_matches_verl(tmp_path, weights):
    extra = ["advantage=gdpo", "advantage.mask_scores=false"]
    if weights:
        extra.append(f"advantage.reward_weights=[{weights[0]}, {weights[1]}]")
    tr, batch = _sampled(tmp_path, *extra)
    prepared, _ = tr.algorithm.prepare(tr.context(), batch)
    mask = batch.response_mask
    B = mask.shape[0]
    names = list(batch.reward_component_names)
    # no reward_weights knob: the task's (1, format_weight), given to verl explicitly
    cfg = {"gdpo_reward_keys": names, "gdpo_reward_weights": list(weights or (1.0, 0.25))}
    verl_batch = {"prompts": torch.zeros(B, 3), "attention_mask": torch.cat([torch.ones(B, 3, dtype=torch.long), mask.long()], 1)}
    non_tensor = {n: batch.reward_components[:, k].numpy() for k, n in enumerate(names)}
    ref, _ = ca.compute_gdpo_outcome_advantage(
        batch.token_rewards, mask.float(), batch.index.numpy(), config=cfg, non_tensor_batch=non_tensor, batch=verl_batch
    )
    assert_close(prepared.advantages, torch.where(mask, ref, 0.0), f"gdpo advantages (weights {weights})")
    tr.close()


@pytest.mark.parametrize("weights", [None, (1.0, 0.5)])
def test_normalize_then_sum_through_the_rl_step_matches_trl(tmp_path, weights):
    extra = ["advantage=normalize_then_sum"]
    if weights:
        extra.append(f"advantage.reward_weights=[{weights[0]}, {weights[1]}]")
    tr, batch = _sampled(tmp_path, *extra)
    assert torch.equal(batch.index, torch.arange(16) // 4), "TRL's groups are consecutive rows"
    prepared, _ = tr.algorithm.prepare(tr.context(), batch)
    w = torch.tensor(weights or (1.0, 0.25), dtype=torch.float64)  # TRL's one reward_weights: the task's
    ref = trl_normalize_then_sum(batch.reward_components.double(), w, 4)
    mask = batch.response_mask
    assert_close(prepared.advantages, torch.where(mask, ref[:, None].float(), 0.0), f"normalize_then_sum (weights {weights})")
    tr.close()
