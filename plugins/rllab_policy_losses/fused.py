"""PPO-clip + KL (k3) + entropy bonus as one autograd node.

A trainer usually builds the actor loss from three components::

    pg, m = ppo_clip(log_prob=..., old_log_prob=..., advantages=..., mask=..., aggregate=agg)
    kl    = agg(k3(log_prob=..., ref_log_prob=...), mask)
    ent   = agg(entropy, mask)
    loss  = pg + kl_coef·kl − entropy_coef·ent

Autograd then records some thirty element-wise nodes over (B, T) tensors, keeps most of their
inputs alive until ``backward``, and masks with ``torch.where`` at every step.
:func:`fused_ppo_loss` computes the same scalar as one :class:`torch.autograd.Function`:

1. every rllab aggregation mode is *linear* in its ``loss_mat`` (a weighted sum of the valid
   tokens, the weights depending only on the mask and the global counts), so
   ``aggregate(x, mask) = Σ c·x`` with ``c = ∂aggregate/∂x``; ``c`` is read off one backward
   pass of ``aggregate`` on zeros, whatever mode and normaliser the caller bound;
2. one pass evaluates the per-token total ``L = w·ℓ^{clip}(r) + β·k3 − c_H·H`` and its
   derivative with respect to ``log_prob`` in place on a few buffers (on a CPU a fresh 2 MB
   tensor costs more in page faults than the arithmetic that fills it);
3. the loss is ``Σ c·L`` and the only tensor kept for ``backward`` is ``c·∂L/∂log π``; the
   component values (``loss/policy``, ``loss/kl``, ``loss/entropy``) are ``Σ c·component``.

Every element goes through the same operations in the same order as ``ppo_clip`` /
``ppo_dual_clip`` and ``k3``; only the final sums are associated differently, so the loss agrees
with the separate computation to float rounding of a sum (≈1e-7 relative in float32) and so do the
gradients. A tie exactly at the dual-clip cap (r·|A| = c·|A|) gets the full gradient of the
active branch where ``torch.minimum`` would split it in half.

Semantics: ``ppo_clip`` (``ppo_dual_clip`` with ``clip_c``), log-ratio clamped at
``log_ratio_clamp``; ``k3`` with verl's clamps (d = clamp(ref − log π, ±20);
clamp(exp(d) − d − 1, ±10); gradient 0 where a clamp is active); entropy bonus
``−entropy_coef·aggregate(entropy)``. NaN or inf at a valid position raises :class:`rllab.RowError`;
NaN or inf at masked positions changes nothing (the inputs are then sanitised with
``torch.where`` first — the only case that pays for it; finite inputs are masked by the zeros
of ``c``). Whether it pays, and by how much, is measured by ``benchmarks/bench_losses.py``.
"""

from __future__ import annotations

import torch

from rllab.ops import check_inputs, zero_masked

from .ppo import LOG_RATIO_CLAMP

__all__ = ["aggregation_weights", "fused_ppo_loss"]


