"""Covariance-based policy losses: Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models", https://arxiv.org/abs/2505.22617).

Same signature, ratios, masking and metrics as :mod:`rllab_policy_losses.ppo`, where the
equations and the differences from verl are listed (``clip_cov``, ``kl_cov``).
"""

from __future__ import annotations

import math

import attrs
import torch

import rllab
from rllab import ops

from .ppo import _finish, _frac, _log_ratio_clamp_knob, _prepare, kl_metrics, log_ratio_of


def _covariance(advantages, log_prob, mask):
    """Per-token (A − mean A)·(log π − mean log π) over valid tokens (detached), (B, T)."""
    lp = log_prob.detach()
    return (advantages - ops.masked_mean(advantages, mask)) * (lp - ops.masked_mean(lp, mask))


@attrs.frozen
class ClipCovConfig:
    """Knobs of ``clip_cov`` (defaults from verl's actor config)."""

    clip_low: float = rllab.knob(0.2, help="ε_low of the PPO clip", ge=0.0)
    clip_high: float = rllab.knob(0.2, help="ε_high of the PPO clip", ge=0.0)
    clip_cov_ratio: float = rllab.knob(2e-4, help="share of valid tokens whose gradient is removed", gt=0.0, le=1.0)
    clip_cov_lb: float = rllab.knob(1.0, help="candidates have covariance > clip_cov_lb")
    clip_cov_ub: float = rllab.knob(5.0, help="candidates have covariance < clip_cov_ub")
    seed: int = rllab.knob(0, help="mixed into the hash that picks which candidates are removed", ge=0)
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()


_M32 = 0xFFFFFFFF


def _token_hash(old_log_prob: torch.Tensor, seed: int) -> torch.Tensor:
    """A pseudo-random 32-bit key per token (B, T) int64, from its row, column and old log-prob bits.

    murmur3's finaliser over (float32 bits of old_log_prob) ^ row·φ ^ column·c ^ seed: the key of a
    token does not depend on the batch's width or on other tokens, so padding and masked values
    cannot change which tokens are picked, and a batch always picks the same ones.
    """
    B, T = old_log_prob.shape
    device = old_log_prob.device
    bits = old_log_prob.detach().to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & _M32
    rows = torch.arange(B, device=device, dtype=torch.int64).unsqueeze(-1)
    cols = torch.arange(T, device=device, dtype=torch.int64).unsqueeze(0)
    h = (bits ^ ((rows * 0x9E3779B1) & _M32) ^ ((cols * 0x85EBCA77) & _M32) ^ (seed & _M32)) & _M32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def clip_cov(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """Clip-Cov: PPO-clip with the loss zeroed on a few high-covariance tokens (Cui et al. 2025, arXiv:2505.22617).

    cov_t = (A_t − mean A)·(log π_t − mean log π) over valid tokens. Candidates are valid tokens
    not already clipped by PPO with ``clip_cov_lb < cov < clip_cov_ub``; ``max(1,
    ⌊clip_cov_ratio·N⌋)`` of them (N valid tokens) get loss 0 (and so no gradient). All tensors
    (B, T). ``actor/clipfrac`` is PPO's clip fraction; ``actor/clip_cov_frac`` the share of valid
    tokens removed (verl logs the latter as ``pg_clipfrac``). One device sync (N).

    verl draws the removed subset with ``torch.randperm`` (global generator state). Here the loss
    stays a pure function of its inputs: the subset is the candidates with the largest
    pseudo-random keys hashed from each token's position and old log-prob (and ``seed``), so a
    rerun removes the same tokens, while different batches still get unrelated subsets.
    """
    log_prob, old_log_prob, advantages, weights = _prepare("clip_cov", log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    clipped_by_ppo = pg_losses2 > pg_losses1

    cov = _covariance(advantages, log_prob, mask)
    candidate = mask & ~clipped_by_ppo & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
    n_clip = max(int(config.clip_cov_ratio * int(mask.sum())), 1)
    keys = torch.where(candidate, _token_hash(old_log_prob, config.seed), torch.full_like(cov, -1, dtype=torch.int64))
    top = torch.topk(keys.flatten(), min(n_clip, keys.numel())).indices
    removed = torch.zeros(keys.numel(), dtype=torch.bool, device=keys.device).index_fill(0, top, True)
    removed = removed.view_as(candidate) & candidate

    pg_losses = torch.where(removed, torch.zeros_like(pg_losses1), torch.maximum(pg_losses1, pg_losses2))

    metrics = kl_metrics(log_ratio, ratio, mask)
    metrics["actor/clipfrac"] = _frac(clipped_by_ppo, mask)
    metrics["actor/clip_cov_frac"] = _frac(removed, mask)
    return _finish(pg_losses, weights, mask, aggregate), metrics


@attrs.frozen
class KLCovConfig:
    """Knobs of ``kl_cov`` (defaults from verl's actor config)."""

    kl_cov_ratio: float = rllab.knob(2e-4, help="share of valid tokens that get the KL penalty", gt=0.0, le=1.0)
    ppo_kl_coef: float = rllab.knob(0.1, help="κ: weight of |log r| on the selected tokens", ge=0.0)
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()


def kl_cov(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """KL-Cov: −A·r, plus κ·|log r| on the top-k covariance tokens (Cui et al. 2025, arXiv:2505.22617).

    cov_t as in ``clip_cov``; the ``max(1, ⌊kl_cov_ratio·N⌋)`` valid tokens with the largest
    covariance get ``−A·r + κ·|log r|``, the rest ``−A·r``. All tensors (B, T).
    ``actor/kl_cov_frac`` is the share of valid tokens penalised; ``actor/clipfrac`` is 0.
    One device sync (N).
    """
    log_prob, old_log_prob, advantages, weights = _prepare("kl_cov", log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio

    n_valid = int(mask.sum())
    selected = torch.zeros_like(mask)
    if n_valid > 0:
        k = max(1, int(n_valid * config.kl_cov_ratio))
        cov = torch.where(mask, _covariance(advantages, log_prob, mask), torch.full_like(ratio, -math.inf))
        top = torch.topk(cov.flatten(), k).indices
        selected = selected.flatten().index_fill(0, top, True).view_as(mask)
    pg_losses = torch.where(selected, pg_losses + config.ppo_kl_coef * log_ratio.abs(), pg_losses)

    metrics = kl_metrics(log_ratio, ratio, mask)
    metrics["actor/clipfrac"] = torch.zeros((), dtype=torch.float32, device=log_prob.device)
    metrics["actor/kl_cov_frac"] = _frac(selected, mask)
    return _finish(pg_losses, weights, mask, aggregate), metrics
