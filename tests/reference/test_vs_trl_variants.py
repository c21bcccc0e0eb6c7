"""rllab's ``vespo`` loss, the off-policy sequence mask and the TRL-style normalisations against
TRL 1.16.0's formulas.

TRL is not importable here (it needs accelerate and datasets), so, as in :mod:`test_vs_trl`, each
expected value is a float64 transcription of what TRL 1.16.0 evaluates, in its order of
operations (``pip download --no-deps trl==1.16.0`` to read them):

* ``GRPOTrainer.get_gamma_weights`` — VESPO's φ(w): ``log w = clamp(Σ_t clamp(log r, ±20)·mask
  [+ Σ_t clamp(log ρ_IS, log 1e-8, 20)], log 1e-8, 20)``, ``φ = exp(λ + k·log w − λ·exp(log w))``
  (non-finite → 0) with (k, λ) by ``A ≥ 0``; per-token loss ``−φ·A·log π``;
* ``GRPOTrainer.get_off_policy_mask`` — keep where ``A ≥ 0`` or the row's mean of
  ``log π_sample − sg(log π)`` over the mask is ≤ δ; the per-token loss is multiplied by it;
* ``GRPOTrainer._compute_loss`` — per-token losses of ``loss_type`` ``grpo``/``dapo``
  (``−min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)``, no log-ratio clamp), ``cispo``
  (``−sg(min(r, ε_high))·A·log π``), ``sapo``; ``dapo``/``vespo``/``cispo`` aggregation
  ``Σ loss·mask / Σ mask`` (one process, no accumulation) — rllab's ``token-mean``.

TRL's advantages are one per row ((B, 1)); rllab's are (B, T) — the inputs here broadcast one
advantage per row, where both agree.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import rllab

RTOL = 1e-5
ATOL = 1e-6


def assert_close(actual, expected, what: str):
    torch.testing.assert_close(
        torch.as_tensor(actual).detach().to(torch.float64),
        torch.as_tensor(expected).detach().to(torch.float64),
        rtol=RTOL,
        atol=ATOL,
        msg=lambda m: f"{what}: rllab vs TRL formula differ\n{m}",
    )


def gen(*salt) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(salt).encode()))


def token_mean(m, k):
    return torch.where(k, m, 0.0).sum() / k.sum().clamp(min=1)


# --------------------------------------------------------------------------- TRL 1.16.0, float64


def trl_gamma_weights(adv, log_ratio, mask, is_ratio, k_pos, lambda_pos, k_neg, lambda_neg):
    lower = math.log(1e-8)
    seq = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    if is_ratio is not None:
        seq = seq + torch.sum(torch.clamp(torch.log(is_ratio), lower, 20.0), dim=-1, keepdim=True)
    log_w = torch.clamp(seq, lower, 20.0)
    w = torch.exp(log_w)
    nonneg = adv >= 0
    k = torch.where(nonneg, k_pos, k_neg)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def trl_off_policy_mask(adv, logp, sampling, mask, delta):
    kl = torch.nan_to_num(sampling - logp.detach(), nan=0.0)
    avg = (kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((adv >= 0) | (avg <= delta)).to(mask.dtype)


def trl_loss(loss_type, logp, old, adv, mask, *, delta=None, sampling=None, is_ratio=None, eps_low=0.2,
             eps_high=0.2, vespo=(2.0, 3.0, 3.0, 2.0), sapo=(1.0, 1.05), level="token"):
    """(B, 1) advantages; mask float. The loss TRL 1.16 computes for ``loss_type``, 'dapo' normalised."""
    if delta is not None:
        opm = trl_off_policy_mask(adv, logp, old if sampling is None else sampling, mask, delta)
    log_ratio = logp - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    if loss_type == "cispo":
        per_token = -torch.clamp(coef_1, max=eps_high).detach() * adv * logp
    elif loss_type == "dapo":
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    elif loss_type == "sapo":
        temps = torch.where(adv > 0, sapo[0], sapo[1])
        per_token = -(torch.sigmoid(temps * (coef_1 - 1)) * 4 / temps) * adv
    elif loss_type == "vespo":
        with torch.no_grad():
            phi = trl_gamma_weights(adv, log_ratio, mask, is_ratio, *vespo)
        per_token = -phi * adv * logp
    if delta is not None:
        per_token = per_token * opm
    if is_ratio is not None and loss_type != "vespo":
        per_token = per_token * is_ratio
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


# --------------------------------------------------------------------------- inputs


def inputs(B, T, seed, spread):
    g = gen("trl-variants", B, T, seed, spread)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(B, T, generator=g) * 3 - 0.01
    logp = old + torch.randn(B, T, generator=g) * spread
    adv = torch.randn(B, 1, generator=g)
    adv[torch.rand(B, 1, generator=g) < 0.15] = 0.0
    rollout = old + torch.randn(B, T, generator=g) * 0.4
    return logp, old, adv, mask, rollout


CASES = [(B, T, seed, spread) for B, T in [(1, 1), (3, 5), (8, 17)] for seed in (0, 1) for spread in (0.05, 0.5)]

# rllab loss -> (TRL loss_type, rllab knobs, TRL kwargs)
LOSSES = {
    "vespo": ("vespo", {}, {}),
    "vespo-sharp": ("vespo", dict(k_pos=4.0, lambda_pos=1.0, k_neg=0.5, lambda_neg=5.0), dict(vespo=(4.0, 1.0, 0.5, 5.0))),
    "ppo_clip": ("dapo", dict(clip_low=0.2, clip_high=0.28, log_ratio_clamp=None), dict(eps_low=0.2, eps_high=0.28)),
    "cispo": ("cispo", dict(clip_high=5.0, log_ratio_clamp=None), dict(eps_high=5.0)),
    "sapo": ("sapo", dict(log_ratio_clamp=None), {}),
    # TRL's GSPO: loss_type "dapo" with importance_sampling_level="sequence"; equal to rllab's
    # (verl's) stop-gradient form in value and gradient when A is one number per row
    "gspo": ("dapo", dict(clip_low=0.2, clip_high=0.3, log_ratio_max=None), dict(eps_low=0.2, eps_high=0.3, level="sequence")),
}


def _compare(variant, *, delta=None, use_rollout=False, with_is=False):
    loss_type, knobs, trl_kw = LOSSES[variant]
    if delta is not None:
        knobs = {**knobs, "off_policy_mask_threshold": delta}
    fn = rllab.Lab().get("policy_loss", variant.split("-")[0], **knobs)
    for B, T, seed, spread in CASES:
        logp, old, adv, mask, rollout = inputs(B, T, seed, spread)
        cid = f"[{B}x{T} seed {seed} spread {spread}]"
        is_ratio = None
        weights = None
        if with_is:  # TRL's token_truncate ratio: 1 on padding; rllab's weights: 0 on padding
            is_ratio = torch.where(mask, torch.clamp(torch.exp(old - rollout), max=3.0), 1.0)
            weights = torch.where(mask, is_ratio, 0.0)
        lp = logp.clone().requires_grad_(True)
        loss, metrics = fn(
            log_prob=lp, old_log_prob=old, advantages=adv.expand(B, T), mask=mask, aggregate=token_mean,
            weights=weights, rollout_log_prob=rollout if use_rollout else None,
        )
        lp64 = logp.double().requires_grad_(True)
        ref = trl_loss(
            loss_type, lp64, old.double(), adv.double(), mask.double(), delta=delta,
            sampling=rollout.double() if use_rollout else None,
            is_ratio=None if is_ratio is None else is_ratio.double(), **trl_kw,
        )
        assert_close(loss, ref, f"{variant} loss {cid}")
        loss.backward()
        ref.backward()
        assert_close(lp.grad, lp64.grad, f"{variant} gradient {cid}")
        if delta is not None:
            assert "actor/off_policy_masked_frac" in metrics


@pytest.mark.parametrize("variant", list(LOSSES))
def test_loss_matches_trl(variant):
    _compare(variant)


@pytest.mark.parametrize("variant", ["vespo", "ppo_clip", "cispo", "sapo", "gspo"])
@pytest.mark.parametrize("delta", [0.01, 0.1])
def test_off_policy_mask_matches_trl(variant, delta):
    """δ small enough that the mask drops some negative-advantage rows (old_log_prob as sampler)."""
    _compare(variant, delta=delta)


@pytest.mark.parametrize("variant", ["vespo", "ppo_clip"])
def test_off_policy_mask_with_rollout_log_prob_matches_trl(variant):
    """With the inference engine's log-probs, TRL (vLLM) measures the drift from them."""
    _compare(variant, delta=0.05, use_rollout=True)


