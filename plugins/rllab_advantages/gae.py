"""Backward-scan advantage estimators: GAE, REINFORCE (return-to-go), REINFORCE++ and ReMax.

GAE — Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation" (https://arxiv.org/abs/1506.02438). REINFORCE++ — Hu 2025,
https://arxiv.org/abs/2501.03262. Semantics follow verl 0.9.1 ``core_algos``.

Shapes: ``token_rewards``, ``values``, ``mask``: (B, T); ``index``: (B,) (unused here).

**Observation tokens are skipped.** Every estimator here runs a backward recursion over the
*valid* tokens of a row only: a position with ``mask`` False carries the running quantities
(GAE's ``next_value`` and advantage, the running return) through unchanged, and a reward that
sits on a masked token is dropped. So a multi-turn response whose tool-output tokens are masked
out keeps one unbroken chain from its last valid token back to its first. Writing
``p_1 < … < p_n`` for the valid positions of a row::

    δ_k = r_{p_k} + γ·V_{p_{k+1}} − V_{p_k}        (V_{p_{n+1}} = 0)
    A_k = δ_k + γλ·A_{k+1}                          (A_{n+1} = 0)       gae
    G_k = r_{p_k} + γ·G_{k+1}                        (G_{n+1} = 0)       reinforce, reinforce++

and a masked position holds the value of the next valid position to its right (0 if none),
which is what verl's per-token loop leaves there.

**How it is computed.** No Python loop over tokens. On rows with holes (a valid token after a
masked one: multi-turn observation spans, left padding) the recursion runs on the rows as they
are, as a scan with a per-position multiplier — ``c`` on a valid token, 1 on a masked one, whose
input is zeroed — so a masked position carries the next valid token's value. On reversed rows,
cut into blocks of ``_VAR_BLOCK`` tokens, ``S_u = W_u·(Σ_{v≤u} x_v / W_v + S_before)`` with
``W`` the running product of the multipliers within the block (one cumulative product and one
cumulative sum; blocks are short enough that ``W`` stays far from underflow), and the values at
the block ends — the same recursion with the block products as multipliers — are scanned in
float64 by the same function (or a loop over a few block heads). GAE needs one such scan: with
``n(k)`` the valid token after ``k``, ``A_k = r_k − V_k + S_{n(k)}`` where ``S`` scans
``γλ·r + γ(1 − λ)·V``. When no row has a hole (plain right padding, one check per call) the
coefficient is constant and the scan is blocked: the time axis is cut into blocks of
``_BLOCK`` tokens, each block is solved in closed form by one matmul with the triangular matrix
``U[j, i] = c^(j−i)`` (entries ≤ 1, so no power of c overflows; the ones that underflow are
negligible next to the rest), and the carries between blocks — the same recursion with
coefficient ``c^_BLOCK`` over ``T/_BLOCK`` block heads — are solved by the same function,
recursively. With ``c = 1`` over rows with holes, a reverse cumulative sum of the rewards zeroed
at masked positions is the whole scan. Coefficients too small for the per-position scan's
blocks (``γλ < ~1/32``) and ``remask=False`` on rows with holes use compaction instead: valid
tokens moved to the front of their row by one scatter, the constant-coefficient scan, one
gather back. The masked scans (and the γ = 1 return on any mask) run a block of rows at a
time (:func:`_scan_rows`), so every pass stays in cache, and zero masked positions by a bitwise
and with the mask's bit pattern (``ops.mask_bits``), a vectorised select. Large (B, T) buffers
are reused once spent, so a call holds about two of them (its outputs). The result equals
verl's loop to float32 rounding.
"""

from __future__ import annotations

import functools
import math

import attrs
import torch

import rllab
from rllab import ops

__all__ = ["gae", "reinforce", "reinforce_plus_plus", "discounted_reverse_cumsum"]

_BLOCK = 16
"""Tokens per block of the blocked scan (one K×K matmul per block)."""


# --------------------------------------------------------------------------- the scan


