"""Importance weights for the rollout/training mismatch: TIS, MIS and their sequence forms.

The rollout engine samples with its own numerics (kernels, precision, batching), so the
log-probabilities it reports, ``rollout_log_prob``, differ from the training engine's
``old_log_prob`` for the very same policy. The per-token importance weight

    w_t = exp(old_log_prob_t − rollout_log_prob_t)          (no gradient)

re-weights the policy loss from the rollout distribution to the training one (Yao et al. 2025,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"; Liu et al. 2025,
"When Speed Kills Stability", for the masked form). Every correction is::

    fn(*, old_log_prob, rollout_log_prob, mask, config) -> (weights, metrics)

``old_log_prob``, ``rollout_log_prob`` (B, T) float; ``mask`` (B, T) bool. ``weights`` (B, T) is
detached and 0 on masked positions; the policy loss multiplies it into its per-token loss.

========================= ==============================================================
``token_truncate`` (TIS)  clamp(w_t, C_min, C_max)
``token_mask`` (MIS)      w_t if C_min ≤ w_t ≤ C_max else 0
``sequence_truncate``     W_i = exp(Σ_t log w_t over row i), clamped to [C_min, C_max], broadcast
``sequence_mask``         W_i if C_min ≤ W_i ≤ C_max else 0, broadcast
``none``                  1 on valid tokens, 0 elsewhere
========================= ==============================================================

``c_min=None`` means no lower bound (TRL's ``vllm_importance_sampling_clip_min`` default).
Log-weights (per token, or the row sum for the sequence forms) are clamped to ±20 before ``exp``
as verl does (its ``SAFETY_BOUND``), so no weight is inf or exactly 0. The weights are computed in float32 at least (a bf16 sum of 4 000 log-ratios is not a
log-weight) and returned in that dtype.

Metrics (detached 0-d): ``tis/mean_weight`` (mean final weight over valid tokens),
``tis/frac_truncated`` (truncate forms) or ``tis/frac_masked`` (mask forms) — the share of valid
tokens whose weight the bound changed (for the sequence forms every token of an affected row
counts; ``tis/seq_frac_truncated`` / ``tis/seq_frac_masked`` give the share of non-empty rows,
where verl also counts empty rows) —
and ``tis/rollout_kl = masked_mean(rollout_log_prob − old_log_prob)``, the k1 estimate of
KL(π_rollout ‖ π_old) on rollout samples.

Default ``c_max = 2.0`` — verl's 2.0 rather than TRL's 3.0 — because it is verl's
rollout-correction default (``rollout_is_threshold``), the reference rllab is most often compared
against, so a run moved from verl keeps its treatment; and the tighter cap is the safer one. A
weight above 2 means the trainer finds a token twice as likely as the sampler did — a mismatch
large enough that trusting it further mostly adds variance — and the sequence forms, whose weights
are products over hundreds of tokens, reach such values far more often than the token forms. Set
``c_max=3.0`` for TRL's behaviour (``vllm_importance_sampling_cap`` / ``..._clip_max``).

Rejection sampling (``rejection``: verl's ``rollout_rs`` criteria token_kN / seq_sum_kN /
seq_mean_kN (Geo-RS) / seq_max_kN) and the k1/k2/k3 mismatch metrics are in
:mod:`rllab_corrections.rejection` (its ``narrow_mask`` knob removes rejected tokens from the ``rl``
step's response mask, as verl does); the bypass-mode policy loss (``bypass_mode``) in :mod:`rllab_corrections.bypass`.
``batch_normalize`` divides any correction's weights by their batch mean, as verl's
``rollout_is_batch_normalize`` — the mean over the tensors passed in: under data parallelism that
is the local batch, where verl all-reduces the mean across ranks.

Where the references differ: verl's IcePop mask needs an explicit lower bound and its truncation
has none; TRL 1.16 applies ``clip_min`` to both truncation and masking, clamps no log-weight and
multiplies the log-difference by the mask (a NaN under the mask leaks); rllab selects with
``torch.where``. NaN or inf at a valid position raises :class:`rllab.RowError` naming the rows.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops


SAFETY_BOUND = 20.0


def _check_bounds(inst, attribute, value):
    if value is not None and value > inst.c_max:
        raise ValueError(f"c_min = {value!r} must not exceed c_max = {inst.c_max!r}")


@attrs.frozen
class CorrectionConfig:
    """Knobs of the truncating and masking importance corrections."""

    c_max: float = rllab.knob(
        2.0, help="C_max: weights above are truncated to it / masked to 0 (verl: 2.0, TRL: 3.0; inf: no cap)", gt=0.0
    )
    c_min: float | None = rllab.knob(
        None, help="C_min: weights below are raised to it / masked to 0 (None: no lower bound)", ge=0.0,
        validator=_check_bounds,
    )
    batch_normalize: bool = rllab.knob(
        False, help="divide the weights by their batch mean: over valid tokens (token forms) or non-empty rows "
        "(sequence forms), when it exceeds 1e-8 (verl's rollout_is_batch_normalize)"
    )


@attrs.frozen
class MaskConfig(CorrectionConfig):
    """Knobs of the masking corrections (``token_mask``, ``sequence_mask``): those of the truncating
    ones, whose bounds must keep an on-policy weight of 1."""

    def __attrs_post_init__(self):
        lo = 0.0 if self.c_min is None else self.c_min
        if not lo <= 1.0 <= self.c_max:
            bounds = f"c_min = {self.c_min!r}, c_max = {self.c_max!r}" if self.c_min is not None else f"c_max = {self.c_max!r} (c_min unset)"
            raise ValueError(
                f"{bounds}: a masking correction zeroes every weight outside [{lo:g}, {self.c_max:g}] and an on-policy "
                f"token's weight π_train/π_rollout is 1, so every on-policy token would be rejected (a gradient of 0); "
                f"the interval must contain 1, e.g. c_min ≤ 1 ≤ c_max"
            )


def _prepare(where, old_log_prob, rollout_log_prob, mask):
    ops.check_inputs(where, mask, old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob)
    old = old_log_prob.detach()
    rollout = rollout_log_prob.detach()
    dtype = torch.promote_types(torch.promote_types(old.dtype, rollout.dtype), torch.float32)
    return ops.zero_masked(old.to(dtype), mask), ops.zero_masked(rollout.to(dtype), mask)


def _log_weights(old, rollout, mask, level):
    """log w per token (B, T), or the row sum broadcast over the row; clamped to ±SAFETY_BOUND."""
    log_w = old - rollout  # 0 at masked positions
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    return torch.clamp(log_w, min=-SAFETY_BOUND, max=SAFETY_BOUND)


def _metrics(weights, changed, old, rollout, mask, level, what):
    out = {
        "tis/mean_weight": ops.masked_mean(weights, mask),
        f"tis/frac_{what}": ops.masked_mean(changed.to(weights.dtype), mask),
        "tis/rollout_kl": ops.masked_mean(rollout - old, mask),
    }
    if level == "sequence":
        rows = mask.any(-1)
        out[f"tis/seq_frac_{what}"] = ops.masked_mean((changed & mask).any(-1).to(weights.dtype), rows)
    return {k: v.detach() for k, v in out.items()}


def _truncated(where, level, old_log_prob, rollout_log_prob, mask, config):
    old, rollout = _prepare(where, old_log_prob, rollout_log_prob, mask)
    w = torch.exp(_log_weights(old, rollout, mask, level))
    weights = torch.clamp(w, min=config.c_min, max=config.c_max)
    changed = weights != w
    weights = ops.zero_masked(weights, mask)
    return _normalized(weights, _metrics(weights, changed, old, rollout, mask, level, "truncated"), mask, level, config)


def _masked(where, level, old_log_prob, rollout_log_prob, mask, config):
    old, rollout = _prepare(where, old_log_prob, rollout_log_prob, mask)
    w = torch.exp(_log_weights(old, rollout, mask, level))
    keep = w <= config.c_max
    if config.c_min is not None:
        keep = keep & (w >= config.c_min)
    weights = ops.zero_masked(w, mask & keep)
    return _normalized(weights, _metrics(weights, ~keep, old, rollout, mask, level, "masked"), mask, level, config)


def _normalized(weights, metrics, mask, level, config):
    """With ``batch_normalize``: weights / their batch mean (token or row level); metrics before it, as verl."""
    if not config.batch_normalize:
        return weights, metrics
    if level == "token":
        mean = ops.masked_mean(weights, mask)
    else:
        mean = ops.masked_mean(ops.masked_mean(weights, mask, dim=-1), mask.any(-1))
    scale = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
    metrics["tis/batch_norm_factor"] = scale.detach()
    return weights / scale, metrics


def token_truncate(*, old_log_prob, rollout_log_prob, mask, config):
    """Truncated importance sampling (TIS): w_t = clamp(exp(old − rollout), C_min, C_max).

    ``old_log_prob``, ``rollout_log_prob`` (B, T) float; ``mask`` (B, T) bool. Returns detached
    (B, T) weights, 0 on masked positions, and ``tis/…`` metrics.
    """
    return _truncated("token_truncate", "token", old_log_prob, rollout_log_prob, mask, config)


def token_mask(*, old_log_prob, rollout_log_prob, mask, config):
    """Masked importance sampling (MIS): w_t where C_min ≤ w_t ≤ C_max, else 0.

    ``old_log_prob``, ``rollout_log_prob`` (B, T) float; ``mask`` (B, T) bool. Returns detached
    (B, T) weights, 0 on masked positions, and ``tis/…`` metrics.
    """
    return _masked("token_mask", "token", old_log_prob, rollout_log_prob, mask, config)


def sequence_truncate(*, old_log_prob, rollout_log_prob, mask, config):
    """Sequence-level truncated IS: W_i = exp(Σ_t log w_t) clamped to [C_min, C_max], broadcast.

    ``old_log_prob``, ``rollout_log_prob`` (B, T) float; ``mask`` (B, T) bool. Returns detached
    (B, T) weights (W_i on row i's valid tokens, 0 elsewhere) and ``tis/…`` metrics.
    """
    return _truncated("sequence_truncate", "sequence", old_log_prob, rollout_log_prob, mask, config)


def sequence_mask(*, old_log_prob, rollout_log_prob, mask, config):
    """Sequence-level masked IS: W_i = exp(Σ_t log w_t) if C_min ≤ W_i ≤ C_max else 0, broadcast.

    ``old_log_prob``, ``rollout_log_prob`` (B, T) float; ``mask`` (B, T) bool. Returns detached
    (B, T) weights (W_i or 0 on row i's valid tokens, 0 elsewhere) and ``tis/…`` metrics.
    """
    return _masked("sequence_mask", "sequence", old_log_prob, rollout_log_prob, mask, config)


def no_correction(*, old_log_prob, rollout_log_prob=None, mask, config):
    """No importance correction: weight 1 on valid tokens, 0 elsewhere.

    ``old_log_prob`` (B, T) float; ``rollout_log_prob`` (B, T) float or None; ``mask`` (B, T)
    bool. ``tis/rollout_kl`` is 0 when ``rollout_log_prob`` is None.
    """
    if rollout_log_prob is None:
        rollout_log_prob = old_log_prob
    old, rollout = _prepare("none", old_log_prob, rollout_log_prob, mask)
    weights = mask.to(old.dtype)
    changed = torch.zeros_like(mask)
    return weights, _metrics(weights, changed, old, rollout, mask, "token", "truncated")