@pytest.mark.parametrize("variant", ["vespo", "vespo-sharp", "ppo_clip"])
def test_importance_weights_match_trl(variant):
    """vespo folds the token IS ratio into w; the other losses multiply it into the loss."""
    _compare(variant, with_is=True)


def test_off_policy_mask_drops_something():
    """The comparisons above exercise the mask: some tokens are dropped, and not all."""
    fn = rllab.Lab().get("policy_loss", "vespo", off_policy_mask_threshold=0.01)
    fracs = []
    for B, T, seed, spread in CASES:
        logp, old, adv, mask, _ = inputs(B, T, seed, spread)
        _, m = fn(log_prob=logp, old_log_prob=old, advantages=adv.expand(B, T), mask=mask, aggregate=token_mean)
        fracs.append(float(m["actor/off_policy_masked_frac"]))
    assert 0 < max(fracs) < 1 and min(fracs) == 0


# --------------------------------------------------------------------------- normalize_then_sum


def trl_normalize_then_sum(rewards_per_func, weights, num_generations):
    """GRPOTrainer._generate_and_score_completions, multi_objective_aggregation='normalize_then_sum'."""
    K = rewards_per_func.shape[1]
    grouped = rewards_per_func.view(-1, num_generations, K)
    mean_k = grouped.mean(dim=1, keepdim=True)
    std_k = grouped.std(dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, K)
    rewards = (reward_k * weights.unsqueeze(0)).sum(dim=1)
    std = rewards.std().expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / (std + 1e-4)


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("weights", [None, "random"])
def test_normalize_then_sum_matches_trl(G, K, weights):
    for seed in range(3):
        g = gen("nts", G, K, seed)
        B, T = 4 * G, 5
        comps = torch.randn(B, K, generator=g)
        comps[:G] = comps[0].clone()  # one group whose rewards are all equal
        w = torch.rand(K, generator=g) + 0.5 if weights else torch.ones(K)
        fn = rllab.Lab().get(
            "advantage_estimator", "normalize_then_sum", reward_weights=tuple(w.tolist()) if weights else None
        )
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < lengths[:, None]
        adv, _ = fn(token_rewards=torch.zeros(B, T), mask=mask, index=torch.arange(B) // G, reward_components=comps)
        ref = trl_normalize_then_sum(comps.double(), w.double(), G)
        assert_close(adv, torch.where(mask, ref[:, None].float(), 0.0), f"normalize_then_sum G={G} K={K} seed {seed}")


# --------------------------------------------------------------------------- loss normalisation


def trl_normalise(loss_type, per_token_loss, mask, max_completion_length):
    """GRPOTrainer._compute_loss's reduction of the per-token loss (one process, no accumulation)."""
    if loss_type in ("grpo", "sapo"):
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "luspo":
        return (per_token_loss * mask).sum(-1).mean()
    raise ValueError(loss_type)


@pytest.mark.parametrize(
    "loss_type, mode, knobs",
    [
        ("grpo", "seq-mean-token-mean", {}),
        ("sapo", "seq-mean-token-mean", {}),
        ("luspo", "seq-mean-token-sum", {}),
        ("dr_grpo", "seq-mean-token-sum-norm", {"horizon": 12}),
    ],
)
def test_count_empty_rows_is_trl_normalisation(loss_type, mode, knobs):
    agg = rllab.Lab().get("loss_aggregation", mode, count_empty_rows=True, **knobs)
    for B, T, seed, _ in CASES:
        g = gen("agg", B, T, seed)
        loss = torch.randn(B, T, generator=g)
        mask = torch.rand(B, T, generator=g) < 0.6
        mask[0] = False  # a fully masked row, which TRL counts
        ours = agg(loss_mat=loss, mask=mask)
        ref = trl_normalise(loss_type, loss.double(), mask.double(), 12)
        assert_close(ours, ref, f"{loss_type} [{B}x{T} seed {seed}]")
