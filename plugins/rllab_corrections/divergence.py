"""The divergence between the trainer's and the sampler's policy, and the mismatch metrics, for
the corrections that act on it (:mod:`rllab_corrections.rejection`, :mod:`rllab_corrections.bypass`).

With ``lr_t = clamp(old_log_prob_t − rollout_log_prob_t, ±20)`` (log π_train/π_rollout) the
per-token estimates are ``k1_t = −lr_t``, ``k2_t = ½·lr_t²``, ``k3_t = exp(lr_t) − 1 − lr_t``
(:func:`divergences`); :func:`row_stat` sums, averages or maximises them over a row's valid
tokens; :func:`mismatch_metrics` logs them per token and per sequence, with the χ² divergences.

Shapes: ``old_log_prob``, ``rollout_log_prob`` (B, T) float (zeroed where masked), ``mask`` (B, T) bool.
"""

from __future__ import annotations

import math

import torch

from rllab import ops

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to ±SAFETY_BOUND (verl's), so no ratio is inf or exactly 0."""


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def divergences(old_log_prob, rollout_log_prob):
    """Per-token (k1, k2, k3), each (B, T), from the log-ratio clamped to ±20 (inputs zeroed where masked)."""
    lr = torch.clamp(old_log_prob - rollout_log_prob, -SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}


def row_stat(kind: str, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row sum / mean / max of ``values`` over valid tokens, (B,); 0 for an empty row."""
    if kind == "sum":
        return ops.masked_sum(values, mask, dim=-1)
    if kind == "mean":
        return ops.masked_mean(values, mask, dim=-1)
    top = torch.where(mask, values, torch.full_like(values, -math.inf)).amax(-1)
    return torch.where(mask.any(-1), top, _zero(top))


def mismatch_metrics(old_log_prob, rollout_log_prob, mask) -> dict[str, torch.Tensor]:
    """Token- and sequence-level k1/k2/k3 estimates of the mismatch, and the χ² divergences.

    For N in 1, 2, 3 (k_N as in the module docstring; inputs (B, T) zeroed where masked):

    * ``tis/kN_token`` — mean of k_N over valid tokens (verl ``rollout_rs_token_kN_mean``;
      ``tis/k1_token`` is verl's ``kl``, ``tis/k3_token`` its ``k3_kl`` up to the ±20 clamp);
    * ``tis/kN_seq_sum`` — mean over non-empty rows of Σ_t k_N (``rollout_rs_seq_sum_kN_seq_mean``);
    * ``tis/kN_seq_mean`` — mean over non-empty rows of mean_t k_N (``…seq_mean_kN_seq_mean``);
    * ``tis/kN_seq_max`` (N = 2, 3) — mean over non-empty rows of max_t k_N;
    * ``tis/chi2_token = mean_t ρ_t² − 1`` and ``tis/chi2_seq = mean_i (Π_t ρ_t)² − 1`` with
      ρ = π_train/π_rollout, log-ratios clamped to ±20 (verl's ``chi2_token``, ``chi2_seq``; the
      sequence mean is over non-empty rows, verl's over every row).
    """
    rows = mask.any(-1)
    out = {}
    for name, per_token in divergences(old_log_prob, rollout_log_prob).items():
        out[f"tis/{name}_token"] = ops.masked_mean(per_token, mask)
        for kind in ("sum", "mean", "max"):
            if kind == "max" and name == "k1":
                continue
            out[f"tis/{name}_seq_{kind}"] = ops.masked_mean(row_stat(kind, per_token, mask), rows)
    lr = torch.clamp(old_log_prob - rollout_log_prob, -SAFETY_BOUND, SAFETY_BOUND)
    out["tis/chi2_token"] = ops.masked_mean(torch.exp(lr).square(), mask) - 1.0
    seq_lr = torch.clamp((old_log_prob - rollout_log_prob).sum(-1), -SAFETY_BOUND, SAFETY_BOUND)
    out["tis/chi2_seq"] = ops.masked_mean(torch.exp(2.0 * seq_lr), rows) - 1.0
    return {k: v.detach() for k, v in out.items()}