@functools.lru_cache(maxsize=64)
def _triangular(c: float, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """U (size, size) with U[j, i] = c^(j − i) for j ≥ i, else 0, so that (x @ U)_i = Σ_{j≥i} c^(j−i)·x_j.

    Cached (read only: every caller uses it as a matmul operand)."""
    ar = torch.arange(size, dtype=torch.float64)
    exponent = ar[:, None] - ar[None, :]
    powers = torch.where(exponent >= 0, torch.tensor(c, dtype=torch.float64).pow(exponent.clamp(min=0)), 0.0)
    return powers.to(dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def _decay(c: float, block: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(c^block, …, c^1): what a carry from the next block contributes to each position of a
    block (cached, read only)."""
    powers = torch.tensor(c, dtype=torch.float64).pow(torch.arange(block, 0, -1, dtype=torch.float64))
    return powers.to(dtype=dtype, device=device)


def discounted_reverse_cumsum(x: torch.Tensor, c: float, block: int = _BLOCK) -> torch.Tensor:
    """y_t = Σ_{j ≥ t} c^(j − t)·x_j along the last axis, i.e. y_t = x_t + c·y_{t+1}, y_T = 0.

    ``x`` (B, T) float, ``0 ≤ c ≤ 1``. Vectorised: a reverse cumulative sum when c = 1, otherwise
    a blocked scan (closed form per block by a triangular matmul, block carries by recursion).
    """
    B, T = x.shape
    if T == 0 or B == 0:
        return x.clone()
    if c == 1.0:
        return x.flip(-1).cumsum_(-1).flip(-1)
    if c == 0.0:
        return x.clone()
    if T <= block:
        return x @ _triangular(c, T, x.dtype, x.device)
    n_blocks = -(-T // block)
    padded = torch.nn.functional.pad(x, (0, n_blocks * block - T)) if n_blocks * block != T else x
    local = padded.view(B, n_blocks, block) @ _triangular(c, block, x.dtype, x.device)
    # heads[b] = value at the start of block b with nothing carried in from the right; the true
    # block-start values obey the same recursion with coefficient c^block.
    starts = discounted_reverse_cumsum(local[:, :, 0], c**block, block)
    carry_in = torch.nn.functional.pad(starts[:, 1:], (0, 1))  # value at the start of block b + 1
    local.addcmul_(carry_in[:, :, None], _decay(c, block, x.dtype, x.device))
    return local.view(B, n_blocks * block)[:, :T]


def _reverse_scan_into(x: torch.Tensor, c: float, out: torch.Tensor) -> torch.Tensor:
    """:func:`discounted_reverse_cumsum` of ``x`` (B, T) written into ``out`` (B, T, contiguous,
    not overlapping ``x``), so that no (B, T) buffer is allocated: the blocked scan (c = 1
    included: its matmul is as fast as a cumulative sum, and needs no reversed copies)."""
    B, T = x.shape
    block = _BLOCK
    if T % block or T <= block or c == 0.0 or B == 0 or not out.is_contiguous():
        return out.copy_(discounted_reverse_cumsum(x, c))
    n_blocks = T // block
    local = torch.matmul(
        x.reshape(B, n_blocks, block), _triangular(c, block, x.dtype, x.device), out=out.view(B, n_blocks, block)
    )
    # the blocks' carries: one matmul when there are few blocks, else the blocked scan again
    starts = discounted_reverse_cumsum(local[:, :, 0], c**block, max(block, n_blocks if n_blocks <= 64 else block))
    carry_in = torch.nn.functional.pad(starts[:, 1:], (0, 1))
    local.addcmul_(carry_in[:, :, None], _decay(c, block, x.dtype, x.device))
    return out


def _has_holes(mask: torch.Tensor) -> bool:
    """True when some row has a valid token after a masked one (multi-turn observation spans,
    left padding). Without holes every row is a valid prefix plus trailing padding, and the
    scan can run in place on the zero-filled rows, with no compaction."""
    B, T = mask.shape
    if T < 2 or B == 0:
        return False
    m = mask.view(torch.int8)  # a masked → valid step is the only place a column exceeds the one before
    rows = max(1, (1 << 18) // T)  # blocks of rows keep the comparison small: heap, not fresh pages
    if rows >= B:
        return bool((m[:, 1:] > m[:, :-1]).any())
    return any(bool((blk[:, 1:] > blk[:, :-1]).any()) for blk in m.split(rows))


def _packing(mask: torch.Tensor):
    """Where each token goes when a row's valid tokens are packed to its front, in order.

    Returns ``(slot, dest)``, both (B, T) int64. ``slot`` is the exclusive running count of
    valid tokens: a valid token's packed index, and for a masked token the packed index of the
    next valid token of its row — so one gather with ``slot`` brings a packed result back to
    every position under verl's skip rule. ``dest`` is ``slot`` with masked tokens sent to the
    last column, which lies past the valid tokens of any row that has a masked token.
    """
    slot = torch.cumsum(torch.nn.functional.pad(mask[:, :-1], (1, 0)), dim=1)
    return slot, slot.masked_fill(~mask, mask.shape[1] - 1)


def _pack(x: torch.Tensor, mask: torch.Tensor, packing) -> torch.Tensor:
    """``x`` with each row's valid entries moved to its front, in order, and zeros after them."""
    slot, dest = packing
    out = torch.zeros_like(x).scatter_(1, dest, x)
    # Masked entries (NaN allowed) all landed in the last column; rows with any masked token
    # have nothing valid there, so it is cleared for them.
    full = (slot[:, -1] + mask[:, -1]) == x.shape[1]
    out[:, -1] = torch.where(full, out[:, -1], ops.scalar_zero(x))
    return out


def _front_packed(x: torch.Tensor, mask: torch.Tensor, packing) -> torch.Tensor:
    """Each row's valid entries packed to its front, zeros after them (B, T); without holes
    (``packing`` None) the rows are already packed and only the padding is zeroed."""
    return ops.zero_masked(x, mask) if packing is None else _pack(x, mask, packing)


def _skip_scan(x: torch.Tensor, mask: torch.Tensor, c: float, packing) -> torch.Tensor:
    """``y_k = x_k + c·y_{k+1}`` over each row's valid entries only (verl's skip rule).

    A masked position gets the value of the next valid position of its row (0 if none).
    """
    y = discounted_reverse_cumsum(_front_packed(x, mask, packing), c)
    return y if packing is None else torch.gather(y, 1, packing[0])


_VAR_BLOCK = 128
"""Tokens per block of the masked scan (one cumulative product and one cumulative sum per block)."""

_RANGE_BITS = {torch.float32: 40.0, torch.float64: 900.0}
"""How small (in powers of two) a product of multipliers within one block may get: far from
the dtype's underflow, so dividing by it and multiplying back keeps full relative precision."""

_MIN_VAR_BLOCK = 8
"""Smallest useful block; a coefficient that forces a smaller one goes to the packed scan."""


def _var_block(bits: float, dtype: torch.dtype) -> int:
    """Block length for multipliers ≥ 2^−bits: their product over a block stays ≥ 2^−range."""
    return _VAR_BLOCK if bits <= 0 else min(_VAR_BLOCK, int(_RANGE_BITS.get(dtype, 40.0) // bits))


def _forward_scan(x: torch.Tensor, a: torch.Tensor, bits: float) -> torch.Tensor:
    """``S_u = x_u + a_u·S_{u−1}`` along the last axis (``S_{−1} = 0``), every ``a_u`` in
    ``[2^−bits, 1]``; ``x`` and ``a`` (B, N), same float dtype, are overwritten.

    Blocked: within a block, with ``W_u`` the running product of ``a`` from the block's start,
    ``S_u = W_u·(Σ_{v≤u} x_v / W_v + S_before)`` — one cumulative product and one cumulative
    sum. ``W`` stays ≥ 2^−40 (float32) because the block is short enough for ``bits``. The values
    at the block ends obey the same recursion with the block products as multipliers; it runs
    in float64 (range for long blocks) by this same function, or by a loop when only a few
    blocks remain.
    """
    B, N = x.shape
    block = _var_block(bits, x.dtype)
    if N <= block:
        w = a.cumprod_(1)
        return x.div_(w).cumsum_(1).mul_(w)
    if block < 2 or N <= 8:
        out = torch.empty_like(x)
        h = torch.zeros_like(x[:, 0])
        for u in range(N):
            h = torch.addcmul(x[:, u], a[:, u], h)
            out[:, u] = h
        return out
    n_blocks = -(-N // block)
    if n_blocks * block != N:
        x = torch.nn.functional.pad(x, (0, n_blocks * block - N))
        a = torch.nn.functional.pad(a, (0, n_blocks * block - N), value=1.0)
    w = a.view(B, n_blocks, block).cumprod_(-1)
    y = x.view(B, n_blocks, block).div_(w).cumsum_(-1)
    w_end = w[:, :, -1].to(torch.float64, copy=True)
    ends = _forward_scan(y[:, :, -1].to(torch.float64) * w_end, w_end, bits * block)
    carry = torch.nn.functional.pad(ends[:, :-1], (1, 0)).to(x.dtype)  # S just before each block
    y.add_(carry[:, :, None]).mul_(w)
    return y.view(B, n_blocks * block)[:, :N]


def _masked_scan_ok(c: float, dtype: torch.dtype) -> bool:
    """Whether :func:`_masked_reverse_scan` takes coefficient ``c`` (else: the packed scan)."""
    return 0.0 < c < 1.0 and _var_block(-math.log2(c), dtype) >= _MIN_VAR_BLOCK


def _masked_reverse_scan(x: torch.Tensor, mask: torch.Tensor, c: float) -> torch.Tensor:
    """``y_t = x_t + c·y_{t+1}`` over each row's valid positions, without packing the rows.

    A masked position multiplies by 1 and adds nothing (whatever ``x`` holds there), so it
    carries the value of the next valid position of its row (0 if none): the same result as
    ``_skip_scan``. The reversed rows go through :func:`_forward_scan` with multiplier ``c`` on
    valid tokens and 1 on masked ones. ``_masked_scan_ok(c, x.dtype)`` must hold.
    """
    return _masked_scan_of_reversed(x.flip(1), mask, c)


def _masked_scan_of_reversed(x_reversed: torch.Tensor, mask: torch.Tensor, c: float) -> torch.Tensor:
    """:func:`_masked_reverse_scan` of ``x`` given its reversed rows ``x_reversed`` (B, T), a
    temporary of the caller's that is used as scratch space (its content is lost; it may be
    reused afterwards). The result is written over the multipliers' buffer, so the scan holds
    two (B, T) buffers in all."""
    reversed_mask = mask.flip(1)
    ops.zero_masked_(x_reversed, reversed_mask)
    coef = torch.tensor(c, dtype=x_reversed.dtype, device=x_reversed.device)
    if c >= 0.5:
        # 1 + (c − 1)·m is exactly c or 1: c − 1 is exact for c in [1/2, 1) (Sterbenz), and so
        # is adding 1 back; from the mask's bytes this is cheaper than a select.
        multipliers = reversed_mask.view(torch.uint8).to(x_reversed.dtype)
        multipliers.mul_(coef.item() - 1.0).add_(1.0)
    else:
        multipliers = torch.where(reversed_mask, coef, torch.ones_like(coef))
    scanned = _forward_scan(x_reversed, multipliers, -math.log2(c))
    backwards = torch.arange(mask.shape[1] - 1, -1, -1, device=mask.device)
    return torch.index_select(scanned, 1, backwards, out=multipliers)


_ROW_CHUNK = 1 << 18
"""Elements per block of rows of :func:`_scan_rows`: a block's buffers stay in cache, so each
of its passes costs a fraction of a pass over the whole batch."""


@functools.lru_cache(maxsize=64)
def _float_bits(value: float, dtype: torch.dtype, bits_dtype: torch.dtype) -> int:
    """The bit pattern of ``value`` in ``dtype``, as an integer of ``bits_dtype``."""
    return int(torch.tensor(value, dtype=dtype).view(bits_dtype).item())


def _scan_rows(x, mask, c, out, *, x2=None, alpha=0.0, remask=True):
    """``y_t = x_t + c·y_{t+1}`` over each row's valid positions (verl's skip rule), written into
    ``out`` with 0 at masked positions (``remask=False``: the value of the next valid position,
    0 if none); ``x2`` adds ``alpha·x2`` to ``x`` first.

    ``x`` (and ``x2``) (B, T) float, read only, NaN or inf at masked positions ignored; ``mask``
    (B, T) bool; ``c = 1`` or ``_masked_scan_ok(c, dtype)``. ``out`` is a contiguous (B, T)
    buffer of ``x``'s dtype, not overlapping ``x``: the scan allocates nothing else of the
    batch's size. A block of rows at a time, so that every
    pass runs in cache: the reversed rows (``index_select``) are zeroed at masked positions (a
    bitwise and with the mask's bit pattern), then a cumulative sum (``c = 1``) or
    :func:`_forward_scan` with multiplier ``c`` on a valid token and 1 on a masked one (its bit
    pattern picked from the mask's, so exactly ``c``), zeroed again and reversed into ``out``.
    """
    B, T = x.shape
    dtype = out.dtype
    rows = max(1, _ROW_CHUNK // max(T, 1))
    small = mask.view(torch.int8)
    bits_buf = torch.empty(min(rows, B), T, dtype=ops.bits_dtype(dtype), device=x.device)
    bits_dtype = bits_buf.dtype
    if c != 1.0:
        one = _float_bits(1.0, dtype, bits_dtype)
        flip_to_c = one ^ _float_bits(c, dtype, bits_dtype)
        range_bits = -math.log2(c)
    for start in range(0, B, rows):
        stop = min(B, start + rows)
        reversed_mask = small[start:stop].flip(1)
        bits = ops.mask_bits(reversed_mask.view(torch.bool), dtype, out=bits_buf[: stop - start])
        xr = x[start:stop].flip(1)  # a block-sized temporary: stays in cache
        if x2 is not None:
            xr.add_(x2[start:stop].flip(1), alpha=alpha)
        xr.view(bits_dtype).bitwise_and_(bits)
        if c == 1.0:
            y = xr.cumsum_(1)
        else:
            # multipliers: the bits of 1.0, with those of c where valid (1 ^ (bits & (1 ^ c)))
            w = torch.bitwise_and(bits, flip_to_c, out=out[start:stop].view(bits_dtype))
            w = w.bitwise_xor_(one).view(dtype)
            y = _forward_scan(xr, w, range_bits)
        if remask:
            y.view(bits_dtype).bitwise_and_(bits)
        out[start:stop].copy_(y.flip(1))
    return out


# --------------------------------------------------------------------------- shared helpers


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.detach().to(dtype)``, without an operation for each that has nothing to do."""
    x = x.detach() if x.requires_grad else x
    return x if x.dtype == dtype else x.to(dtype)


def _float_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _check_inputs(where: str, token_rewards, mask, values=None) -> None:
    ops.check_token_tensor(where, "token_rewards", token_rewards, mask, floating=True)
    ops.check_inputs(where, mask, token_rewards=token_rewards, values=values)


# --------------------------------------------------------------------------- gae


@attrs.frozen
class GAEConfig:
    """Knobs of gae."""

    gamma: float = rllab.knob(1.0, help="γ: discount per valid token", ge=0.0, le=1.0)
    lam: float = rllab.knob(
        1.0, help="λ: GAE trace decay (1 = Monte-Carlo return − V, 0 = one-step TD)", ge=0.0, le=1.0
    )
    whiten: bool = rllab.knob(True, help="whiten advantages over the batch's valid tokens (verl always does)")
    remask: bool = rllab.knob(
        True,
        help="zero advantages and returns at masked positions; False keeps verl's values there "
        "(the whitened advantage carried from the next valid token, and A + V)",
    )


def gae(*, token_rewards, mask, index=None, values=None, config: GAEConfig):
    """Generalized Advantage Estimation with observation tokens skipped (verl's ``gae``).

    ``δ_t = r_t + γ·V_{t+1} − V_t``, ``A_t = δ_t + γλ·A_{t+1}``, run backwards over the valid
    tokens of each row (a masked position passes ``next_value`` and ``A`` through unchanged; its
    reward is dropped). ``returns = A + V`` (before whitening). Advantages are then whitened over
    every valid token of the batch (``config.whiten``).

    :param token_rewards: (B, T) float.
    :param values: (B, T) float critic values (required).
    :param mask: (B, T) bool.
    :param index: (B,) group ids, unused.
    :returns: ``(advantages, returns)``, both (B, T), in float32 (or wider, if an input is).

    Differences from verl, each with the verl behaviour one knob away:

    * ``remask=True`` (default) zeroes both outputs at masked positions. verl leaves the carried
      whitened advantage and ``A + V`` there; no loss reads them, but a zero is what every other
      estimator returns and what a reader of a dumped batch expects. ``remask=False`` matches
      verl at every position (it also makes an all-masked row non-zero after whitening).
    * With fewer than two valid tokens in the batch verl's ``masked_var`` raises; rllab centres
      without scaling, so the advantage of a lone valid token is 0 (it carries no signal).
    """
    where = "advantage_estimator 'gae'"
    if values is None:
        raise ValueError(f"{where} requires values (a critic); got values=None")
    _check_inputs(where, token_rewards, mask, values)
    dtype = _float_dtype(token_rewards, values)
    with torch.no_grad():
        rewards = _as(token_rewards, dtype)
        values = _as(values, dtype)
        gamma, lam = config.gamma, config.lam

        c = gamma * lam
        holes = _has_holes(mask)
        if holes and config.remask and (c == 1.0 or _masked_scan_ok(c, dtype)):
            return _gae_rows(rewards, values, mask, gamma, lam, config.whiten)
        if not holes and config.remask:
            return _gae_prefix(rewards, values, mask, gamma, lam, config.whiten)
        packing = _packing(mask) if holes else None
        r = _front_packed(rewards, mask, packing)  # (B, T): valid tokens packed in front,
        v = _front_packed(values, mask, packing)  # zeros after each row's last valid token
        delta = r.sub_(v)  # δ_k = r_k + γ·V_{k+1} − V_k, with V = 0 past the last valid token
        delta[:, :-1].add_(v[:, 1:], alpha=gamma)
        advantages = discounted_reverse_cumsum(delta, gamma * lam)  # A_k = δ_k + γλ·A_{k+1}
        if packing is not None:
            advantages = torch.gather(advantages, 1, packing[0])  # masked: A of the next valid token
        # Without holes A is already 0 on each row's trailing padding (nothing valid follows),
        # and v is the values zeroed there, so A + v needs no further masking.
        if not config.remask:
            returns = advantages + values
        elif packing is None:
            returns = advantages + v
        else:
            returns = ops.zero_masked(advantages + values, mask)
        if config.whiten:
            advantages = ops.masked_whiten(
                advantages, mask, remask=config.remask, masked_are_zero=packing is None, inplace=True
            )
        elif config.remask and packing is not None:
            advantages = ops.zero_masked(advantages, mask)
    return advantages, returns


# --------------------------------------------------------------------------- reinforce


def _gae_rows(rewards, values, mask, gamma, lam, whiten):
    """``gae`` with masked positions zeroed, on rows of any mask, by one row-block scan.

    Writing ``n(k)`` for the valid position after ``k`` and ``c = γλ``, the advantage
    ``A_k = δ_k + c·A_{n(k)}`` with ``δ_k = r_k − V_k + γ·V_{n(k)}`` unrolls to
    ``A_k = r_k − V_k + c·S_{k+1}``, where ``S`` is the skip scan of ``r + (1 − λ)/λ·V`` (each
    ``V_{n(k)}`` of a δ meets the ``−c·V`` of the next term; a masked ``k + 1`` carries ``S`` of
    the next valid token).
    ``c = 1`` or ``_masked_scan_ok(c, dtype)``. The scan goes into the returns' buffer, then a
    block of rows at a time (in cache) the advantages, the returns ``A + V`` and the zeroing of
    masked positions; the call allocates its two outputs and block-sized temporaries only.
    """
    B, T = rewards.shape
    c = gamma * lam
    dtype = rewards.dtype
    returns = torch.empty((B, T), dtype=dtype, device=rewards.device)
    extra = None if lam == 1.0 else values
    scanned = _scan_rows(rewards, mask, c, returns, x2=extra, alpha=(1.0 - lam) / lam, remask=False)
    advantages = torch.empty_like(returns)
    rows = max(1, _ROW_CHUNK // max(T, 1))
    small = mask.view(torch.int8)
    bits_buf = torch.empty(min(rows, B), T, dtype=ops.bits_dtype(dtype), device=rewards.device)
    for start in range(0, B, rows):
        stop = min(B, start + rows)
        bits = bits_buf[: stop - start].copy_(small[start:stop]).neg_()
        adv = torch.sub(rewards[start:stop], values[start:stop], out=advantages[start:stop])
        if T > 1:
            adv[:, :-1].add_(scanned[start:stop, 1:], alpha=c)
        adv.view(bits.dtype).bitwise_and_(bits)
        ret = torch.add(adv, values[start:stop], out=returns[start:stop])  # S is spent here
        ret.view(bits.dtype).bitwise_and_(bits)
    if whiten:
        advantages = ops.masked_whiten(advantages, mask, remask=True, masked_are_zero=True, inplace=True)
    return advantages, returns


def _gae_prefix(rewards, values, mask, gamma, lam, whiten):
    """``gae`` with masked positions zeroed, for rows without holes (valid prefix, then padding).

    ``δ_k = r_k − V_k + γ·V_{k+1}`` with ``V_{k+1}`` taken as 0 past a row's last valid token,
    δ = 0 on the padding, then the constant-coefficient scan; spent (B, T) buffers are reused,
    so the call holds two (its outputs).
    """
    # A small batch shares one select pattern among its four selects (the cost of a small call
    # is its operation count); a large one makes it a block at a time, in cache.
    bits = ops.mask_bits(mask, rewards.dtype) if 0 < rewards.numel() <= _SHARED_BITS and ops.bits_dtype(rewards.dtype) else None
    following = ops.zero_masked(values, mask, bits=bits)  # V, 0 on the padding
    delta = rewards - values
    if gamma != 0.0 and delta.shape[1] > 1:
        delta[:, :-1].add_(following[:, 1:], alpha=gamma)
    ops.zero_masked_(delta, mask, bits)
    advantages = _reverse_scan_into(delta, gamma * lam, out=following)
    # nothing valid follows a row's padding, so the scan of δ (0 there) left 0 there already
    return _remask_and_whiten(advantages, values, mask, whiten, spare=delta, zero_already=True, bits=bits)


_SHARED_BITS = 1 << 18
"""Up to this many entries, ``_gae_prefix`` makes the mask's select pattern once for all its selects."""


def _remask_and_whiten(advantages, values, mask, whiten, spare, zero_already=False, bits=None):
    """``advantages`` (a temporary) zeroed at masked positions (unless ``zero_already``),
    ``returns = A + V`` likewise (written over ``spare``, a spent (B, T) buffer), then the
    whitening in place: ``(advantages, returns)``. ``bits``: the mask's select pattern, if made."""
    if not zero_already:
        ops.zero_masked_(advantages, mask, bits)
    returns = ops.zero_masked_(torch.add(advantages, values, out=spare), mask, bits)
    if whiten:
        advantages = ops.masked_whiten(
            advantages, mask, remask=True, masked_are_zero=True, inplace=True, bits=bits
        )
    return advantages, returns


@attrs.frozen
class ReturnConfig:
    """Knobs of the discounted-return estimators."""

    gamma: float = rllab.knob(1.0, help="γ: discount per valid token", ge=0.0, le=1.0)


def _discounted_return(token_rewards, mask, gamma):
    """G over the valid tokens (observation tokens skipped), 0 at masked positions.

    Returns ``(returns, spare)``: ``spare`` is a spent (B, T) buffer of the returns' dtype that
    the caller may overwrite (None when there is none), so that the estimator's second output
    needs no fresh allocation.
    """
    rewards = token_rewards.detach().to(_float_dtype(token_rewards))
    holes = gamma == 1.0 or _has_holes(mask)  # the cumulative sum takes any mask
    if rewards.numel() and holes and (gamma == 1.0 or _masked_scan_ok(gamma, rewards.dtype)):
        # reverse scan of each row's valid tokens, a block of rows at a time (in cache)
        returns = torch.empty_like(rewards, memory_format=torch.contiguous_format)
        return _scan_rows(rewards, mask, gamma, returns), torch.empty_like(returns)
    holes = holes and _has_holes(mask)
    if not holes:
        # Without holes the scan leaves 0 on each row's trailing padding.
        zeroed = ops.zero_masked(rewards, mask)
        return _reverse_scan_into(zeroed, gamma, out=torch.empty_like(zeroed)), zeroed
    returns = _skip_scan(rewards, mask, gamma, _packing(mask))
    return ops.zero_masked(returns, mask), None


def reinforce(*, token_rewards, mask, index=None, values=None, config: ReturnConfig):
    """REINFORCE: the advantage is the discounted return-to-go, with no baseline.

    ``G_t = r_t + γ·G_{t+1}`` backwards over the valid tokens of each row (observation tokens
    skipped, as in ``gae``); ``advantages = returns = G``, 0 at masked positions.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; ``index``, ``values`` unused.
    :returns: ``(advantages, returns)``, both (B, T).
    """
    where = "advantage_estimator 'reinforce'"
    _check_inputs(where, token_rewards, mask)
    with torch.no_grad():
        returns, spare = _discounted_return(token_rewards, mask, config.gamma)
        copy = returns.clone() if spare is None else spare.copy_(returns)
    return returns, copy


def reinforce_plus_plus(*, token_rewards, mask, index=None, values=None, config: ReturnConfig):
    """REINFORCE++ (Hu 2025): discounted return-to-go, whitened over the batch (verl's ``reinforce_plus_plus``).

    ``G_t = r_t + γ·G_{t+1}`` backwards over the valid tokens (observation tokens skipped);
    ``returns = G`` (0 at masked positions, as verl); ``advantages = masked_whiten(G) × mask``
    over every valid token of the batch. With fewer than two valid tokens (verl raises) the
    advantages are only centred, i.e. 0.

    :param token_rewards: (B, T) float; :param mask: (B, T) bool; ``index``, ``values`` unused.
    :returns: ``(advantages, returns)``, both (B, T).
    """
    where = "advantage_estimator 'reinforce_plus_plus'"
    _check_inputs(where, token_rewards, mask)
    with torch.no_grad():
        returns, spare = _discounted_return(token_rewards, mask, config.gamma)
        advantages = ops.masked_whiten(returns, mask, remask=True, masked_are_zero=True, out=spare)
    return advantages, returns


def remax(*, token_rewards, mask, index=None, values=None, reward_baselines=None, config=None):
    """ReMax (Li et al. 2023): the return minus the reward of the policy's greedy response.

    ``returns_t = Σ_{j ≥ t} r_j`` (undiscounted reward-to-go over the row's valid tokens) and
    ``advantages = returns − b`` on valid tokens, where ``b`` is the reward of the greedy
    (argmax) response to the same prompt — a per-prompt baseline that costs one greedy rollout
    instead of a group (verl 0.9.1 ``compute_remax_outcome_advantage``). Masked positions are 0
    (verl leaves reward-to-go at observation positions inside a row; no loss reads them).

    :param token_rewards: (B, T) float; :param mask: (B, T) bool.
    :param reward_baselines: (B,) float, the greedy response's reward for each row's prompt
        (``requires=("reward_baselines",)``: the ``rl`` step samples it).
    :returns: ``(advantages, returns)``, both (B, T).
    """
    where = "advantage_estimator 'remax'"
    _check_inputs(where, token_rewards, mask)
    if reward_baselines is None:
        raise ValueError(f"{where}: needs reward_baselines (B,), the reward of the greedy response to each row's prompt")
    if not isinstance(reward_baselines, torch.Tensor) or reward_baselines.shape != token_rewards.shape[:1]:
        shape = tuple(getattr(reward_baselines, "shape", ()))
        raise ValueError(f"{where}: reward_baselines must be a ({token_rewards.shape[0]},) tensor, got shape {shape}")
    with torch.no_grad():
        rewards = ops.zero_masked(token_rewards, mask)
        returns = ops.zero_masked(discounted_reverse_cumsum(rewards, 1.0), mask)
        advantages = ops.zero_masked(returns - reward_baselines.to(returns.dtype)[:, None], mask)
    return advantages, returns
