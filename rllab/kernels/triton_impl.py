"""Triton kernels for log-probs and entropy on CUDA tensors.

:func:`rllab.kernels.chunked.logprobs_from_logits` and :func:`rllab.kernels.chunked.logprobs_from_hidden` call
:func:`logprobs_from_logits` / :func:`logprobs_from_hidden` here when :func:`supports` says the
inputs can take this path (CUDA tensors, float16 / bfloat16 / float32, Triton importable, and
``RLLAB_TRITON`` not set to ``0``). The math is the same as the torch path's: per token the
log-normaliser ``lse``, ``log π(label) = z_label − lse`` and ``H = lse − Σ p·z`` of
``z = logits / τ``, all accumulated in float32, and in backward

    ∂L/∂z_v = g_lp · (1[v = label] − p_v) − g_ent · p_v · (log p_v + H)

Logits path: one Triton program per token streams the vocabulary once in forward (an online
softmax that keeps, per lane, the running max ``m``, ``s = Σ exp(z − m)`` and
``t = Σ exp(z − m)·(z − m)``) and once in backward, writing the gradient directly in the
logits' dtype. No float32 ``(N, V)`` intermediate exists in either pass.

Hidden-state path: the work is cut into tiles of ``rows`` tokens × ``cols`` vocabulary entries
(32 MiB of logits in the head's dtype by default). Each tile's logits come from one cuBLAS
matmul in the head's dtype (as ``nn.Linear`` computes them), written into one reused buffer; a
Triton kernel folds the tile into the per-token running statistics. Backward recomputes each
tile, a Triton kernel turns it into ``∂L/∂z`` in place, and two more matmuls accumulate
``grad_weight`` (into the gradient tensor itself) and ``grad_hidden`` (float32 per token chunk).
Four matmuls in all, the fewest possible when the per-token upstream gradients are only known
in backward. Peak extra memory is the two gradients plus one tile and one token chunk's float32
accumulator.
"""

from __future__ import annotations

import os

import torch

from rllab.kernels.autograd import _backward_start, _keep  # the autograd hand-over shared with the torch path

try:  # Triton is optional: without it (or on CPU) rllab.kernels.chunked keeps its torch path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None
    tl = None

__all__ = ["TILE_BYTES", "available", "logprobs_from_hidden", "logprobs_from_logits", "supports"]

TILE_BYTES = 32 << 20
"""Logits bytes per tile of the hidden-state path (in the head's dtype)."""

TILE_ROWS = 2048
"""Default tokens per tile of the hidden-state path (with bfloat16 and ``TILE_BYTES`` that makes
8,192 vocabulary entries per tile; measured on an H100 at D = 896, N = 32,768: 78 ms against
93 ms for 4,096 × 4,096 and 82 ms for 8,192 × 2,048)."""

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def available() -> bool:
    """Triton is importable and not switched off with ``RLLAB_TRITON=0``."""
    return triton is not None and os.environ.get("RLLAB_TRITON", "1") != "0"


def supports(*tensors: torch.Tensor | None) -> bool:
    """Whether the Triton path can take these inputs: all on one CUDA device, supported dtypes."""
    if not available():
        return False
    ts = [t for t in tensors if t is not None]
    return (
        bool(ts)
        and all(t.is_cuda and t.dtype in _DTYPES for t in ts)
        and len({t.device for t in ts}) == 1
        and all(t.numel() > 0 for t in ts)
    )