def aggregation_weights(aggregate, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``c`` (B, T) with ``aggregate(x, mask) = Σ c·x`` for a linear ``aggregate``: its gradient at 0."""
    with torch.enable_grad():
        probe = torch.zeros(mask.shape, dtype=dtype, device=mask.device, requires_grad=True)
        value = aggregate(probe, mask)
        if not value.requires_grad:  # nothing valid: the aggregate is a constant 0
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        (weights,) = torch.autograd.grad(value, probe)
    return weights


def _actor_terms(log_prob, entropy, old_log_prob, advantages, ref_log_prob, weights, mask, coef,
                 clip_low, clip_high, clip_c, log_ratio_clamp, kl_coef, entropy_coef):
    """Σ c·L, c·∂L/∂log π (B, T) and the metrics, without autograd; inputs finite everywhere."""
    valid = mask.to(log_prob.dtype)
    n_valid = valid.sum().clamp(min=1)
    dot = lambda a, b: torch.dot(a.flatten(), b.flatten().to(a.dtype))  # noqa: E731
    metrics = {}

    # ratio r = exp(clamp(log π − log π_old)); the clamp zeroes the gradient where it is active
    log_ratio = torch.sub(log_prob, old_log_prob)  # buffer 1
    dead = None
    if log_ratio_clamp is not None:
        dead = (log_ratio < -log_ratio_clamp).logical_or_(log_ratio > log_ratio_clamp)
        log_ratio.clamp_(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)  # buffer 2

    # PPO clip: max(−A·r, −A·clip(r)); d/dlog π of the unclipped branch −A·r is −A·r itself
    pg_losses1 = torch.mul(advantages, ratio).neg_()  # buffer 3, becomes the derivative
    pg_losses = torch.clamp(ratio, 1 - clip_low, 1 + clip_high).mul_(advantages).neg_()  # buffer 4
    clipped = pg_losses > pg_losses1
    torch.maximum(pg_losses1, pg_losses, out=pg_losses)
    dead = clipped if dead is None else dead.logical_or_(clipped)
    n_valid32 = n_valid.to(torch.float32)
    metrics["actor/clipfrac"] = (clipped & mask).sum().to(torch.float32) / n_valid32
    metrics["actor/clipfrac_high"] = (clipped & mask & (advantages > 0)).sum().to(torch.float32) / n_valid32
    metrics["actor/clipfrac_low"] = (clipped & mask & (advantages < 0)).sum().to(torch.float32) / n_valid32
    if clip_c is not None:  # dual clip: where A < 0 the loss is capped at −A·c
        cap = torch.mul(advantages, -clip_c)
        capped = (advantages < 0).logical_and_(pg_losses > cap)
        torch.where(capped, cap, pg_losses, out=pg_losses)
        dead.logical_or_(capped)
        metrics["actor/clipfrac_lower"] = (capped & mask).sum().to(torch.float32) / n_valid32
        del cap
    grad = pg_losses1.masked_fill_(dead, 0.0)

    # KL metrics from the ratio buffers, which the loss no longer needs
    metrics["actor/approx_kl"] = -dot(valid, log_ratio) / n_valid
    metrics["actor/approx_kl_k3"] = dot(valid, ratio.sub_(1).sub_(log_ratio)) / n_valid  # (r − 1) − log r
    del log_ratio, ratio

    if weights is not None:
        pg_losses.mul_(weights)
        grad.mul_(weights)
    metrics["loss/policy"] = dot(coef, pg_losses)
    total = pg_losses

    if ref_log_prob is not None:
        # k3 with verl's clamps; d/dlog π of exp(d) − d − 1 (d = ref − log π) is 1 − exp(d)
        d = torch.sub(ref_log_prob, log_prob)
        kl_dead = (d < -20.0).logical_or_(d > 20.0)
        d.clamp_(-20.0, 20.0)
        exp_d = torch.exp(d)
        kl = torch.sub(exp_d, d).sub_(1)
        kl_dead.logical_or_(kl < -10.0).logical_or_(kl > 10.0)
        kl.clamp_(-10.0, 10.0)
        metrics["loss/kl"] = dot(coef, kl)
        grad.add_(exp_d.neg_().add_(1).mul_(kl_coef).masked_fill_(kl_dead, 0.0))
        total.add_(kl.mul_(kl_coef))
        del d, exp_d, kl
    if entropy is not None:
        metrics["loss/entropy"] = dot(coef, entropy)
        metrics["actor/entropy"] = dot(valid, entropy) / n_valid
        if entropy_coef != 0:
            total.sub_(entropy * entropy_coef)

    loss = dot(coef, total)
    return loss, grad.mul_(coef), metrics


_compiled_terms = None


def _terms(compile: bool):
    global _compiled_terms
    if not compile:
        return _actor_terms
    if _compiled_terms is None:
        _compiled_terms = torch.compile(_actor_terms)
    return _compiled_terms


class _FusedLoss(torch.autograd.Function):
    """The precomputed scalar loss; backward scales the precomputed per-token derivatives."""

    @staticmethod
    def forward(ctx, log_prob, entropy, loss, grad_log_prob, coef, entropy_coef):
        ctx.save_for_backward(grad_log_prob, coef)
        ctx.entropy_coef = entropy_coef
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_log_prob, coef = ctx.saved_tensors
        g_lp = grad_log_prob * grad_loss if ctx.needs_input_grad[0] else None
        g_ent = coef * (grad_loss * -ctx.entropy_coef) if ctx.needs_input_grad[1] else None
        return g_lp, g_ent, None, None, None, None


def fused_ppo_loss(
    *,
    log_prob,
    old_log_prob,
    advantages,
    mask,
    aggregate,
    entropy=None,
    ref_log_prob=None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP,
    weights=None,
    compile: bool = False,
):
    """``ppo_clip`` (``ppo_dual_clip`` with ``clip_c``) + ``kl_coef``·k3 − ``entropy_coef``·entropy, one node.

    ``log_prob`` (B, T) float with gradient; ``old_log_prob``, ``advantages`` (B, T) float;
    ``ref_log_prob`` (B, T) float or None (no KL term); ``entropy`` (B, T) float or None (may
    carry a gradient); ``weights`` (B, T) float or None (importance weights); ``mask`` (B, T)
    bool; ``aggregate(loss_mat, mask)`` a linear aggregation (every rllab mode is). Returns
    ``(loss, metrics)``: the 0-d total, the policy loss's metrics (``actor/approx_kl``,
    ``actor/approx_kl_k3``, ``actor/clipfrac``, ``actor/clipfrac_lower`` with ``clip_c``) and
    each component aggregated on its own: ``loss/policy``, ``loss/kl``, ``loss/entropy``, plus
    ``actor/entropy`` (masked mean).

    ``compile=True`` runs the per-token pass through ``torch.compile`` (inductor fuses it into
    a loop or two). The first call compiles — seconds to a minute on a CPU, which needs a C++
    compiler — and each new knob value or dtype compiles again; results then agree with the
    eager path to float rounding (≈1e-6 relative in float32) rather than bitwise, since the
    compiler re-associates sums.
    """
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"fused_ppo_loss: clip_c = {clip_c!r} is out of range: must be > 1.0")
    inputs = {
        "log_prob": log_prob, "old_log_prob": old_log_prob, "advantages": advantages,
        "ref_log_prob": ref_log_prob, "entropy": entropy, "weights": weights,
    }
    all_finite = check_inputs("fused_ppo_loss", mask, **inputs)
    with torch.no_grad():
        values = {k: None if v is None else v.detach() for k, v in inputs.items()}
        if not all_finite:  # NaN/inf only at masked positions (valid ones raised): select them away
            values = {k: None if v is None else zero_masked(v, mask)
                      for k, v in values.items()}
        coef = aggregation_weights(aggregate, mask, log_prob.dtype)
        loss, grad, metrics = _terms(compile)(
            values["log_prob"], values["entropy"], values["old_log_prob"], values["advantages"],
            values["ref_log_prob"], values["weights"], mask, coef,
            clip_low, clip_high, clip_c, log_ratio_clamp, float(kl_coef), float(entropy_coef),
        )
    entropy_in = entropy if entropy is not None else torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    loss = _FusedLoss.apply(log_prob, entropy_in, loss, grad, coef, float(entropy_coef))
    return loss, {k: v.detach() for k, v in metrics.items()}
