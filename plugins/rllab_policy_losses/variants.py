"""More policy-gradient losses: GMPO (``geo_mean``), DPPO (``dppo_tv``, ``dppo_kl``), DRO and VESPO.

Same signature as :mod:`rllab_policy_losses.ppo`::

    fn(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None) -> (loss, metrics)

``log_prob``, ``old_log_prob``, ``advantages`` (B, T) float, ``mask`` (B, T) bool, ``weights``
(B, T) float or None (detached importance-correction weights). ``vespo`` also takes
``rollout_log_prob`` (B, T) float or None, the inference engine's log-probs, which only its
off-policy sequence mask reads (it registers with ``requires=("rollout_log_prob",)``). Inputs are
checked and zeroed at masked positions exactly as in :mod:`rllab_policy_losses.ppo`, so NaN there
changes nothing; ``log r = log_prob − old_log_prob``.

=============== =====================================================================
``geo_mean``    GMPO, Zhao et al. 2025 (arXiv:2507.20673), verl ``compute_policy_loss_geo_mean``:
                per row, ρ_i = exp(mean_t sgn(A_t)·min(sgn(A_t)·log r_t, sgn(A_t)·clip(log r_t,
                −ε_low, ε_high))), Ā_i = mean_t A_t, L_i = −Ā_i·ρ_i; loss = mean over rows
                of L_i. **A per-sequence loss**: it does not call ``aggregate`` (see below).
``dppo_tv``     DPPO-Binary-TV, arXiv:2602.04879, verl ``compute_policy_loss_dppo_tv``:
                −A·sg(min(r, c))·log π·valid, valid = (π − π_old ≤ ε_high) where A > 0,
                (π − π_old ≥ −ε_low) elsewhere (π = exp log_prob, probabilities not ratios).
``dppo_kl``     DPPO-Binary-KL, same paper, verl ``compute_policy_loss_dppo_kl``: as ``dppo_tv``
                with valid = (D ≤ ε_high or π ≤ π_old) where A > 0, (D ≤ ε_low or π ≥ π_old)
                elsewhere; D = π_old·(log π_old − log π) + (1 − π_old)·log((1 − π_old + 1e-8)
                / (1 − π + 1e-8)), the KL between the two Bernoulli distributions "this token /
                any other token".
``dro``         verl ``compute_policy_loss_dro``: −(A·log π − ½·β·(log r)²), REINFORCE with a
                quadratic penalty on the log-ratio.
``vespo``       VESPO, arXiv:2602.10693, TRL 1.16 ``loss_type="vespo"``
                (``GRPOTrainer.get_gamma_weights``): −sg(φ)·A·log π with the gamma weight
                φ(w) = e^λ·w^k·e^(−λ·w) of the sequence ratio w = exp(Σ_t log r_t) (k, λ by the
                sign of A: k_pos/λ_pos where A ≥ 0, else k_neg/λ_neg); φ(1) = 1.
=============== =====================================================================

Per-sequence aggregation (``geo_mean``). GMPO's objective is a mean over sequences of a
sequence-level surrogate; it cannot be written as a per-token loss that a token-level
``aggregate`` could reduce. verl ignores ``loss_agg_mode`` for it and takes ``torch.mean`` over
the rows. rllab does the same and says so: the function carries ``aggregation = "seq-mean"``,
which :mod:`rllab.testing` reads — the contract then checks that ``aggregate`` is ignored
rather than that it is honoured. Rows with no valid token are left out of the mean by default
(``count_empty_rows=False``); verl counts them (its ``torch.mean`` over B rows, the empty ones
contributing 0), which ``count_empty_rows=True`` reproduces. Under micro-batching a trainer must
weight each micro-batch's ``geo_mean`` loss by its share of the rows itself: the loss cannot see
the global row count that ``aggregate`` is bound to.

Where rllab differs from the references, and the knob that restores them:

* ``geo_mean``: verl clamps no log-ratio (its clamp is commented out); rllab clamps log r to ±20
  before anything else (``log_ratio_clamp=None`` is verl's), so one token that moved by 100 nats
  with A < 0 cannot make ρ_i infinite. verl divides row sums by ``n_i + 1e-8``; rllab by n_i
  (a relative difference of at most 1e-8). Importance weights are folded in as verl does:
  multiplied per row by their geometric mean ``exp(mean_t log(w_t + 1e-10))``.
* ``dppo_tv``/``dppo_kl``: verl reads the truncation cap from ``clip_ratio_c`` with a fallback of
  20 that its ``ActorConfig`` (default 3.0, the dual-clip constant) always overrides. rllab's
  ``clip_c`` default is the 20 the paper recommends (§5.4: a small cap biases the gradient);
  ``clip_c=3.0`` reproduces an unmodified verl config. The probability thresholds default to
  verl's ``clip_ratio`` (0.2).
* ``dro``: verl requires ``dro_beta`` and so does rllab (no default).
* ``vespo``: TRL folds vLLM importance weights into w rather than multiplying them into the loss;
  so does rllab with ``weights`` (w gains Σ_t clamp(log weights_t, log 1e-8, 20) over valid
  tokens). TRL's advantages are one per row; rllab picks k, λ per token by the sign of A_t (the
  same for broadcast outcome advantages).
* ``off_policy_mask_threshold`` (TRL; ``vespo`` here, and ``ppo_clip``, ``gspo``, ``cispo``,
  ``sapo`` in :mod:`rllab_policy_losses.ppo`): see :mod:`rllab_policy_losses.opsm`.
"""

