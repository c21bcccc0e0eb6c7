"""KL penalties: per-token estimators of KL(π ‖ π_ref).

Estimators — J. Schulman, "Approximating KL divergence" (2020, http://joschu.net/blog/kl-approx.html).
Each takes ``log_prob`` and ``ref_log_prob`` (B, T), the log-probs of the sampled tokens under the
policy π and the reference π_ref, and returns a (B, T) estimate. With r = log π − log π_ref and
d = −r = log π_ref − log π, for tokens sampled from π:

========================= ===================================================================
``k1`` (``kl``)           r — unbiased, high variance, can be negative
``abs``                   |r|
``k2`` (``mse``)          ½·r² — biased, low variance; its gradient is the gradient of KL
``k3`` (``low_var_kl``)   d = clamp(d, −20, 20); clamp(exp(d) − d − 1, −10, 10) — unbiased, ≥ 0
``<name>+``               straight-through: the value of ``<name>``, the gradient of ``k2``
``full``                  Σ_v π_v·(log π_v − log π_ref,v), exact, from the logits (B, T, V)
========================= ===================================================================

Why the ``+`` forms: k1 and k3 estimate the *value* of KL without bias, but their expected
gradient is not the gradient of KL; k2's is. ``k3+`` returns ``k2 − sg(k2) + sg(k3)`` (sg = stop
gradient), so the value reported and penalised is k3's and the gradient is k2's.

Reference behaviour (verl 0.9.1 ``kl_penalty``): every formula above is computed with the same
operations in the same order, so values agree bitwise on the same inputs. The clamps of ``k3``
make its gradient 0 where either clamp is active (|d| > 20 or estimate > 10), as in verl. TRL's
GRPO trainer uses k3 without clamps; ``k3`` with ``clamp=False`` reproduces it (TRL's optional
multiplication by the importance ratio, ``use_bias_correction_kl``, belongs to the policy loss).
For |d| below about 1e-3 the float32 value exp(d) − d − 1 carries an absolute rounding error of
about 1e-7 (an ulp of 1), exactly as in both references. verl declares ``full`` but does not
implement it.

``full`` is registered with ``requires=("logits",)``: the trainer passes ``logits`` and
``ref_logits`` (B, T, V) as well. It runs a custom autograd function over chunks of tokens: the
forward saves only its inputs and the (B, T) result; the backward recomputes the softmaxes chunk
by chunk. Extra memory is O(chunk · V), never another (B, T, V) float tensor besides the gradient
itself. Gradients: ∂KL/∂z_v = π_v·(log π_v − log π_ref,v − KL) for the policy logits z and
π_ref,v − π_v for the reference logits. Vocabulary entries with π_v = 0 contribute 0 (0·log 0 = 0);
π_ref,v = 0 where π_v > 0 gives +inf.

Where the penalty applies is the trainer's choice: in the reward (``rewards = scores − β·k(old,
ref)``, per token) or as a loss (``β·aggregate(k(log_prob, ref))``). Values at padded positions
are whatever the inputs hold there; the aggregation (``rllab_aggregations``) ignores them.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

import rllab

# --------------------------------------------------------------------------- estimators


def k1(*, log_prob, ref_log_prob, config):
    """k1: log π − log π_ref per token (unbiased KL estimate, high variance).

    ``log_prob``, ``ref_log_prob`` (B, T) float → (B, T).
    """
    rllab.check_same_shape("kl_penalty 'k1'", log_prob=log_prob, ref_log_prob=ref_log_prob)
    return log_prob - ref_log_prob


def abs_kl(*, log_prob, ref_log_prob, config):
    """abs: |log π − log π_ref| per token.

    ``log_prob``, ``ref_log_prob`` (B, T) float → (B, T).
    """
    rllab.check_same_shape("kl_penalty 'abs'", log_prob=log_prob, ref_log_prob=ref_log_prob)
    return (log_prob - ref_log_prob).abs()


def k2(*, log_prob, ref_log_prob, config):
    """k2: ½·(log π − log π_ref)² per token (its gradient is the KL gradient).

    ``log_prob``, ``ref_log_prob`` (B, T) float → (B, T).
    """
    rllab.check_same_shape("kl_penalty 'k2'", log_prob=log_prob, ref_log_prob=ref_log_prob)
    return 0.5 * (log_prob - ref_log_prob).square()


@attrs.frozen
class K3Config:
    """Knobs of k3 (and k3+)."""

    clamp: bool = rllab.knob(
        True,
        help="clamp d = log π_ref − log π to ±20 and the estimate to ±10 (verl; gradient 0 where "
        "clamped); False = TRL's unclamped exp(d) − d − 1",
    )


def k3(*, log_prob, ref_log_prob, config):
    """k3 (low_var_kl): exp(d) − d − 1 with d = log π_ref − log π, clamped as verl.

    ``log_prob``, ``ref_log_prob`` (B, T) float → (B, T), ≥ 0. With ``clamp`` (default) d is
    clamped to [−20, 20] and the estimate to [−10, 10]; the gradient is 0 where a clamp is active.
    """
    rllab.check_same_shape("kl_penalty 'k3'", log_prob=log_prob, ref_log_prob=ref_log_prob)
    d = ref_log_prob - log_prob
    if config.clamp:
        d = torch.clamp(d, min=-20.0, max=20.0)
    kld = torch.exp(d) - d - 1
    if config.clamp:
        kld = torch.clamp(kld, min=-10.0, max=10.0)
    return kld


def _straight_through(base, name: str):
    """The ``+`` form of ``base``: its value, with the gradient of k2."""

    def penalty(*, log_prob, ref_log_prob, config):
        value = base(log_prob=log_prob, ref_log_prob=ref_log_prob, config=config)
        grad_source = 0.5 * (log_prob - ref_log_prob).square()
        # (k2 − sg(k2)) is exactly 0 in value, so the result equals the base value bitwise.
        return grad_source - grad_source.detach() + value.detach()

    penalty.__name__ = penalty.__qualname__ = name.replace("+", "_plus")
    penalty.__doc__ = (
        f"{name}: value of {name[:-1]}, gradient of k2 (straight-through, unbiased KL gradient).\n\n"
        "    ``log_prob``, ``ref_log_prob`` (B, T) float → (B, T).\n    "
    )
    return penalty


k1_plus = _straight_through(k1, "k1+")
abs_plus = _straight_through(abs_kl, "abs+")
k2_plus = _straight_through(k2, "k2+")
k3_plus = _straight_through(k3, "k3+")


# --------------------------------------------------------------------------- full KL from logits

_CHUNK_ELEMENTS = 1 << 24  # 64 MiB per float32 chunk buffer


@attrs.frozen
class FullKLConfig:
    """Knobs of full."""

    chunk_tokens: int | None = rllab.knob(
        None,
        help="tokens per chunk of the vocabulary softmaxes; None = as many as fit in 2^24 "
        "elements (64 MiB of float32 per buffer)",
        gt=0,
    )


def _log_softmaxes(z, y, dtype):
    return F.log_softmax(z, dim=-1, dtype=dtype), F.log_softmax(y, dim=-1, dtype=dtype)


class _FullKL(torch.autograd.Function):
    """KL(softmax(z) ‖ softmax(y)) per row of (N, V) logits, chunked over rows."""

    @staticmethod
    def forward(ctx, z, y, chunk: int, dtype: torch.dtype):
        n = z.shape[0]
        kl = torch.empty(n, dtype=dtype, device=z.device)
        for s in range(0, n, chunk):
            log_p, log_q = _log_softmaxes(z[s : s + chunk], y[s : s + chunk], dtype)
            term = torch.sub(log_p, log_q, out=log_q)  # log p − log q, in log_q's buffer
            p = log_p.exp_()
            term.mul_(p).masked_fill_(p == 0, 0.0)  # 0·log 0 = 0
            kl[s : s + chunk] = term.sum(-1)
        ctx.save_for_backward(z, y, kl)
        ctx.chunk, ctx.dtype = chunk, dtype
        return kl

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_kl):
        z, y, kl = ctx.saved_tensors
        need_z, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_z = torch.empty_like(z) if need_z else None
        grad_y = torch.empty_like(y) if need_y else None
        for s in range(0, z.shape[0], ctx.chunk):
            e = s + ctx.chunk
            g = grad_kl[s:e, None].to(ctx.dtype)
            log_p, log_q = _log_softmaxes(z[s:e], y[s:e], ctx.dtype)
            if need_y:  # ∂KL/∂y = q − p
                grad_y[s:e] = (log_q.exp() - log_p.exp()).mul_(g)
            diff = torch.sub(log_p, log_q, out=log_q)
            p = log_p.exp_()
            if need_z:  # ∂KL/∂z = p·(log p − log q − KL)
                grad_z[s:e] = diff.sub_(kl[s:e, None]).mul_(p).masked_fill_(p == 0, 0.0).mul_(g)
        return grad_z, grad_y, None, None


def full(*, log_prob, ref_log_prob, logits, ref_logits, config):
    """full: exact KL(π(·|x_<t) ‖ π_ref(·|x_<t)) per token, summed over the vocabulary.

    ``logits``, ``ref_logits`` (B, T, V) float: policy and reference logits at the response
    positions. ``log_prob``, ``ref_log_prob`` (B, T) are accepted for the common signature and
    shape-checked, not used. Returns (B, T) in float32 (float64 for float64 logits), ≥ 0 up to
    rounding; differentiable with respect to both logits.
    """
    where = "kl_penalty 'full'"
    if logits.ndim < 2:
        raise ValueError(f"{where}: logits must be (B, T, V), got shape {tuple(logits.shape)}")
    rllab.check_same_shape(where, logits=logits, ref_logits=ref_logits)
    for name, t in (("log_prob", log_prob), ("ref_log_prob", ref_log_prob)):
        if t is not None and t.shape != logits.shape[:-1]:
            raise ValueError(
                f"{where}: {name} has shape {tuple(t.shape)} but logits has shape {tuple(logits.shape)} "
                f"(expected {name} {tuple(logits.shape[:-1])})"
            )
    V = logits.shape[-1]
    dtype = torch.promote_types(torch.promote_types(logits.dtype, ref_logits.dtype), torch.float32)
    chunk = config.chunk_tokens or max(1, _CHUNK_ELEMENTS // max(V, 1))
    kl = _FullKL.apply(logits.reshape(-1, V), ref_logits.reshape(-1, V), chunk, dtype)
    return kl.reshape(logits.shape[:-1])
