"""Log-probs and entropy of a language model's tokens, computed in chunks (from logits or hidden states).

A policy-gradient step needs, for every response token ``y_t``, the log-probability
``log π(y_t | y_<t)`` and often the entropy ``H_t = −Σ_v π(v) log π(v)`` of the whole next-token
distribution. Written densely (``log_softmax(logits).gather(...)`` plus a softmax for the entropy)
that costs several ``(N, V)`` float32 tensors on top of the logits — with a 151,936-token
vocabulary a single one is 2.5 GB for 4,096 tokens — and autograd keeps most of them alive until
the backward pass.

The functions here work on chunks of tokens instead and keep only ``(N,)`` statistics (the
log-normaliser ``lse`` and the entropy) between forward and backward. The backward pass recomputes
each chunk's softmax and writes the closed-form gradients

    ∂ log π(y) / ∂z_v = 1[v = y] − π(v)
    ∂ H / ∂z_v        = −π(v) · (log π(v) + H)

where ``z = logits / temperature``. :func:`logprobs_from_hidden` goes one step further and runs
the LM-head projection per tile (a block of tokens × a block of the vocabulary, the softmax
streamed over vocabulary tiles), so the ``(N, V)`` logits never exist, in the forward or in the
backward pass. The price is recomputing the projection in backward: four matmuls instead of three,
as in every fused linear + cross-entropy kernel whose upstream gradient is not known in forward.

Shapes: ``N`` flattened tokens, ``V`` vocabulary, ``D`` hidden size.
"""

from __future__ import annotations

import math

import torch

from rllab.kernels import triton_impl as _triton  # CUDA fast path; see the dispatch in the public functions

__all__ = ["CHUNK_ELEMENTS", "HIDDEN_CHUNK_TOKENS", "logprobs_from_hidden", "logprobs_from_logits"]

from rllab.kernels.args import (  # noqa: F401  (the tile sizes and checks are part of this module's API)
    CHUNK_ELEMENTS,
    HIDDEN_CHUNK_TOKENS,
    _check_labels,
    _check_temperature,
    _chunk_rows,
    _hidden_tile,
)
from rllab.kernels.autograd import _backward_start, _keep  # the autograd hand-over shared with the Triton path

# --------------------------------------------------------------------------- chunk math


