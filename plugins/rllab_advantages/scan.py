"""The backward recurrence behind every estimator of :mod:`rllab_advantages.gae`.

**Semantics** (verl 0.9.1's per-token loop, :func:`reference_skip_scan`). Along each row,
backwards over its *valid* tokens only, for a coefficient ``0 ≤ c ≤ 1``::

    y_t = x_t + c·y_{n(t)}        n(t): the next valid position after t (y = 0 past the last)

and a masked position holds ``y`` of the next valid position to its right (0 if none); what
``x`` holds at a masked position is ignored (NaN included). So a multi-turn response whose
observation tokens are masked keeps one unbroken chain across them.

**How it is computed** (:func:`skip_scan`): no Python loop over tokens, and no matmul (MKL
splits even a tiny matmul across its threads: with the second of two cores busy, one took
16 ms on two threads against 0.04 ms on one). On the reversed rows, with masked inputs zeroed, the
recurrence is ``S_u = x_u + a_u·S_{u−1}`` with multiplier ``a_u = c`` on a valid token and 1 on a
masked one, so a masked position carries the next valid token's value. The rows are cut in
blocks; within a block, with ``W`` the running product of the multipliers,
``S_u = W_u·(Σ_{v≤u} x_v / W_v + S_before)``: one cumulative product and one cumulative sum
(:func:`_forward_scan`). The values at the block ends obey the same recurrence with the block
products as multipliers, solved by the same function in float64. Blocks are short enough for
``W`` to stay far from underflow; one mask-dependent step differs:

* rows *without holes* — each row a valid prefix, then padding (one check per call,
  :func:`has_holes`): the reversed row starts with the zeroed padding, which leaves ``S`` at 0,
  so every multiplier can be the constant ``c`` and ``W`` is a table of powers (no cumulative
  product, no multiplier tensor);
* rows *with holes* (observation spans, left padding): the multipliers come from the mask;
* ``c = 1``: one cumulative sum, on either kind of row.

A coefficient under ``2^−5`` (``γλ < 1/32``, λ = 0 included) needs blocks too short to pay; it
takes a log-step scan instead (``y_t += c^d·y_{t+d}`` for d = 1, 2, 4, … until ``c^d``
underflows), on each row's valid tokens packed to its front when the rows have holes.

Every path equals the reference loop to float32 rounding (the tests hold them to it).
"""

from __future__ import annotations

import functools
import math

import torch

from rllab import ops

__all__ = ["reference_skip_scan", "skip_scan", "discounted_reverse_cumsum", "has_holes"]

_MAX_BLOCK = 128
"""Longest block of :func:`_forward_scan` (one cumulative product and one cumulative sum per block)."""

_RANGE_BITS = {torch.float32: 40.0, torch.float64: 900.0}
"""How small (in powers of two) the running product within one block may get: far from the
dtype's underflow, so dividing by it and multiplying back keeps full relative precision."""

_MIN_BLOCKED_C = 2.0**-5
"""Smallest coefficient of the blocked scan (float32 blocks of 8 tokens); smaller ones take the
log-step scan."""


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
    ``0 ≤ c ≤ 1``; returns a new (B, T) tensor. ``holes``: :func:`has_holes` of ``mask``, if the
    caller has it."""
    if holes is None:
        holes = has_holes(mask)
    if c < _MIN_BLOCKED_C:
        return _log_step_skip_scan(x, mask, c, holes)
    reversed_mask = mask.flip(1)
    reversed_x = ops.zero_masked_(x.flip(1), reversed_mask)  # flip copies: a temporary of ours
    if c == 1.0:
        scanned = reversed_x.cumsum_(1)
    elif holes:
        # c where valid (1 + (c − 1): exact for c ≥ 1/2, within 2^−24 below), 1 where masked;
        # from the mask's bytes, as a cast from bool is 7× slower on CPU
        multipliers = reversed_mask.view(torch.int8).to(x.dtype).mul_(c - 1.0).add_(1.0)
        scanned = _forward_scan(reversed_x, multipliers, -math.log2(c))
    else:
        scanned = _forward_scan(reversed_x, c, -math.log2(c))
    return scanned.flip(1)


def discounted_reverse_cumsum(x: torch.Tensor, c: float) -> torch.Tensor:
    """``y_t = Σ_{j ≥ t} c^(j − t)·x_j`` along the last axis of ``x`` (B, T), every position valid."""
    return skip_scan(x, torch.ones_like(x, dtype=torch.bool), c, holes=False)


def has_holes(mask: torch.Tensor) -> bool:
    """True when some row has a valid token after a masked one (observation spans, left padding);
    False when every row is a valid prefix followed by padding."""
    if mask.shape[1] < 2 or mask.shape[0] == 0:
        return False
    steps = mask.view(torch.int8)  # a masked → valid step is the only place a column exceeds the one before
    rises = steps[:, 1:] > steps[:, :-1]
    return bool(rises.view(torch.uint8).max())  # a byte maximum: 10× faster than any() on CPU


def _block_length(bits: float, dtype: torch.dtype) -> int:
    """Block length for multipliers ≥ ``2^−bits``: their product over a block stays ≥ 2^−range."""
    return _MAX_BLOCK if bits <= 0 else min(_MAX_BLOCK, int(_RANGE_BITS.get(dtype, 40.0) // bits))


@functools.lru_cache(maxsize=64)
def _powers(c: float, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(c^1, …, c^n)``: the running product of a constant multiplier (cached; read only)."""
    powers = torch.tensor(c, dtype=torch.float64).pow(torch.arange(1, n + 1, dtype=torch.float64))
    return powers.to(dtype=dtype, device=device)