if triton is not None:

    @triton.jit
    def _stats_kernel(
        Z, n_inner, stride_outer, stride_inner, n_cols, v0,
        LABELS, M, S, T, ZL, inv_tau,
        FIRST: tl.constexpr, WITH_ENT: tl.constexpr, BLOCK: tl.constexpr,
    ):
        """Fold one row's ``n_cols`` logits (vocabulary columns ``v0…``) into its running stats."""
        row = tl.program_id(0)
        outer = row // n_inner
        inner = row - outer * n_inner
        z_row = Z + outer.to(tl.int64) * stride_outer + inner.to(tl.int64) * stride_inner
        offs = tl.arange(0, BLOCK)
        m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK], tl.float32)
        t_vec = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            z = tl.load(z_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32) * inv_tau
            m_new = tl.maximum(m_vec, z)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # keeps all-(−inf) lanes NaN-free
            a = tl.exp(m_vec - m_ref)
            e = tl.exp(z - m_ref)
            if WITH_ENT:
                shift = tl.where(s_vec > 0, (m_vec - m_ref) * s_vec, 0.0)
                t_vec = a * (t_vec + shift) + tl.where(e > 0, e * (z - m_ref), 0.0)
            s_vec = a * s_vec + e
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        a = tl.exp(m_vec - m_ref)
        s = tl.sum(a * s_vec, axis=0)
        t = 0.0
        if WITH_ENT:
            t = tl.sum(a * (t_vec + tl.where(s_vec > 0, (m_vec - m_ref) * s_vec, 0.0)), axis=0)
        if not FIRST:  # merge with the stats of the vocabulary tiles before this one
            m0 = tl.load(M + row)
            s0 = tl.load(S + row)
            m_new = tl.maximum(m, m0)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            a0 = tl.exp(m0 - m_ref)
            a1 = tl.exp(m - m_ref)
            if WITH_ENT:
                t0 = tl.load(T + row)
                t = a0 * (t0 + tl.where(s0 > 0, (m0 - m_ref) * s0, 0.0)) + a1 * (
                    t + tl.where(s > 0, (m - m_ref) * s, 0.0)
                )
            s = a0 * s0 + a1 * s
            m = m_new
        tl.store(M + row, m)
        tl.store(S + row, s)
        if WITH_ENT:
            tl.store(T + row, t)
        label = tl.load(LABELS + row) - v0
        if (label >= 0) & (label < n_cols):
            tl.store(ZL + row, tl.load(z_row + label).to(tl.float32) * inv_tau)

    @triton.jit
    def _grad_kernel(
        Z, n_inner, stride_outer, stride_inner, G, stride_g, n_cols, v0,
        LABELS, LSE, ENT, GLP, GENT, inv_tau,
        HAS_GLP: tl.constexpr, HAS_GENT: tl.constexpr, BLOCK: tl.constexpr,
    ):
        """∂L/∂(logits) for one row's block of columns, written to ``G`` (may alias ``Z``)."""
        row = tl.program_id(0)
        outer = row // n_inner
        inner = row - outer * n_inner
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z_row = Z + outer.to(tl.int64) * stride_outer + inner.to(tl.int64) * stride_inner
        z = tl.load(z_row + cols, mask=mask, other=0.0).to(tl.float32) * inv_tau
        log_p = z - tl.load(LSE + row)
        p = tl.exp(log_p)
        d = tl.zeros([BLOCK], tl.float32)
        if HAS_GENT:
            d = -tl.load(GENT + row) * tl.where(p > 0, p * (log_p + tl.load(ENT + row)), 0.0)
        if HAS_GLP:
            hit = (cols + v0) == tl.load(LABELS + row)
            d += tl.load(GLP + row) * (tl.where(hit, 1.0, 0.0) - p)
        d = d * inv_tau
        tl.store(G + row.to(tl.int64) * stride_g + cols, d.to(G.dtype.element_ty), mask=mask)


_STATS_BLOCK = 4096
_GRAD_BLOCK = 2048


def _block(n: int, cap: int) -> int:
    return min(cap, max(16, triton.next_power_of_2(n)))


def _fold(z, n_inner, stride_outer, stride_inner, n_rows, n_cols, v0, labels, stats, inv_tau, first, with_ent):
    """Fold ``n_rows`` rows of logits ``z`` (columns ``v0 … v0 + n_cols``) into ``stats``."""
    m, s, t, zl = stats
    _stats_kernel[(n_rows,)](
        z, n_inner, stride_outer, stride_inner, n_cols, v0, labels, m, s, t, zl, inv_tau,
        FIRST=first, WITH_ENT=with_ent, BLOCK=_block(n_cols, _STATS_BLOCK), num_warps=8,
    )


def _new_stats(n: int, device, with_ent: bool):
    m = torch.empty(n, dtype=torch.float32, device=device)
    s = torch.empty_like(m)
    t = torch.empty_like(m) if with_ent else m  # a placeholder pointer when unused
    zl = torch.zeros_like(m)
    return m, s, t, zl


def _finish(stats, with_ent: bool):
    m, s, t, zl = stats
    log_s = s.log()
    lse = m + log_s
    entropy = log_s - t / s if with_ent else None
    return zl - lse, lse, entropy