from __future__ import annotations

import math

import attrs
import torch

import rllab
from rllab import ops

from .ppo import LOG_RATIO_CLAMP, _frac, _log_ratio_clamp_knob, _prepare, kl_metrics, log_ratio_of
from .opsm import apply_off_policy_mask, off_policy_mask_knob

__all__ = ["geo_mean", "dppo_tv", "dppo_kl", "dro", "vespo"]


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


# --------------------------------------------------------------------------- GMPO


@attrs.frozen
class GeoMeanConfig:
    """Knobs of ``geo_mean`` (GMPO; bounds from the GMPO paper's recipe, (e^−0.4, e^0.4))."""

    clip_low: float = rllab.knob(0.4, help="ε_low: log r is clipped at −clip_low (on the log scale)", ge=0.0)
    clip_high: float = rllab.knob(0.4, help="ε_high: log r is clipped at +clip_high (on the log scale)", ge=0.0)
    count_empty_rows: bool = rllab.knob(
        False, help="average over every row, empty ones included (verl's torch.mean); False: non-empty rows only"
    )
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()


def geo_mean(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """GMPO: the geometric mean of the clipped token ratios, one loss per sequence (Zhao et al. 2025).

    ``ℓ_t = sgn(A_t)·min(sgn(A_t)·log r_t, sgn(A_t)·clip(log r_t, −ε_low, ε_high))`` (B, T);
    ``ρ_i = exp(Σ_t mask·ℓ_t / n_i)``, ``Ā_i = Σ_t mask·A_t / n_i`` (B,); ``L_i = −Ā_i·ρ_i``, times
    ``exp(Σ_t mask·log(w_t + 1e-10) / n_i)`` with importance weights. The loss is the mean of L_i
    over the non-empty rows (over all B rows with ``count_empty_rows``); ``aggregate`` is not used.
    Metrics: ``actor/clipfrac`` / ``actor/clipfrac_lower``, the share of valid tokens with
    A > 0 / A < 0 whose log r lies outside [−ε_low, ε_high] (verl's ``pg_clipfrac`` /
    ``pg_clipfrac_lower``).
    """
    log_prob, old_log_prob, advantages, weights = _prepare(
        "geo_mean", log_prob, old_log_prob, advantages, mask, weights
    )
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    sign = torch.sign(advantages)
    clipped_log_ratio = torch.clamp(log_ratio, -config.clip_low, config.clip_high)
    token_term = sign * torch.min(sign * log_ratio, sign * clipped_log_ratio)

    lengths = mask.sum(-1).clamp(min=1).to(log_prob.dtype)
    seq_ratio = torch.exp(torch.where(mask, token_term, _zero(token_term)).sum(-1) / lengths)
    seq_advantage = advantages.sum(-1) / lengths  # 0 at masked positions already
    pg_losses = -seq_advantage * seq_ratio
    if weights is not None:
        log_w = torch.where(mask, torch.log(weights + 1e-10), _zero(weights))
        pg_losses = pg_losses * torch.exp(log_w.sum(-1) / lengths)
    rows = torch.ones_like(mask[:, 0]) if config.count_empty_rows else mask.any(-1)
    loss = torch.where(rows, pg_losses, _zero(pg_losses)).sum() / rows.sum().clamp(min=1).to(pg_losses.dtype)

    clipped = log_ratio != clipped_log_ratio
    metrics = kl_metrics(log_ratio, torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), mask)
    metrics["actor/clipfrac"] = _frac(clipped & (advantages > 0), mask)
    metrics["actor/clipfrac_lower"] = _frac(clipped & (advantages < 0), mask)
    return loss, metrics