def _forward_scan(x: torch.Tensor, a: torch.Tensor | float, bits: float) -> torch.Tensor:
    """``S_u = x_u + a_u·S_{u−1}`` along the last axis (``S_{−1} = 0``), every ``a_u`` in
    ``[2^−bits, 1]``: ``a`` a (B, N) tensor (overwritten) or one number for every position.
    ``x`` (B, N) float is overwritten; returns (B, N).

    Within a block, with ``W_u`` the running product of ``a`` from the block's start,
    ``S_u = W_u·(Σ_{v≤u} x_v / W_v + S_before)``. The values at the block ends obey the same
    recurrence with the block products as multipliers: this function again, in float64 (whose
    range allows long blocks), or a loop once only a few remain.
    """
    B, N = x.shape
    constant = not isinstance(a, torch.Tensor)
    block = _block_length(bits, x.dtype)
    if N <= block:
        w = _powers(a, N, x.dtype, x.device) if constant else a.cumprod_(1)
        return x.div_(w).cumsum_(1).mul_(w)
    if block < 2 or N <= 8:
        out = torch.empty_like(x)
        running = torch.zeros_like(x[:, 0])
        for u in range(N):
            running = x[:, u] + (a if constant else a[:, u]) * running
            out[:, u] = running
        return out
    n_blocks = -(-N // block)
    if n_blocks * block != N:
        x = torch.nn.functional.pad(x, (0, n_blocks * block - N))
        a = a if constant else torch.nn.functional.pad(a, (0, n_blocks * block - N), value=1.0)
    if constant:
        w = _powers(a, block, x.dtype, x.device)
        w_end = a**block
    else:
        w = a.view(B, n_blocks, block).cumprod_(-1)
        w_end = w[:, :, -1].to(torch.float64, copy=True)
    y = x.view(B, n_blocks, block).div_(w).cumsum_(-1)
    ends = _forward_scan(y[:, :, -1].to(torch.float64) * w_end, w_end, bits * block)
    before = torch.nn.functional.pad(ends[:, :-1], (1, 0)).to(x.dtype)  # S just before each block
    y.add_(before[:, :, None]).mul_(w)
    return y.view(B, n_blocks * block)[:, :N]


def _log_step_skip_scan(x: torch.Tensor, mask: torch.Tensor, c: float, holes: bool) -> torch.Tensor:
    """:func:`skip_scan` for a small coefficient (``c < 2^−5``, 0 included).

    On rows with holes, each row's valid tokens are first packed to its front (one scatter) and
    the result brought back by one gather. The scan doubles its reach each step,
    ``y_t += c^d·y_{t+d}`` for d = 1, 2, 4, …, and stops once ``c^d`` is below the dtype's
    smallest number: the remaining terms would all be 0.
    """
    T = x.shape[1]
    if holes:
        # slot: a valid token's index among its row's valid tokens; for a masked token, that of the
        # next valid token of its row, whose value it carries (past the last one: a zero slot).
        slot = torch.cumsum(torch.nn.functional.pad(mask[:, :-1], (1, 0)), dim=1)
        # masked tokens (zeroed) all land in the last column, past every valid token of their row
        y = torch.zeros_like(x).scatter_(1, slot.masked_fill(~mask, T - 1), ops.zero_masked(x, mask))
    else:
        y = ops.zero_masked(x, mask)
    info = torch.finfo(x.dtype)
    d, c_d = 1, c
    while d < T and c_d >= info.tiny * info.eps:
        y[:, :-d] += c_d * y[:, d:]
        d, c_d = 2 * d, c_d * c_d
    return torch.gather(y, 1, slot) if holes else y