def _grad(z, n_inner, stride_outer, stride_inner, g, stride_g, n_rows, n_cols, v0, labels, lse, ent, g_lp, g_ent, inv_tau):
    dummy = lse
    _grad_kernel[(n_rows, triton.cdiv(n_cols, _GRAD_BLOCK))](
        z, n_inner, stride_outer, stride_inner, g, stride_g, n_cols, v0,
        labels, lse, dummy if ent is None else ent,
        dummy if g_lp is None else g_lp, dummy if g_ent is None else g_ent, inv_tau,
        HAS_GLP=g_lp is not None, HAS_GENT=g_ent is not None, BLOCK=_block(n_cols, _GRAD_BLOCK), num_warps=8,
    )


def _upstream(g: torch.Tensor | None) -> torch.Tensor | None:
    """A float32 upstream gradient (from ``_backward_start``) as the kernels read it: flat, contiguous."""
    return None if g is None else g.reshape(-1).contiguous()


# --------------------------------------------------------------------------- logits path


class _LogitsLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy):
        B, T, V = logits.shape
        x = logits if logits.stride(-1) == 1 else logits.contiguous()
        stats = _new_stats(B * T, logits.device, with_entropy)
        _fold(x, T, x.stride(0), x.stride(1), B * T, V, 0, labels, stats, 1.0 / temperature, True, with_entropy)
        log_prob, lse, entropy = _finish(stats, with_entropy)
        _keep(ctx, (x, labels, lse, entropy), temperature=temperature)
        log_prob = log_prob.view(B, T)
        return (log_prob, entropy.view(B, T)) if with_entropy else log_prob

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp, g_ent=None):
        start = _backward_start(ctx, g_lp, g_ent, n_diff=1)
        if start is None:
            return None, None, None, None
        (x, labels, lse, entropy), _, g_lp, g_ent = start
        B, T, V = x.shape
        grad = torch.empty((B, T, V), dtype=x.dtype, device=x.device)
        _grad(
            x, T, x.stride(0), x.stride(1), grad, V, B * T, V, 0, labels, lse, entropy,
            _upstream(g_lp), _upstream(g_ent), 1.0 / ctx.temperature,
        )
        return grad, None, None, None


def logprobs_from_logits(logits, labels, *, with_entropy=False, temperature=1.0):
    """Triton version of :func:`rllab.kernels.chunked.logprobs_from_logits` (arguments already checked)."""
    flat = logits.ndim == 2
    x = logits.unsqueeze(0) if flat else logits
    y = (labels.unsqueeze(0) if flat else labels).reshape(-1).long().contiguous()
    out = _LogitsLogProb.apply(x, y, float(temperature), bool(with_entropy))
    if flat:
        return tuple(o.squeeze(0) for o in out) if with_entropy else out.squeeze(0)
    return out


# --------------------------------------------------------------------------- hidden-state path