# --------------------------------------------------------------------------- DPPO


@attrs.frozen
class DPPOConfig:
    """Knobs of ``dppo_tv`` and ``dppo_kl`` (thresholds on a divergence, not on the ratio)."""

    clip_low: float = rllab.knob(
        0.2, help="ε_low: divergence threshold where A ≤ 0 (TV: π_old − π; KL: binary KL)", ge=0.0
    )
    clip_high: float = rllab.knob(
        0.2, help="ε_high: divergence threshold where A > 0 (TV: π − π_old; KL: binary KL)", ge=0.0
    )
    clip_c: float = rllab.knob(
        20.0, help="the detached ratio is truncated at clip_c (paper: large; an unmodified verl config: 3.0)", gt=0.0
    )
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()


def _dppo(where, divergence, *, log_prob, old_log_prob, advantages, mask, aggregate, config, weights):
    log_prob, old_log_prob, advantages, weights = _prepare(where, log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    truncated_ratio = torch.clamp(ratio, max=config.clip_c).detach()

    with torch.no_grad():
        prob, old_prob = torch.exp(log_prob.detach()), torch.exp(old_log_prob)
        if divergence == "tv":
            valid_positive = (prob - old_prob) <= config.clip_high
            valid_negative = (prob - old_prob) >= -config.clip_low
        else:
            binary_kl = old_prob * (old_log_prob - log_prob.detach()) + (1 - old_prob) * torch.log(
                (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
            )
            valid_positive = (binary_kl <= config.clip_high) | (prob <= old_prob)
            valid_negative = (binary_kl <= config.clip_low) | (prob >= old_prob)
        valid = torch.where(advantages > 0, valid_positive, valid_negative)

    pg_losses = torch.where(valid, -advantages * truncated_ratio * log_prob, _zero(log_prob))
    if weights is not None:
        pg_losses = pg_losses * weights

    metrics = kl_metrics(log_ratio, ratio, mask)
    metrics["actor/clipfrac"] = _frac(~valid, mask)
    metrics["actor/truncfrac"] = _frac((ratio > config.clip_c) & valid, mask)
    return aggregate(pg_losses, mask), metrics


def dppo_tv(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """DPPO-Binary-TV: REINFORCE weighted by a truncated ratio, trusted only inside a TV region (arXiv:2602.04879).

    Per token ``−A·sg(min(r, c))·log π`` where the token's probability moved by at most ε_high
    upwards (A > 0) or ε_low downwards (A ≤ 0), 0 elsewhere. All tensors (B, T).
    ``actor/clipfrac`` is the share of valid tokens outside the region (verl's ``pg_clipfrac``);
    ``actor/truncfrac`` the share inside it whose ratio exceeds c (verl's ``pg_clipfrac_lower``).
    """
    return _dppo(
        "dppo_tv", "tv", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
        aggregate=aggregate, config=config, weights=weights,
    )


def dppo_kl(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """DPPO-Binary-KL: as ``dppo_tv`` with the region bounded by the binary KL (arXiv:2602.04879).

    ``D = π_old·(log π_old − log π) + (1 − π_old)·log((1 − π_old + 1e-8)/(1 − π + 1e-8))``; a token
    is trusted where A > 0 if D ≤ ε_high or π ≤ π_old, and where A ≤ 0 if D ≤ ε_low or
    π ≥ π_old. All tensors (B, T); metrics as ``dppo_tv``.
    """
    return _dppo(
        "dppo_kl", "kl", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
        aggregate=aggregate, config=config, weights=weights,
    )


# --------------------------------------------------------------------------- DRO


@attrs.frozen
class DROConfig:
    """Knobs of ``dro`` (verl's ``policy_loss.dro_beta``, which has no default)."""

    beta: float = rllab.knob(
        help="β: weight of the quadratic penalty ½·β·(log r)² (required, as in verl)", gt=0.0
    )


def dro(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """DRO: REINFORCE with a quadratic log-ratio penalty (verl's ``dro`` policy loss).

    Per token ``−(A·log π − ½·β·(log π − log π_old)²)``; all tensors (B, T). The log-ratio is not
    clamped (no ``exp`` is taken, so nothing can overflow). ``actor/approx_kl`` is
    ``masked_mean(−log r)`` unclamped (verl's ``ppo_kl``); nothing is clipped (``clipfrac`` 0).
    """
    log_prob, old_log_prob, advantages, weights = _prepare("dro", log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * config.beta * log_ratio.square())
    if weights is not None:
        pg_losses = pg_losses * weights

    clamped = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics = kl_metrics(clamped, torch.exp(clamped), mask)
    metrics["actor/approx_kl"] = ops.masked_mean(-log_ratio.detach(), mask)
    metrics["actor/clipfrac"] = torch.zeros((), dtype=torch.float32, device=log_prob.device)
    return aggregate(pg_losses, mask), metrics


# --------------------------------------------------------------------------- VESPO


_LOG_MIN_WEIGHT = math.log(1e-8)


@attrs.frozen
class VESPOConfig:
    """Knobs of ``vespo`` (defaults: TRL's ``vespo_*``)."""

    k_pos: float = rllab.knob(2.0, help="k where A ≥ 0: the power of w (down-weights w < 1)", ge=0.0)
    lambda_pos: float = rllab.knob(3.0, help="λ where A ≥ 0: the decay rate in w (down-weights w > 1)", ge=0.0)
    k_neg: float = rllab.knob(3.0, help="k where A < 0", ge=0.0)
    lambda_neg: float = rllab.knob(2.0, help="λ where A < 0", ge=0.0)
    off_policy_mask_threshold: float | None = off_policy_mask_knob()


def vespo(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None, rollout_log_prob=None):
    """VESPO: REINFORCE scaled by a gamma weight of the sequence ratio (TRL 1.16 ``vespo``).

    ``log w_i = clamp(Σ_t mask·clamp(log r_t, ±20) [+ Σ_t mask·clamp(log weights_t, log 1e-8, 20)],
    log 1e-8, 20)`` (B,); per token ``φ = exp(λ + k·log w_i − λ·w_i)`` with (k, λ) = (k_pos,
    max(λ_pos, 1e-4)) where A_t ≥ 0 else (k_neg, max(λ_neg, 1e-4)), non-finite φ set to 0; the loss
    is ``−sg(φ)·A·log π``. All tensors (B, T). ``weights`` enter w (as TRL's vLLM correction), they
    are not multiplied into the loss. Metrics: ``actor/vespo_phi_mean`` (mean φ over valid
    tokens), ``actor/clipfrac`` 0, ``actor/off_policy_masked_frac`` with the mask on.
    """
    log_prob, old_log_prob, advantages, weights = _prepare("vespo", log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_ratio_of(log_prob, old_log_prob, LOG_RATIO_CLAMP)
    with torch.no_grad():
        seq_log_ratio = log_ratio.detach().sum(-1)  # 0 at masked positions
        if weights is not None:
            log_is = torch.clamp(torch.log(weights), _LOG_MIN_WEIGHT, LOG_RATIO_CLAMP)
            seq_log_ratio = seq_log_ratio + torch.where(mask, log_is, _zero(log_is)).sum(-1)
        log_w = torch.clamp(seq_log_ratio, _LOG_MIN_WEIGHT, LOG_RATIO_CLAMP)[:, None]
        nonneg = advantages >= 0
        k = torch.where(nonneg, config.k_pos, config.k_neg).to(log_w.dtype)
        lam = torch.where(nonneg, config.lambda_pos, config.lambda_neg).to(log_w.dtype).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)

    pg_losses = -phi * advantages * log_prob
    metrics = kl_metrics(log_ratio, torch.exp(log_ratio), mask)
    metrics["actor/clipfrac"] = torch.zeros((), dtype=torch.float32, device=log_prob.device)
    metrics["actor/vespo_phi_mean"] = ops.masked_mean(phi, mask).detach()
    pg_losses = apply_off_policy_mask(
        pg_losses, config=config, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
        rollout_log_prob=rollout_log_prob, metrics=metrics, where="vespo",
    )
    return aggregate(pg_losses, mask), metrics
