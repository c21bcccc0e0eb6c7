"""Policy-gradient losses: PPO-clip, dual-clip PPO, GSPO, CISPO, REINFORCE, SAPO (Clip-Cov and KL-Cov
in :mod:`rllab_policy_losses.covariance`).

Every loss is a pure function of (B, T) tensors::

    fn(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None) -> (loss, metrics)

``log_prob`` (B, T) float, the current policy's log-probabilities of the sampled tokens (carries
the gradient); ``old_log_prob`` (B, T) float, the same under the policy that produced the batch
(no gradient); ``advantages`` (B, T) float; ``mask`` (B, T) bool, True where a token counts;
``aggregate(loss_mat, mask) -> 0-d`` the run's aggregation mode; ``weights`` (B, T) float or
None, importance-correction weights (detached, multiplied into the per-token loss before
aggregating). ``loss`` is 0-d; ``metrics`` maps namespaced keys to detached 0-d tensors.

Ratios. ``log r = clamp(log_prob − old_log_prob, −20, 20)``, ``r = exp(log r)`` (as verl 0.9.1;
``log_ratio_clamp=None`` gives TRL 1.16's unclamped ratio). GSPO clamps its log-ratio at 10 from
above only, as verl does.

Metrics, every loss:

* ``actor/approx_kl = masked_mean(−log r)`` — verl's ``ppo_kl`` and CleanRL's ``old_approx_kl``
  (the log-ratio is the clamped one the loss uses, as verl; it equals
  ``masked_mean(old_log_prob − log_prob)`` whenever ``|log r| ≤ 20``);
* ``actor/approx_kl_k3 = masked_mean((r − 1) − log r)`` — CleanRL's ``approx_kl``, Schulman's
  k3, never negative;
* ``actor/clipfrac`` — share of valid tokens whose loss took the clipped branch, split into
  ``actor/clipfrac_high`` (A > 0, cut at 1 + ε_high) and ``actor/clipfrac_low`` (A < 0, cut at 1 − ε_low);
* loss-specific fractions (``actor/clipfrac_lower`` for dual-clip, ...).

With ``log_prob == old_log_prob`` both KL metrics are exactly 0 and ``clipfrac`` is 0.

Per-token losses (ε_low = ``clip_low``, ε_high = ``clip_high``, A = advantage):

=================== =================================================================
``ppo_clip``        max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))  (Schulman et al. 2017;
                    asymmetric bounds are DAPO's clip-higher, Yu et al. 2025)
``ppo_dual_clip``   as ``ppo_clip``; where A < 0 also capped: min(that, −A·c)
                    (Ye et al. 2020, "Mastering Complex Control in MOBA Games")
``gspo``            as ``ppo_clip`` on s_{i,t} = sg(s_i)·π_t/sg(π_t),
                    s_i = exp(masked mean over row i of log r)  (Zheng et al. 2025)
``cispo``           −sg(clip(r))·A·log_prob  (MiniMax-M1, 2025)
``vanilla_pg``      −A·log_prob  (Williams 1992, REINFORCE)
``sapo``            −A·(4/τ)·σ(τ·(r − 1)), τ = τ_pos if A > 0 else τ_neg  (Gao et al. 2025)
``clip_cov``        PPO-clip with the loss zeroed on a few high-covariance tokens (Cui et al. 2025)
``kl_cov``          −A·r, plus κ·|log r| on the top-k covariance tokens (Cui et al. 2025)
=================== =================================================================

Masked positions: every input is zeroed there before any arithmetic — with ``torch.where``, or
with a multiplication by the mask once the inputs are known to be finite everywhere — so NaN or
inf there changes neither the loss nor the gradient (verl and TRL multiply by the mask
unconditionally, which lets a NaN under the mask turn the loss NaN). NaN or inf at a *valid*
position raises :class:`rllab.RowError` naming the rows. Cost of the checks: one device sync per
call (two when some masked value is not finite).

Where rllab's defaults differ from the references, and why:

* TRL clamps no log-ratio; verl clamps at ±20. rllab clamps (``log_ratio_clamp=20``): a single
  token whose log-prob moved by 90 nats would otherwise overflow ``exp`` to inf and turn a
  clipped loss into ``inf·0 = NaN`` in the backward pass. ``log_ratio_clamp=None`` is TRL's.
* TRL has no dual clip; ``ppo_clip`` is TRL's surrogate and ``ppo_dual_clip`` is verl's
  ``vanilla`` loss (verl always dual-clips, c = 3). rllab keeps both as separate names so the
  choice is visible in a config instead of hidden behind a knob's default.
* ``actor/clipfrac_lower`` is verl's ``pg_clipfrac_lower``: the share of *all valid tokens* that
  have A < 0 and where the cap bit (divide by the share of A < 0 tokens for a per-negative rate).
* CISPO: TRL caps the detached ratio at ``epsilon_high`` itself (r ≤ 5 by default); verl and the
  paper clip it to [1 − ε_low, 1 + ε_high]. rllab's default is TRL's absolute cap
  (``clip_form="absolute"``, ``clip_high=5.0``, the MiniMax-M1 paper's form); ``"relative"`` is
  verl's, with ``clip_low=None`` meaning no lower bound. ``actor/clipfrac`` counts tokens whose
  ratio the clip changed (verl's ``pg_clipfrac``); TRL logs only the A > 0 tokens above the cap.
* SAPO, GSPO: verl forces/recommends ``seq-mean-token-mean`` for them; here the caller's
  ``aggregate`` is always used, so the choice stays in the run config.
* Clip-Cov and KL-Cov: verl computes their ratio without the ±20 clamp; rllab clamps by default
  (``log_ratio_clamp=None`` restores verl's). verl's Clip-Cov draws the tokens it removes with
  ``torch.randperm``; rllab's picks them with a hash of each token's position and old log-prob,
  so the loss stays a pure function of its inputs (reruns, padding and masked values cannot
  change the pick). Its ``actor/clipfrac`` is PPO's; verl's ``pg_clipfrac`` there is rllab's
  ``actor/clip_cov_frac``.
* ``off_policy_mask_threshold`` (``ppo_clip``, ``gspo``, ``cispo``, ``sapo``; None by default):
  TRL 1.16's off-policy sequence mask, see :mod:`rllab_policy_losses.opsm`. These losses accept an optional
  ``rollout_log_prob`` (B, T) that only the mask reads (registered with
  ``requires=("rollout_log_prob",)``, so the ``rl`` step passes it).
* ``vanilla_pg``'s value is −A·log_prob, not −A·r: with ``log_prob == old_log_prob`` the two
  have the same gradient (−A·∇log π), not the same value.
"""