def _tiles(N: int, V: int, dtype: torch.dtype, rows: int | None, cols: int | None) -> tuple[int, int]:
    rows = min(N, rows or TILE_ROWS)
    if cols is None:
        cols = TILE_BYTES // (torch.finfo(dtype).bits // 8) // rows
        cols = max(128, cols // 128 * 128)
    return rows, min(V, cols)


def _project(h, w, b, out):
    if b is None:
        return torch.mm(h, w.t(), out=out)
    return torch.addmm(b, h, w.t(), out=out)


_MM_INTO_FP32 = True
"""Whether ``torch.mm`` / ``torch.addmm`` accept ``out_dtype=torch.float32`` for half-precision
operands here (cuBLAS then accumulates ``grad_hidden`` straight into float32); switched off at
the first refusal, after which a half-precision product is added into the accumulator instead."""


def _acc_mm(acc, a, b, first: bool, part) -> None:
    """``acc (float32) = a @ b`` if ``first`` else ``acc += a @ b``, for half-precision a, b."""
    global _MM_INTO_FP32
    if _MM_INTO_FP32 and a.is_cuda:
        try:
            if first:
                torch.mm(a, b, out_dtype=torch.float32, out=acc)
            else:
                torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            return
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_INTO_FP32 = False
    p = torch.mm(a, b, out=part)
    if first:
        acc.copy_(p)
    else:
        acc.add_(p)


def _vocab_tiles(weight, bias, cols):
    V = weight.shape[0]
    return [
        (v0, min(v0 + cols, V), weight[v0 : v0 + cols], None if bias is None else bias[v0 : v0 + cols])
        for v0 in range(0, V, cols)
    ]


class _HiddenLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, with_entropy, rows, cols):
        N = hidden.shape[0]
        inv_tau = 1.0 / temperature
        stats = _new_stats(N, hidden.device, with_entropy)
        buf = torch.empty(rows * cols, dtype=hidden.dtype, device=hidden.device)
        tiles = _vocab_tiles(weight, bias, cols)
        for s0 in range(0, N, rows):
            n = min(rows, N - s0)
            h = hidden[s0 : s0 + n]
            part = tuple(x[s0 : s0 + n] for x in stats)
            y = labels[s0 : s0 + n]
            for v0, v1, w, b in tiles:
                z = _project(h, w, b, buf[: n * (v1 - v0)].view(n, v1 - v0))
                _fold(z, n, 0, v1 - v0, n, v1 - v0, v0, y, part, inv_tau, v0 == 0, with_entropy)
        del buf
        log_prob, lse, entropy = _finish(stats, with_entropy)
        _keep(ctx, (hidden, weight, bias, labels, lse, entropy), temperature=temperature, rows=rows, cols=cols)
        return (log_prob, entropy) if with_entropy else log_prob

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp, g_ent=None):
        start = _backward_start(ctx, g_lp, g_ent, n_diff=3)
        if start is None:
            return (None,) * 8
        (hidden, weight, bias, labels, lse, entropy), (need_h, need_w, need_b), g_lp, g_ent = start
        N, V, D = hidden.shape[0], weight.shape[0], hidden.shape[1]
        rows, cols, inv_tau = ctx.rows, ctx.cols, 1.0 / ctx.temperature
        g_lp, g_ent = _upstream(g_lp), _upstream(g_ent)
        if g_ent is None:
            entropy = None
        dev, dt = hidden.device, hidden.dtype
        f32 = dt == torch.float32
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.zeros(V, dtype=torch.float32, device=dev) if need_b else None
        buf = torch.empty(rows * cols, dtype=dt, device=dev)
        acc = part = None
        if need_h and not f32:  # float32 accumulator of grad_hidden for one token chunk
            acc = torch.empty(rows, D, dtype=torch.float32, device=dev)
            part = torch.empty(rows, D, dtype=dt, device=dev)  # used only where out_dtype is refused
        tiles = _vocab_tiles(weight, bias, cols)
        for s0 in range(0, N, rows):
            n = min(rows, N - s0)
            sl = slice(s0, s0 + n)
            h, y, s_lse = hidden[sl], labels[sl], lse[sl]
            s_ent = None if entropy is None else entropy[sl]
            s_glp = None if g_lp is None else g_lp[sl]
            s_gent = None if g_ent is None else g_ent[sl]
            gh = None if grad_h is None else (grad_h[sl] if f32 else acc[:n])
            for v0, v1, w, b in tiles:
                c = v1 - v0
                z = _project(h, w, b, buf[: n * c].view(n, c))
                _grad(z, n, 0, c, z, c, n, c, v0, y, s_lse, s_ent, s_glp, s_gent, inv_tau)  # z := ∂L/∂z
                if need_b:
                    grad_b[v0:v1] += z.sum(0, dtype=torch.float32)
                if need_w:
                    if s0 == 0:
                        torch.mm(z.t(), h, out=grad_w[v0:v1])
                    else:
                        grad_w[v0:v1].addmm_(z.t(), h)
                if need_h:
                    if f32:
                        if v0 == 0:
                            torch.mm(z, w, out=gh)
                        else:
                            gh.addmm_(z, w)
                    else:
                        _acc_mm(gh, z, w, v0 == 0, part[:n])
            if need_h and not f32:
                grad_h[sl].copy_(gh)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None


def logprobs_from_hidden(
    hidden, lm_head_weight, labels, *, with_entropy=False, bias=None, temperature=1.0, rows=None, cols=None
):
    """Triton version of :func:`rllab.kernels.chunked.logprobs_from_hidden` (arguments already checked).

    ``rows`` × ``cols`` is the tile (tokens × vocabulary entries); ``None`` picks
    ``TILE_ROWS`` tokens and fills ``TILE_BYTES``.
    """
    lead = labels.shape
    h = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    w = lm_head_weight.contiguous()
    b = None if bias is None else bias.contiguous()
    r, c = _tiles(h.shape[0], w.shape[0], h.dtype, rows, cols)
    out = _HiddenLogProb.apply(h, w, b, labels.reshape(-1).long().contiguous(), float(temperature), bool(with_entropy), r, c)
    if with_entropy:
        return out[0].view(lead), out[1].view(lead)
    return out.view(lead)
