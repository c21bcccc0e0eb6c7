"""The backward recurrence behind every estimator of :mod:`rllab_advantages.gae`.

**Semantics** (verl 0.9.1's per-token loop, :func:`reference_skip_scan`). Along each row,
backwards over its *valid* tokens only, for a coefficient ``0 ≤ c ≤ 1``::

    y_t = x_t + c·y_{n(t)}        n(t): the next valid position after t (y = 0 past the last)

and a masked position holds ``y`` of the next valid position to its right (0 if none); what
``x`` holds at a masked position is ignored (NaN included). So a multi-turn response whose
observation tokens are masked keeps one unbroken chain across them.

**How it is computed** (:func:`skip_scan`): no Python loop over tokens, one fast path per mask
shape.

* Rows *without holes* — each row a valid prefix, then padding (one check per call,
  :func:`has_holes`): the padding is zeroed and :func:`discounted_reverse_cumsum` runs a
  constant-coefficient blocked scan. Each block of ``_BLOCK`` tokens is solved in closed form by
  one matmul with the triangular matrix ``U[j, i] = c^(j−i)``; the values at the block starts
  obey the same recurrence with coefficient ``c^_BLOCK``, solved by the same function.
* Rows *with holes* (observation spans, left padding): :func:`masked_reverse_scan`, the
  recurrence with a per-position multiplier — ``c`` on a valid token, 1 on a masked one whose
  input is zeroed — so a masked position carries the next valid token's value. On the reversed
  rows, cut in blocks, ``S_u = W_u·(Σ_{v≤u} x_v / W_v + S_before)`` with ``W`` the running
  product of the multipliers within the block (one cumulative product, one cumulative sum); the
  block ends are scanned by the same function in float64. Blocks are short enough for ``W`` to
  stay far from underflow, which takes ``c ≥ 2^−5``. A smaller coefficient on rows
  with holes (rare: ``γλ < 1/32``) falls back on compaction: each row's valid tokens packed to
  its front, the constant-coefficient scan, one gather back.

Every path equals the reference loop to float32 rounding (the tests hold them to it).
"""

from __future__ import annotations

import functools
import math

import torch

from rllab import ops

__all__ = ["reference_skip_scan", "skip_scan", "discounted_reverse_cumsum", "masked_reverse_scan", "has_holes"]

_BLOCK = 16
"""Tokens per block of the constant-coefficient scan (one 16×16 matmul per block)."""

_MASKED_BLOCK = 128
"""Longest block of the masked scan (one cumulative product and one cumulative sum per block)."""

_RANGE_BITS = {torch.float32: 40.0, torch.float64: 900.0}
"""How small (in powers of two) the running product within one block may get: far from the
dtype's underflow, so dividing by it and multiplying back keeps full relative precision."""

_MIN_MASKED_C = 2.0**-5
"""Smallest coefficient of the masked scan (float32 blocks of 8 tokens); smaller ones on rows with
holes are compacted instead."""


def reference_skip_scan(x: torch.Tensor, mask: torch.Tensor, c: float) -> torch.Tensor:
    """The definition, as a per-token loop: ``y_t = x_t + c·y_{n(t)}`` over each row's valid
    tokens, a masked position holding ``y`` of the next valid one (0 if none).

    ``x`` (B, T) float, ``mask`` (B, T) bool; returns (B, T) in ``x``'s dtype. O(T) Python
    steps: the semantics that :func:`skip_scan` implements fast, and what the tests compare with.
    """
    y = torch.zeros_like(x)
    running = torch.zeros_like(x[:, 0])
    for t in reversed(range(x.shape[1])):
        running = torch.where(mask[:, t], x[:, t] + c * running, running)
        y[:, t] = running
    return y


def skip_scan(x: torch.Tensor, mask: torch.Tensor, c: float, *, holes: bool | None = None) -> torch.Tensor:
    """:func:`reference_skip_scan`, vectorised: ``x`` (B, T) float, ``mask`` (B, T) bool,
    ``0 ≤ c ≤ 1``; returns (B, T). ``holes``: :func:`has_holes` of ``mask``, if the caller has it."""
    if holes is None:
        holes = has_holes(mask)
    if not holes:  # the scan of the zeroed padding leaves 0 there: "nothing valid follows"
        return discounted_reverse_cumsum(ops.zero_masked(x, mask), c)
    if _masked_scan_ok(c):
        return masked_reverse_scan(x, mask, c)
    return _packed_skip_scan(x, mask, c)


def has_holes(mask: torch.Tensor) -> bool:
    """True when some row has a valid token after a masked one (observation spans, left padding);
    False when every row is a valid prefix followed by padding."""
    if mask.shape[1] < 2:
        return False
    steps = mask.view(torch.int8)  # a masked → valid step is the only place a column exceeds the one before
    return bool((steps[:, 1:] > steps[:, :-1]).any())


# --------------------------------------------------------------------------- rows without holes