from __future__ import annotations

import math

import attrs
import torch

import rllab
from rllab import ops
from rllab.ops import check_inputs, zero_masked

from .opsm import apply_off_policy_mask, off_policy_mask_knob

LOG_RATIO_CLAMP = 20.0


def log_ratio_of(log_prob, old_log_prob, clamp: float | None) -> torch.Tensor:
    """log r = log_prob − old_log_prob, clamped to ±clamp (None: unclamped)."""
    log_ratio = log_prob - old_log_prob
    if clamp is not None:
        log_ratio = torch.clamp(log_ratio, min=-clamp, max=clamp)
    return log_ratio


def kl_metrics(log_ratio: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``actor/approx_kl`` (mean −log r) and ``actor/approx_kl_k3`` (mean (r − 1) − log r)."""
    log_ratio, ratio = log_ratio.detach(), ratio.detach()
    return {
        "actor/approx_kl": ops.masked_mean(-log_ratio, mask),
        "actor/approx_kl_k3": ops.masked_mean((ratio - 1) - log_ratio, mask),
    }


def _frac(flag: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ops.masked_mean(flag.detach().to(torch.float32), mask)


def _clip_sides(clipped: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, metrics: dict) -> None:
    """``actor/clipfrac_high``: the share of valid tokens cut at the upper bound (A > 0 and
    r > 1 + ε_high, what clip-higher opens); ``actor/clipfrac_low``: at the lower bound (A < 0 and
    r < 1 − ε_low). They sum to ``actor/clipfrac``."""
    metrics["actor/clipfrac_high"] = _frac(clipped & (advantages > 0), mask)
    metrics["actor/clipfrac_low"] = _frac(clipped & (advantages < 0), mask)


def _prepare(where, log_prob, old_log_prob, advantages, mask, weights):
    finite = check_inputs(
        where, mask, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, weights=weights
    )
    log_prob = zero_masked(log_prob, mask, finite)
    old_log_prob = zero_masked(old_log_prob.detach(), mask, finite)
    advantages = zero_masked(advantages.detach(), mask, finite)
    if weights is not None:
        weights = zero_masked(weights.detach(), mask, finite)
    return log_prob, old_log_prob, advantages, weights


def _finish(pg_losses, weights, mask, aggregate):
    if weights is not None:
        pg_losses = pg_losses * weights
    return aggregate(pg_losses, mask)


def _log_ratio_clamp_knob():
    return rllab.knob(
        LOG_RATIO_CLAMP, help="log r is clamped to ±this before exp (verl: 20; None: unclamped, as TRL)", gt=0.0, optional=True
    )


# --------------------------------------------------------------------------- PPO clip


@attrs.frozen
class PPOClipConfig:
    """Knobs of ``ppo_clip``."""

    clip_low: float = rllab.knob(0.2, help="ε_low: the ratio's lower bound is 1 − clip_low", ge=0.0)
    clip_high: float = rllab.knob(0.2, help="ε_high: the ratio's upper bound is 1 + clip_high (DAPO: 0.28)", ge=0.0)
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()
    off_policy_mask_threshold: float | None = off_policy_mask_knob()


def ppo_clip(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None, rollout_log_prob=None):
    """PPO clipped surrogate: max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)).

    All tensors (B, T); returns (0-d loss, metrics). ``actor/clipfrac`` is the share of valid
    tokens where the clipped term is strictly larger (the gradient is cut there).
    """
    log_prob, old_log_prob, advantages, weights = _prepare("ppo_clip", log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)

    metrics = kl_metrics(log_ratio, ratio, mask)
    metrics["actor/clipfrac"] = _frac(pg_losses2 > pg_losses1, mask)
    _clip_sides(pg_losses2 > pg_losses1, advantages, mask, metrics)
    pg_losses = apply_off_policy_mask(
        pg_losses, config=config, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
        rollout_log_prob=rollout_log_prob, metrics=metrics, where="ppo_clip",
    )
    return _finish(pg_losses, weights, mask, aggregate), metrics


# --------------------------------------------------------------------------- dual-clip PPO


@attrs.frozen
class PPODualClipConfig:
    """Knobs of ``ppo_dual_clip``."""

    clip_low: float = rllab.knob(0.2, help="ε_low: the ratio's lower bound is 1 − clip_low", ge=0.0)
    clip_high: float = rllab.knob(0.2, help="ε_high: the ratio's upper bound is 1 + clip_high (DAPO: 0.28)", ge=0.0)
    clip_c: float = rllab.knob(3.0, help="c: where A < 0 the loss is capped at −A·c (inf: no cap)", gt=1.0)
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()


def ppo_dual_clip(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """Dual-clip PPO: PPO-clip, and where A < 0 the loss is capped at −A·c.

    Per token ``min(max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), −A·c)`` where A < 0, the PPO
    loss elsewhere. All tensors (B, T). Metrics add ``actor/clipfrac_lower``: the share of valid
    tokens with A < 0 where the cap bit (verl's ``pg_clipfrac_lower``).
    """
    log_prob, old_log_prob, advantages, weights = _prepare(
        "ppo_dual_clip", log_prob, old_log_prob, advantages, mask, weights
    )
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    # the cap −A·c applies only where A < 0; elsewhere +inf leaves the PPO loss untouched
    negative = advantages < 0
    pg_losses3 = torch.where(negative, -advantages * config.clip_c, torch.full_like(advantages, math.inf))
    pg_losses = torch.minimum(clip_pg_losses1, pg_losses3)

    metrics = kl_metrics(log_ratio, ratio, mask)
    metrics["actor/clipfrac"] = _frac(pg_losses2 > pg_losses1, mask)
    _clip_sides(pg_losses2 > pg_losses1, advantages, mask, metrics)
    metrics["actor/clipfrac_lower"] = _frac(negative & (clip_pg_losses1 > pg_losses3), mask)
    return _finish(pg_losses, weights, mask, aggregate), metrics


# --------------------------------------------------------------------------- GSPO


@attrs.frozen
class GSPOConfig:
    """Knobs of ``gspo`` (defaults from the GSPO paper and verl's recipe)."""

    clip_low: float = rllab.knob(3e-4, help="ε_low on the sequence ratio", ge=0.0)
    clip_high: float = rllab.knob(4e-4, help="ε_high on the sequence ratio", ge=0.0)
    log_ratio_max: float | None = rllab.knob(
        10.0, help="log s_{i,t} is clamped from above at this (verl: 10; None: unclamped)", gt=0.0, optional=True
    )
    off_policy_mask_threshold: float | None = off_policy_mask_knob()


def gspo(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None, rollout_log_prob=None):
    """GSPO: PPO-clip on the sequence-level ratio (Zheng et al. 2025, "Group Sequence Policy Optimization").

    ``log s_i = Σ_t mask·(log_prob − old_log_prob) / Σ_t mask`` (B,); the token ratio is
    ``s_{i,t} = exp(min(sg(log s_i) + log_prob − sg(log_prob), 10))`` — its value is s_i, its
    gradient that of π_t — and the loss is ``max(−A·s, −A·clip(s, 1 − ε_low, 1 + ε_high))``.
    All tensors (B, T). ``actor/approx_kl`` uses the unclamped token log-ratio (as verl).
    """
    log_prob, old_log_prob, advantages, weights = _prepare("gspo", log_prob, old_log_prob, advantages, mask, weights)
    token_log_ratio = log_prob - old_log_prob
    seq_lengths = mask.sum(-1).clamp(min=1).to(log_prob.dtype)
    seq_log_ratio = token_log_ratio.sum(-1) / seq_lengths  # masked positions are 0
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    if config.log_ratio_max is not None:
        log_seq_ratio = torch.clamp(log_seq_ratio, max=config.log_ratio_max)
    seq_ratio = torch.exp(log_seq_ratio)

    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1 - config.clip_low, 1 + config.clip_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)

    kl_log_ratio = token_log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics = kl_metrics(kl_log_ratio, torch.exp(kl_log_ratio), mask)
    metrics["actor/approx_kl"] = ops.masked_mean(-token_log_ratio.detach(), mask)
    metrics["actor/clipfrac"] = _frac(pg_losses2 > pg_losses1, mask)
    pg_losses = apply_off_policy_mask(
        pg_losses, config=config, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
        rollout_log_prob=rollout_log_prob, metrics=metrics, where="gspo",
    )
    return _finish(pg_losses, weights, mask, aggregate), metrics


# --------------------------------------------------------------------------- CISPO


def _check_cispo(inst, attribute, value):
    if value is not None and inst.clip_form == "absolute":
        raise ValueError("clip_low only applies with clip_form = 'relative' (the absolute form has no lower bound)")


@attrs.frozen
class CISPOConfig:
    """Knobs of ``cispo``."""

    clip_high: float = rllab.knob(
        5.0, help="cap on the detached ratio: r ≤ clip_high (absolute, TRL) or r ≤ 1 + clip_high (relative, verl)", gt=0.0
    )
    clip_form: str = rllab.knob(
        "absolute",
        help="'absolute': clip(r, max=clip_high) as TRL; 'relative': clip(r, 1 − clip_low, 1 + clip_high) as verl",
        choices=("absolute", "relative"),
    )
    clip_low: float | None = rllab.knob(
        None, help="relative form only: r ≥ 1 − clip_low (None: no lower bound)", ge=0.0, validator=_check_cispo
    )
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()
    off_policy_mask_threshold: float | None = off_policy_mask_knob()


def cispo(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None, rollout_log_prob=None):
    """CISPO: REINFORCE weighted by a clipped, detached ratio (MiniMax-M1, arXiv:2506.13585).

    Per token ``−sg(clip(r))·A·log_prob``; every token keeps a gradient, the clip only bounds
    its weight. All tensors (B, T). ``actor/clipfrac`` is the share of valid tokens whose ratio
    the clip changed.
    """
    log_prob, old_log_prob, advantages, weights = _prepare("cispo", log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    if config.clip_form == "absolute":
        clipped_ratio = torch.clamp(ratio, max=config.clip_high)
    else:
        low = None if config.clip_low is None else 1 - config.clip_low
        clipped_ratio = torch.clamp(ratio, min=low, max=1 + config.clip_high)

    pg_losses = -clipped_ratio.detach() * advantages * log_prob

    metrics = kl_metrics(log_ratio, ratio, mask)
    metrics["actor/clipfrac"] = _frac(clipped_ratio != ratio, mask)
    pg_losses = apply_off_policy_mask(
        pg_losses, config=config, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
        rollout_log_prob=rollout_log_prob, metrics=metrics, where="cispo",
    )
    return _finish(pg_losses, weights, mask, aggregate), metrics


# --------------------------------------------------------------------------- REINFORCE


def vanilla_pg(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """Plain policy gradient (REINFORCE surrogate): −A·log_prob.

    All tensors (B, T). Its gradient is −A·∇log π, which is the gradient of −A·r wherever
    ``log_prob == old_log_prob``. ``old_log_prob`` only feeds the KL metrics; ``clipfrac`` is 0.
    """
    log_prob, old_log_prob, advantages, weights = _prepare(
        "vanilla_pg", log_prob, old_log_prob, advantages, mask, weights
    )
    pg_losses = -advantages * log_prob

    log_ratio = log_ratio_of(log_prob.detach(), old_log_prob, LOG_RATIO_CLAMP)
    metrics = kl_metrics(log_ratio, torch.exp(log_ratio), mask)
    metrics["actor/clipfrac"] = torch.zeros((), dtype=torch.float32, device=log_prob.device)
    return _finish(pg_losses, weights, mask, aggregate), metrics


# --------------------------------------------------------------------------- SAPO


@attrs.frozen
class SAPOConfig:
    """Knobs of ``sapo`` (defaults from verl's actor config)."""

    tau_pos: float = rllab.knob(1.0, help="gate temperature τ where A > 0", gt=0.0)
    tau_neg: float = rllab.knob(1.05, help="gate temperature τ where A ≤ 0", gt=0.0)
    log_ratio_clamp: float | None = _log_ratio_clamp_knob()
    off_policy_mask_threshold: float | None = off_policy_mask_knob()


def sapo(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None, rollout_log_prob=None):
    """SAPO: a smooth sigmoid gate instead of a hard clip (Gao et al. 2025, arXiv:2511.20347).

    Per token ``−A·f(r)`` with ``f(r) = σ(τ·(r − 1))·4/τ`` and τ = τ_pos where A > 0, τ_neg
    elsewhere; f(1) = 2/τ and f'(1) = 1, so at r = 1 the gradient is REINFORCE's. All tensors
    (B, T). Nothing is clipped, so ``actor/clipfrac`` is 0.
    """
    log_prob, old_log_prob, advantages, weights = _prepare("sapo", log_prob, old_log_prob, advantages, mask, weights)
    log_ratio = log_ratio_of(log_prob, old_log_prob, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    tau = torch.where(
        advantages > 0,
        torch.tensor(config.tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.tensor(config.tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gates * advantages

    metrics = kl_metrics(log_ratio, ratio, mask)
    metrics["actor/clipfrac"] = torch.zeros((), dtype=torch.float32, device=log_prob.device)
    pg_losses = apply_off_policy_mask(
        pg_losses, config=config, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, mask=mask,
        rollout_log_prob=rollout_log_prob, metrics=metrics, where="sapo",
    )
    return _finish(pg_losses, weights, mask, aggregate), metrics
