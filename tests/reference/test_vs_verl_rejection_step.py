"""The ``rl`` step with rejection sampling against verl 0.9.1's pipeline, on the tiny model.

verl (``ray_trainer.fit``): old log-probs → ``compute_rollout_correction_and_add_to_batch``
overwrites ``response_mask`` with the rejection mask → ``compute_advantage`` on that mask → the
actor's loss (``batch_num_tokens`` = the narrowed mask's token count, policy loss, entropy and KL
aggregated on the narrowed mask). rllab's step runs its own ``prepare`` and ``update`` on the
same batch (micro-batched, so the global counts matter) and must give the same loss and the same
parameter gradient. verl 0.9.1 has no per-token veto (``rollout_token_veto_threshold`` of the
earlier releases): the veto case narrows verl's mask by the vetoed rows by hand.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from rllab.config import load_config
from rllab.training.trainer import Trainer

from ..tiny import TINY, overrides
from .test_vs_verl import VERL, assert_close, ca

RC = VERL.rollout_corr
ENT, BETA = 0.01, 0.1


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _trainer(tmp_path, *extra):
    cfg = load_config(
        None,
        [
            *overrides(TINY), "train.steps=1", "rollout.prompts_per_step=3", "rollout.group_size=4",
            "algorithm.micro_batch_size=5", f"algorithm.entropy_coef={ENT}", "algorithm.kl_in=loss", "kl=k3",
            f"kl_controller.kl_coef={BETA}", "policy_loss=ppo_dual_clip", "correction=rejection", *extra,
        ],
    )
    return Trainer(cfg, run_dir=tmp_path, progress=False)


def _batch(tr, old):
    """The step's batch with random scores and rollout log-probs that reject some tokens (a row's
    last token among them), one row whole, and leave one row with a token far below the others."""
    from rllab_algorithms.rl import _logprobs

    batch = tr.rollout.to_batch(tr.rollout.sample(0))
    mask = batch.response_mask
    g = torch.Generator().manual_seed(0)
    B, T = mask.shape
    with torch.no_grad():
        lp = _logprobs(tr.context(), tr.policy, batch)
    shift = torch.randn(B, T, generator=g) * 0.3
    shift[1] = 1.5  # π_rollout ≫ π_train on every token: the whole row goes
    last = mask.sum(-1) - 1
    shift[2, last[2]] = 2.0  # the reward token of row 2 is rejected
    shift[3, 0] = 12.0  # π_train/π_rollout = e^-12 on one token: the veto drops the row
    scores = torch.randn(B, generator=g)
    batch = attrs.evolve(batch, rollout_log_prob=torch.where(mask, lp + shift, 0.0).float(), rewards=scores)
    old.update(lp=lp)
    return batch


def _rllab(tr, batch):
    ctx = tr.context()
    prepared, metrics = tr.algorithm.prepare(ctx, batch)
    gen = tr.algorithm.update(ctx, prepared)
    next(gen)  # the minibatch's backward has run: the trainer would step now
    grads = [p.grad.detach().clone() for p in tr.policy.parameters() if p.requires_grad]
    try:
        gen.send({})
    except StopIteration as stop:
        metrics.update(stop.value.metrics)
    return prepared, grads, metrics


def _verl(tr, batch, prepared, *, veto=None, estimator="grpo"):
    from rllab_algorithms.rl import _logprobs

    mask = batch.response_mask
    old = prepared.old_log_prob
    _, keep, _ = RC.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=batch.rollout_log_prob, response_mask=mask.float(),
        rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0",
    )
    if veto is not None:  # pre-0.9 verl: a row with a token whose ratio is below the threshold is dropped
        vetoed = ((old - batch.rollout_log_prob < np.log(veto)) & mask).any(-1)
        keep = keep * (~vetoed)[:, None].float()
    # verl's estimators see the narrowed mask (GRPO's scores sum every position, so it is blind to it)
    fn = getattr(ca, f"compute_{estimator}_outcome_advantage")
    adv, _ = fn(token_level_rewards=batch.token_rewards, response_mask=keep, index=batch.index.numpy())
    tr.policy.zero_grad(set_to_none=True)
    log_prob, entropy = _logprobs(tr.context(), tr.policy, batch, with_entropy=True)
    n = int(keep.sum())
    cfg = VERL.actor_config(clip_ratio=0.2, clip_ratio_c=3.0, loss_agg_mode="token-mean")
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=n, global_batch_size=None)
    pg, _ = ca.compute_policy_loss_vanilla(old, log_prob, adv, keep, "token-mean", cfg, None)
    ent = ca.agg_loss(entropy, keep, "token-mean", batch_num_tokens=n)
    kl = ca.agg_loss(ca.kl_penalty(log_prob, prepared.ref_log_prob, "low_var_kl"), keep, "token-mean", batch_num_tokens=n)
    total = pg - ENT * ent + BETA * kl
    total.backward()
    grads = [p.grad.detach().clone() for p in tr.policy.parameters() if p.requires_grad]
    return keep.bool(), pg, total, grads


@pytest.mark.parametrize(
    "extra, veto, estimator",
    [
        ([], None, "grpo"),
        (["correction.veto_threshold=1e-4"], 1e-4, "grpo"),
        # verl's order with an estimator that reads the mask (batch whitening over the kept tokens)
        (["correction.narrow_mask=before_advantage", "advantage=reinforce_plus_plus_baseline",
          "advantage.mask_scores=false"], None, "reinforce_plus_plus_baseline"),
        (["correction.narrow_mask=before_advantage", "advantage.mask_scores=false"], None, "grpo"),
    ],
    ids=["after_advantage-grpo", "veto-grpo", "before_advantage-rpp_baseline", "before_advantage-grpo"],
)
def test_rl_step_with_rejection_matches_verl(tmp_path, extra, veto, estimator):
    tr = _trainer(tmp_path, "correction.criterion=token_k1", "correction.upper=2.0", "correction.lower=0.5", *extra)
    batch = _batch(tr, {})
    mask = batch.response_mask
    prepared, grads, metrics = _rllab(tr, batch)
    keep, pg, total, ref_grads = _verl(tr, batch, prepared, veto=veto, estimator=estimator)
    assert torch.equal(prepared.mask, keep), "the step trains on verl's modified_response_mask"
    assert (mask & ~keep).any(-1).sum() >= 2 and (keep.any(-1) & (mask & ~keep).any(-1)).any(), \
        "rows partly and fully rejected"
    assert not keep[1].any() and not keep[2, int(mask[2].sum()) - 1]
    if veto is not None:
        assert not keep[3].any()
    assert_close(metrics["loss/policy"], pg, "policy loss")
    assert_close(metrics["loss/total"], total, "total loss (policy − c_H·entropy + β·KL)", rtol=1e-4)
    for i, (a, b) in enumerate(zip(grads, ref_grads)):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=1e-6, msg=lambda m, i=i: f"parameter {i}: {m}")
    tr.close()


def test_off_keeps_rejected_tokens_in_the_normaliser(tmp_path):
    """``narrow_mask = "off"``: the gradient is verl's scaled by kept/sampled tokens (token-mean),
    the rejected tokens contributing nothing but their count."""
    tr = _trainer(tmp_path, "correction.criterion=token_k1", "correction.upper=2.0", "correction.lower=0.5",
                  "correction.narrow_mask=off", "algorithm.entropy_coef=0", "algorithm.kl_in=none")
    seen = {}
    batch = _batch(tr, seen)
    prepared, grads, metrics = _rllab(tr, batch)
    assert prepared.old_log_prob is None, "nothing to narrow: the on-policy shortcut stays"
    assert torch.equal(prepared.mask, batch.response_mask)
    old = seen["lp"]
    corr = tr.components["correction"]
    keep = corr.trait("keep_mask")(old_log_prob=old, rollout_log_prob=batch.rollout_log_prob, mask=batch.response_mask,
                                   config=corr.config)
    assert (batch.response_mask & ~keep).any()
    tr.policy.zero_grad(set_to_none=True)
    from rllab_algorithms.rl import _logprobs

    adv, _ = ca.compute_grpo_outcome_advantage(batch.token_rewards, batch.response_mask.float(), batch.index.numpy())
    log_prob = _logprobs(tr.context(), tr.policy, batch)
    cfg = VERL.actor_config(clip_ratio=0.2, clip_ratio_c=3.0)
    pg, _ = ca.compute_policy_loss_vanilla(old, log_prob, adv, keep.float(), "token-mean", cfg, None)
    scale = keep.sum() / batch.response_mask.sum()
    assert_close(metrics["loss/policy"], pg * scale, "policy loss over every sampled token")
    tr.close()