def _blocks(B: int, T: int, rows: int):
    """(b0, b1, t0, t1) blocks of about ``rows`` tokens covering a (B, T) grid, in order."""
    if B == 0 or T == 0:
        return
    if T >= rows:
        for b in range(B):
            for t0 in range(0, T, rows):
                yield b, b + 1, t0, min(t0 + rows, T)
    else:
        per = max(1, rows // T)
        for b0 in range(0, B, per):
            yield b0, min(b0 + per, B), 0, T


class _Scratch:
    """Chunk-sized buffers reused by every chunk of one call.

    A fresh chunk-sized allocation costs page faults on first touch that take longer than the
    arithmetic done in it, so each buffer is allocated once per call and viewed to each chunk's
    shape.
    """

    def __init__(self, numel: int, device: torch.device):
        self.numel, self.device, self.bufs = numel, device, {}

    def __call__(self, name: str, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buf = self.bufs.get((name, dtype))
        if buf is None:
            buf = self.bufs[name, dtype] = torch.empty(self.numel, dtype=dtype, device=self.device)
        return buf[: math.prod(shape)].view(shape)


def _stats(z: torch.Tensor, labels: torch.Tensor, with_entropy: bool, scratch: _Scratch, own_z: bool):
    """log π(label), lse and (optionally) the entropy of one float32 chunk ``z`` (..., V).

    ``z`` is read only, unless ``own_z`` (then it is reused as a buffer).
    """
    z_label = z.gather(-1, labels.unsqueeze(-1))
    z_max, arg_max = z.max(dim=-1, keepdim=True)
    log_p = scratch("log_p", z.shape)
    torch._log_softmax(z, -1, False, out=log_p)  # the fused kernel behind log_softmax, into a buffer
    lse = z_max - log_p.gather(-1, arg_max)  # log p at the max is −log Σ exp(z − max) exactly
    log_prob = (z_label - lse).squeeze(-1)
    if not with_entropy:
        return log_prob, lse.squeeze(-1), None
    p = torch.exp(log_p, out=z if own_z else scratch("p", z.shape))
    # clamp so a −inf logit contributes 0·(finite) = 0 instead of 0·(−inf) = NaN
    entropy = -log_p.clamp_min_(torch.finfo(log_p.dtype).min).mul_(p).sum(-1)
    return log_prob, lse.squeeze(-1), entropy


def _grad_z(d: torch.Tensor, labels, entropy, g_lp, g_ent, scratch: _Scratch, in_tile=None) -> torch.Tensor:
    """Gradient w.r.t. the scaled logits ``z`` of one chunk, written over ``d``.

    On entry ``d`` holds ``log p`` for the chunk; on exit it holds
    ``g_lp·(onehot(label) − p) − g_ent·p·(log p + H)``. For a vocabulary tile, ``labels`` are
    tile-local column indices and ``in_tile`` (bool) says which rows' labels fall in the tile.
    """
    if g_ent is None:
        d.exp_().mul_(-g_lp.unsqueeze(-1))
    else:
        p = torch.exp(d, out=scratch("p", d.shape))
        d.clamp_min_(torch.finfo(d.dtype).min).add_(entropy.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1))
        if g_lp is not None:
            d.add_(g_lp.unsqueeze(-1))
        d.mul_(p).neg_()
    if g_lp is not None:
        src = g_lp if in_tile is None else torch.where(in_tile, g_lp, 0.0)
        d.scatter_add_(-1, labels.unsqueeze(-1), src.unsqueeze(-1))
    return d


def _upstream(g: torch.Tensor | None, index) -> torch.Tensor | None:
    return None if g is None else g[index]


class _LogitsLogProb(torch.autograd.Function):
    """log π(label) [and entropy] from (B, T, V) logits, chunked over tokens in both passes."""

    @staticmethod
    def forward(ctx, logits, labels, rows, temperature, with_entropy):
        B, T, V = logits.shape
        log_prob = torch.empty(B, T, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(log_prob)
        entropy = torch.empty_like(log_prob) if with_entropy else None
        scratch = _Scratch(rows * V, logits.device)
        convert = logits.dtype != torch.float32 or temperature != 1.0
        for b0, b1, t0, t1 in _blocks(B, T, rows):
            z = logits[b0:b1, t0:t1]
            if convert:
                z = scratch("z", z.shape).copy_(z)
                if temperature != 1.0:
                    z.div_(temperature)
            lp, s, ent = _stats(z, labels[b0:b1, t0:t1], with_entropy, scratch, own_z=convert)
            log_prob[b0:b1, t0:t1] = lp
            lse[b0:b1, t0:t1] = s
            if with_entropy:
                entropy[b0:b1, t0:t1] = ent
        del scratch
        _keep(ctx, (logits, labels, lse, entropy), rows=rows, temperature=temperature)
        return (log_prob, entropy) if with_entropy else log_prob

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp, g_ent=None):
        start = _backward_start(ctx, g_lp, g_ent, n_diff=1)
        if start is None:
            return None, None, None, None, None
        (logits, labels, lse, entropy), _, g_lp, g_ent = start
        B, T, V = logits.shape
        tau = ctx.temperature
        grad = torch.empty(B, T, V, dtype=logits.dtype, device=logits.device)
        in_place = grad.dtype == torch.float32  # compute straight into the gradient's storage
        scratch = _Scratch(ctx.rows * V, logits.device)
        for b0, b1, t0, t1 in _blocks(B, T, ctx.rows):
            sl = (slice(b0, b1), slice(t0, t1))
            x, out, s = logits[sl], grad[sl], lse[sl].unsqueeze(-1)
            d = out if in_place else scratch("d", out.shape)
            if in_place and tau == 1.0:
                torch.sub(x, s, out=d)
            else:
                d.copy_(x)
                if tau != 1.0:
                    d.div_(tau)
                d.sub_(s)
            ent = None if entropy is None else entropy[sl]
            _grad_z(d, labels[sl], ent, _upstream(g_lp, sl), _upstream(g_ent, sl), scratch)
            if tau != 1.0:
                d.div_(tau)
            if not in_place:
                out.copy_(d)
        return grad, None, None, None, None


def _project(h, weight, bias, temperature, scratch: _Scratch) -> torch.Tensor:
    """float32 ``(h @ weightᵀ + bias) / temperature`` for one tile, into a scratch buffer.

    The matmul runs in the head's dtype, as ``nn.Linear`` would.
    """
    shape = (h.shape[0], weight.shape[0])
    z = scratch("z", shape)
    out = z if weight.dtype == torch.float32 else scratch("z_head", shape, weight.dtype)
    if bias is not None:
        torch.addmm(bias, h, weight.t(), out=out)
    else:
        torch.matmul(h, weight.t(), out=out)
    if out is not z:
        z.copy_(out)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _tile(labels: torch.Tensor, v0: int, v1: int):
    """Tile-local label columns (clamped into the tile) and which labels fall in [v0, v1)."""
    in_tile = (labels >= v0) & (labels < v1)
    return (labels - v0).clamp_(0, v1 - v0 - 1), in_tile


def _online_stats(h, weight, bias, labels, temperature, cols, with_entropy, scratch):
    """log π(label), lse and entropy for rows ``h`` with the vocabulary in tiles of ``cols``.

    A streaming softmax: per row it keeps the running max ``m``, ``s = Σ exp(z − m)`` and
    ``t = Σ exp(z − m)·(z − m)``, rescaled when ``m`` grows. At the end ``lse = m + log s`` and
    ``H = lse − Σ p·z = log s − t / s``.
    """
    n, V = h.shape[0], weight.shape[0]
    lowest = torch.finfo(torch.float32).min  # a finite "−inf", so rescaling never makes 0·inf
    m = torch.full((n,), lowest, dtype=torch.float32, device=h.device)
    s = torch.zeros_like(m)
    t = torch.zeros_like(m) if with_entropy else None
    z_label = torch.zeros_like(m)
    for v0 in range(0, V, cols):
        v1 = min(v0 + cols, V)
        z = _project(h, weight[v0:v1], None if bias is None else bias[v0:v1], temperature, scratch)
        local, in_tile = _tile(labels, v0, v1)
        z_label = torch.where(in_tile, z.gather(-1, local.unsqueeze(-1)).squeeze(-1), z_label)
        m_new = torch.maximum(m, z.amax(-1))
        scale = torch.exp(m - m_new)
        u = z.sub_(m_new.unsqueeze(-1))  # z − m_new, in place
        if with_entropy:
            p = torch.exp(u, out=scratch("p", u.shape))
            t = scale * (t + (m - m_new) * s) + u.clamp_min_(lowest).mul_(p).sum(-1)
            s = scale * s + p.sum(-1)
        else:
            s = scale * s + u.exp_().sum(-1)
        m = m_new
    log_s = s.log()
    lse = m + log_s
    entropy = log_s - t / s if with_entropy else None
    return z_label - lse, lse, entropy


class _HiddenLogProb(torch.autograd.Function):
    """log π(label) [and entropy] from (N, D) hidden states and a (V, D) head.

    Tiles of ``rows`` tokens × ``cols`` vocabulary entries; with ``cols ≥ V`` a tile is a whole
    row chunk (exact softmax per chunk), otherwise the forward streams over vocabulary tiles.
    Backward recomputes each tile's logits from the saved ``lse`` and entropy.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, rows, cols, temperature, with_entropy):
        N, V = hidden.shape[0], weight.shape[0]
        log_prob = torch.empty(N, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(log_prob)
        entropy = torch.empty_like(log_prob) if with_entropy else None
        scratch = _Scratch(rows * min(cols, V), hidden.device)
        for s in range(0, N, rows):
            e = min(s + rows, N)
            if cols >= V:
                z = _project(hidden[s:e], weight, bias, temperature, scratch)
                lp, m, ent = _stats(z, labels[s:e], with_entropy, scratch, own_z=True)
            else:
                lp, m, ent = _online_stats(
                    hidden[s:e], weight, bias, labels[s:e], temperature, cols, with_entropy, scratch
                )
            log_prob[s:e], lse[s:e] = lp, m
            if with_entropy:
                entropy[s:e] = ent
        del scratch
        _keep(ctx, (hidden, weight, bias, labels, lse, entropy), rows=rows, cols=cols, temperature=temperature)
        return (log_prob, entropy) if with_entropy else log_prob

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp, g_ent=None):
        start = _backward_start(ctx, g_lp, g_ent, n_diff=3)
        if start is None:
            return (None,) * 8
        (hidden, weight, bias, labels, lse, entropy), (need_h, need_w, need_b), g_lp, g_ent = start
        N, V = hidden.shape[0], weight.shape[0]
        rows, cols, tau = ctx.rows, min(ctx.cols, V), ctx.temperature
        acc = torch.float32  # gradients accumulate in float32 whatever the parameter dtype
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        scratch = _Scratch(rows * cols, hidden.device)
        for s in range(0, N, rows):
            e = min(s + rows, N)
            h = hidden[s:e]
            h_acc = h.to(acc)
            for v0 in range(0, V, cols):
                v1 = min(v0 + cols, V)
                w = weight[v0:v1]
                b = None if bias is None else bias[v0:v1]
                d = _project(h, w, b, tau, scratch).sub_(lse[s:e].unsqueeze(-1))  # log p
                local, in_tile = (labels[s:e], None) if cols >= V else _tile(labels[s:e], v0, v1)
                ent = None if entropy is None else entropy[s:e]
                _grad_z(d, local, ent, _upstream(g_lp, slice(s, e)), _upstream(g_ent, slice(s, e)), scratch, in_tile)
                if tau != 1.0:
                    d.div_(tau)
                if need_b:
                    grad_b[v0:v1] += d.sum(0)
                if need_w:
                    grad_w[v0:v1].addmm_(d.t(), h_acc)
                if need_h:
                    grad_h[s:e].addmm_(d, w.to(acc))
        if grad_h is not None:
            grad_h = grad_h.to(hidden.dtype)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None


# --------------------------------------------------------------------------- public kernels


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    temperature: float = 1.0,
):
    """log π(label) and, optionally, the entropy of ``softmax(logits / temperature)``, in chunks.

    Equal (to float32 rounding) to ``log_softmax(logits / τ).gather(-1, labels)`` and
    ``−Σ softmax · log_softmax``, values and gradients, but never materialises a second ``(N, V)``
    tensor: forward and backward each hold about one chunk of float32 logits (plus the ``(N, V)``
    gradient itself in backward, which autograd needs anyway). Computation is in float32 whatever
    the logits' dtype; the gradient has the logits' dtype.

    :param logits: ``(N, V)`` or ``(B, T, V)``, any float dtype; may be a strided view such as
        ``model_logits[:, -T - 1:-1]`` (it is not copied).
    :param labels: ``(N,)`` or ``(B, T)`` integer token ids in ``[0, V)``.
    :param chunk_size: tokens per chunk; ``None`` picks ``CHUNK_ELEMENTS // V`` (128 MiB chunks).
    :param with_entropy: also return the entropy.
    :param temperature: τ > 0; logits are divided by it first, as rollout sampling does.
    :returns: ``log_prob`` float32 with the labels' shape, and ``entropy`` (same shape) when
        ``with_entropy``.
    """
    where = "logprobs_from_logits"
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"{where}: logits must be a floating-point tensor, got {getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.ndim not in (2, 3):
        raise ValueError(f"{where}: logits must be (N, V) or (B, T, V), got shape {tuple(logits.shape)}")
    _check_labels(where, labels, tuple(logits.shape[:-1]), f"logits of shape {tuple(logits.shape)}")
    rows = _chunk_rows(chunk_size, logits.shape[-1], where)
    tau = _check_temperature(temperature, where)
    if logits.shape[-1] == 0:
        raise ValueError(f"{where}: logits has an empty vocabulary dimension, shape {tuple(logits.shape)}")
    # CUDA inputs take the Triton kernels (chunk_size does not apply there; RLLAB_TRITON=0 turns them off)
    if _triton.supports(logits):
        return _triton.logprobs_from_logits(logits, labels, with_entropy=with_entropy, temperature=tau)
    flat = logits.ndim == 2
    x = logits.unsqueeze(0) if flat else logits
    y = (labels.unsqueeze(0) if flat else labels).long()
    out = _LogitsLogProb.apply(x, y, rows, tau, bool(with_entropy))
    if flat:
        return tuple(o.squeeze(0) for o in out) if with_entropy else out.squeeze(0)
    return out


def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    vocab_chunk_size: int | None = None,
):
    """log π(label) [and entropy] of ``softmax((hidden @ Wᵀ + bias) / τ)``, projecting per tile.

    The full ``(N, V)`` logits never exist, in forward or backward. The work is cut into tiles of
    ``chunk_size`` tokens × ``vocab_chunk_size`` vocabulary rows of the head (at most
    ``CHUNK_ELEMENTS`` logits each); the forward streams the softmax over the vocabulary tiles of
    a token chunk, and backward recomputes each tile's logits to accumulate the gradients of
    ``hidden``, ``lm_head_weight`` and ``bias``. Tall tiles (many tokens, part of the vocabulary)
    keep the matmuls efficient and read the head once per token chunk.

    The projection runs in the head's dtype (as ``nn.Linear`` would); softmax statistics and
    gradient accumulation are float32.

    :param hidden: ``(N, D)`` or ``(B, T, D)`` final hidden states (after the last norm).
    :param lm_head_weight: ``(V, D)``, e.g. ``model.lm_head.weight``; same dtype as ``hidden``.
    :param labels: ``(N,)`` or ``(B, T)`` integer token ids in ``[0, V)``.
    :param bias: optional ``(V,)`` head bias.
    :param chunk_size: tokens per tile; ``None`` takes up to ``HIDDEN_CHUNK_TOKENS`` tokens
        (or ``CHUNK_ELEMENTS // vocab_chunk_size`` when that is given).
    :param vocab_chunk_size: vocabulary entries per tile; ``None`` fills the budget,
        ``CHUNK_ELEMENTS // chunk_size`` (the whole vocabulary when that is larger).
    :param with_entropy: also return the entropy.
    :param temperature: τ > 0 dividing the logits.
    :returns: ``log_prob`` float32 with the labels' shape [, ``entropy``].
    """
    where = "logprobs_from_hidden"
    for name, t in (("hidden", hidden), ("lm_head_weight", lm_head_weight)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{where}: {name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if hidden.ndim not in (2, 3):
        raise ValueError(f"{where}: hidden must be (N, D) or (B, T, D), got shape {tuple(hidden.shape)}")
    if lm_head_weight.ndim != 2 or lm_head_weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"{where}: lm_head_weight must be (V, D) with D = {hidden.shape[-1]} (from hidden of shape "
            f"{tuple(hidden.shape)}), got shape {tuple(lm_head_weight.shape)}"
        )
    if hidden.dtype != lm_head_weight.dtype:
        raise TypeError(f"{where}: hidden is {hidden.dtype} but lm_head_weight is {lm_head_weight.dtype}")
    V = lm_head_weight.shape[0]
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (V,)):
        raise ValueError(f"{where}: bias must have shape ({V},), got {tuple(getattr(bias, 'shape', ()))}")
    if bias is not None and bias.dtype != lm_head_weight.dtype:
        raise TypeError(f"{where}: bias is {bias.dtype} but lm_head_weight is {lm_head_weight.dtype}")
    _check_labels(where, labels, tuple(hidden.shape[:-1]), f"hidden of shape {tuple(hidden.shape)}")
    tau = _check_temperature(temperature, where)
    # CUDA inputs take the Triton kernels (they choose their own tiles; RLLAB_TRITON=0 turns them off)
    if _triton.supports(hidden, lm_head_weight, bias):
        return _triton.logprobs_from_hidden(hidden, lm_head_weight, labels, with_entropy=with_entropy, bias=bias, temperature=tau)
    lead = labels.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    rows, cols = _hidden_tile(chunk_size, vocab_chunk_size, h.shape[0], V, where)
    out = _HiddenLogProb.apply(
        h, lm_head_weight, bias, labels.reshape(-1).long(), rows, cols, tau, bool(with_entropy)
    )
    if with_entropy:
        return out[0].view(lead), out[1].view(lead)
    return out.view(lead)