@functools.lru_cache(maxsize=64)
def _triangular(c: float, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """U (size, size) with ``U[j, i] = c^(j − i)`` for j ≥ i, else 0: ``(x @ U)_i = Σ_{j≥i} c^(j−i)·x_j``
    (cached; read only)."""
    ar = torch.arange(size, dtype=torch.float64)
    exponent = ar[:, None] - ar[None, :]
    powers = torch.where(exponent >= 0, torch.tensor(c, dtype=torch.float64).pow(exponent.clamp(min=0)), 0.0)
    return powers.to(dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def _decay(c: float, block: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(c^block, …, c^1)``: what the value at the next block's start adds to each position of a
    block (cached; read only)."""
    powers = torch.tensor(c, dtype=torch.float64).pow(torch.arange(block, 0, -1, dtype=torch.float64))
    return powers.to(dtype=dtype, device=device)


def discounted_reverse_cumsum(x: torch.Tensor, c: float, block: int = _BLOCK) -> torch.Tensor:
    """``y_t = Σ_{j ≥ t} c^(j − t)·x_j`` along the last axis (``y_t = x_t + c·y_{t+1}``, every
    position valid).

    ``x`` (B, T) float, ``0 ≤ c ≤ 1``; returns a new (B, T) tensor. Blocked: each block of
    ``block`` tokens by one triangular matmul, the block starts by this function again.
    """
    B, T = x.shape
    if B == 0 or T == 0 or c == 0.0:
        return x.clone()
    if T <= block:
        return x @ _triangular(c, T, x.dtype, x.device)
    n_blocks = -(-T // block)
    padded = torch.nn.functional.pad(x, (0, n_blocks * block - T))
    local = padded.view(B, n_blocks, block) @ _triangular(c, block, x.dtype, x.device)
    starts = discounted_reverse_cumsum(local[:, :, 0], c**block, block)  # true values at the block starts
    following = torch.nn.functional.pad(starts[:, 1:], (0, 1))  # ... of the next block (0 after the last)
    local.addcmul_(following[:, :, None], _decay(c, block, x.dtype, x.device))
    return local.view(B, n_blocks * block)[:, :T]


def _packed_skip_scan(x: torch.Tensor, mask: torch.Tensor, c: float) -> torch.Tensor:
    """:func:`skip_scan` by compaction (any mask, any ``c``): each row's valid tokens scattered to
    its front, :func:`discounted_reverse_cumsum`, one gather back."""
    T = x.shape[1]
    # slot: a valid token's index among its row's valid tokens; for a masked token, that of the
    # next valid token of its row, whose value it carries (past the last one: a zero slot).
    slot = torch.cumsum(torch.nn.functional.pad(mask[:, :-1], (1, 0)), dim=1)
    # masked tokens (zeroed) all land in the last column, past every valid token of their row
    packed = torch.zeros_like(x).scatter_(1, slot.masked_fill(~mask, T - 1), ops.zero_masked(x, mask))
    return torch.gather(discounted_reverse_cumsum(packed, c), 1, slot)


# --------------------------------------------------------------------------- rows with holes


def _masked_block(bits: float, dtype: torch.dtype) -> int:
    """Block length for multipliers ≥ ``2^−bits``: their product over a block stays ≥ 2^−range."""
    return _MASKED_BLOCK if bits <= 0 else min(_MASKED_BLOCK, int(_RANGE_BITS.get(dtype, 40.0) // bits))


def _masked_scan_ok(c: float) -> bool:
    """Whether :func:`masked_reverse_scan` takes coefficient ``c``."""
    return _MIN_MASKED_C <= c <= 1.0


def masked_reverse_scan(x: torch.Tensor, mask: torch.Tensor, c: float) -> torch.Tensor:
    """:func:`reference_skip_scan` for any mask, by the per-position multiplier scan (``c`` on a
    valid token, 1 on a masked one, whose input is zeroed). ``2^−5 ≤ c ≤ 1``: a block of 8 float32
    multipliers stays ≥ 2^−40, and ``1 + (c − 1)`` is ``c`` to 2^−24 (exactly, for c ≥ 1/2).
    ``x`` (B, T) float, ``mask`` (B, T) bool; returns (B, T)."""
    reversed_mask = mask.flip(1)
    reversed_x = ops.zero_masked_(x.flip(1), reversed_mask)  # flip copies: a temporary of ours
    if c == 1.0:
        return reversed_x.cumsum_(1).flip(1)
    multipliers = reversed_mask.to(x.dtype).mul_(c - 1.0).add_(1.0)  # c where valid, 1 where masked
    return _forward_scan(reversed_x, multipliers, -math.log2(c)).flip(1)


def _forward_scan(x: torch.Tensor, a: torch.Tensor, bits: float) -> torch.Tensor:
    """``S_u = x_u + a_u·S_{u−1}`` along the last axis (``S_{−1} = 0``), every ``a_u`` in
    ``[2^−bits, 1]``; ``x`` and ``a`` (B, N), same float dtype, are overwritten.

    Within a block, with ``W_u`` the running product of ``a`` from the block's start,
    ``S_u = W_u·(Σ_{v≤u} x_v / W_v + S_before)``. The values at the block ends obey the same
    recurrence with the block products as multipliers: this function again, in float64 (whose
    range allows long blocks), or a loop once only a few remain.
    """
    B, N = x.shape
    block = _masked_block(bits, x.dtype)
    if N <= block:
        w = a.cumprod_(1)
        return x.div_(w).cumsum_(1).mul_(w)
    if block < 2 or N <= 8:
        out = torch.empty_like(x)
        running = torch.zeros_like(x[:, 0])
        for u in range(N):
            running = torch.addcmul(x[:, u], a[:, u], running)
            out[:, u] = running
        return out
    n_blocks = -(-N // block)
    x = torch.nn.functional.pad(x, (0, n_blocks * block - N))
    a = torch.nn.functional.pad(a, (0, n_blocks * block - N), value=1.0)
    w = a.view(B, n_blocks, block).cumprod_(-1)
    y = x.view(B, n_blocks, block).div_(w).cumsum_(-1)
    w_end = w[:, :, -1].to(torch.float64, copy=True)
    ends = _forward_scan(y[:, :, -1].to(torch.float64) * w_end, w_end, bits * block)
    before = torch.nn.functional.pad(ends[:, :-1], (1, 0)).to(x.dtype)  # S just before each block
    y.add_(before[:, :, None]).mul_(w)
    return y.view(B, n_blocks * block)[:, :N]
