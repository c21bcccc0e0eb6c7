"""Masked tensor helpers shared by plugins: one home, so every component masks, checks and
whitens the same way.

* selection: :func:`scalar_zero`, :func:`zero_masked`, :func:`zero_masked_`, :func:`mask_bits`,
  :func:`mask_as`;
* statistics: :func:`masked_sum`, :func:`sum_of_squares`, :func:`masked_mean`, :func:`masked_var`, :func:`masked_whiten`,
  :func:`group_stats`, :func:`row_any`;
* input checks, whose errors name the component, the argument and the shapes (or the rows):
  :func:`check_token_tensor`, :func:`check_inputs`, :func:`check_finite`.

Every statistic is safe on fully masked input (it returns 0, never NaN) and ignores whatever
values sit at masked positions — NaN and inf included — because it selects (``torch.where``,
or a bitwise and with the mask's bit pattern) rather than multiplying by the mask.

Definitions (those of verl's ``core_algos``): ``masked_mean(x, m) = Σ x·m / Σ m``;
``masked_var`` is the unbiased (Bessel-corrected, ``Σm / (Σm − 1)``) variance;
``masked_whiten(x, m) = (x − masked_mean) · rsqrt(var + 1e-8)``.
"""

from __future__ import annotations

import math

import torch

from rllab.types import check_mask, check_same_shape, check_tensor

__all__ = [
    "scalar_zero",
    "zero_masked",
    "zero_masked_",
    "mask_bits",
    "bits_dtype",
    "mask_as",
    "check_token_tensor",
    "check_inputs",
    "masked_sum",
    "sum_of_squares",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "group_stats",
    "row_any",
    "check_finite",
    "RowError",
]


def scalar_zero(x: torch.Tensor) -> torch.Tensor:
    """A 0-d zero with the dtype and device of ``x`` (the cheap "else" branch of ``torch.where``)."""
    return torch.zeros((), dtype=x.dtype, device=x.device)


_SELECT_CHUNK = 1 << 18
"""Elements per block of a blocked select: the block's bit pattern (1 MiB in float32) stays in
cache and comes from the heap, never a fresh mapping."""

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The signed integer dtype as wide as ``dtype`` (None if there is none): the dtype of
    :func:`mask_bits` for ``dtype``."""
    return _INT_OF_WIDTH.get(dtype.itemsize)


def _fast_select_ok(x: torch.Tensor, mask: torch.Tensor) -> bool:
    return (
        not x.requires_grad
        and x.is_floating_point()
        and x.ndim >= 1
        and mask.dtype == torch.bool
        and mask.shape == x.shape
        and x.is_contiguous()
        and mask.is_contiguous()
        and x.device == mask.device
    )


def mask_bits(mask: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The select pattern of a bool ``mask`` for a float ``dtype``: every bit set (integer −1)
    where ``mask`` is True, 0 elsewhere, in the signed integer dtype as wide as ``dtype``.

    ``x.view(bits.dtype) & bits`` is ``torch.where(mask, x, 0)`` bit for bit (NaN, inf and −0
    included) and runs vectorised, where a select with a bool condition runs element by element
    on CPU (several times slower). ``out`` (that integer dtype, ``mask``'s shape) receives it.
    """
    small = mask.view(torch.int8)
    if out is None:
        return torch.neg(small).to(bits_dtype(dtype))
    return out.copy_(small).neg_()


def mask_as(mask: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``mask.to(dtype)`` (1 where True, 0 elsewhere) through the mask's bytes, a vectorised
    conversion (from ``bool`` it is not); ``out`` receives it."""
    small = mask.view(torch.int8)
    return small.to(dtype) if out is None else out.copy_(small)


def _select_into(x: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, bits: torch.Tensor | None = None) -> torch.Tensor:
    """``out = where(mask, x, 0)`` bit for bit, a block of leading rows at a time; ``out`` may
    be ``x``. Needs :func:`_fast_select_ok` and ``out`` contiguous, of ``x``'s shape and dtype.
    ``bits``: the mask's :func:`mask_bits` for ``x``'s dtype, made once by a caller that selects
    several tensors by one mask (then one operation here, not three)."""
    int_dtype = bits_dtype(x.dtype)
    xv, ov, mv = x.view(int_dtype), out.view(int_dtype), mask.view(torch.int8)
    if bits is not None and bits.dtype == int_dtype and bits.shape == x.shape:
        return torch.bitwise_and(xv, bits, out=ov).view(x.dtype)
    if x.numel() <= _SELECT_CHUNK or x.ndim == 1:
        if out.data_ptr() != x.data_ptr():  # the bit pattern written straight into out
            return ov.copy_(mv).neg_().bitwise_and_(xv).view(x.dtype)
        ov.bitwise_and_(torch.empty_like(ov).copy_(mv).neg_())
        return out
    per_row = x[0].numel()
    rows = max(1, _SELECT_CHUNK // max(per_row, 1))
    buf = torch.empty((rows,) + tuple(x.shape[1:]), dtype=int_dtype, device=x.device)
    for start in range(0, x.shape[0], rows):
        n = min(rows, x.shape[0] - start)
        bits = buf[:n].copy_(mv[start : start + n]).neg_()
        torch.bitwise_and(xv[start : start + n], bits, out=ov[start : start + n])
    return out


def zero_masked(x: torch.Tensor, mask: torch.Tensor, finite: bool = False, bits: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` where ``mask``, 0 elsewhere; same shape as ``x`` (``mask`` broadcastable to it, bool).

    Selects, so NaN or inf at a masked position cannot leak into the result or its gradient
    (masked positions get gradient 0). Without autograd, on a contiguous ``x`` and a mask of its
    shape, the select is a bitwise and with :func:`mask_bits` (the same bits as ``torch.where``,
    several times faster on CPU); otherwise ``torch.where``, or, when the caller has established
    that ``x`` is finite everywhere (``finite=True``, e.g. from :func:`check_inputs`), the cheaper
    ``x · mask``, which gives the same values and gradients.
    """
    if bits_dtype(x.dtype) is not None and _fast_select_ok(x, mask):
        return _select_into(x, mask, torch.empty_like(x, memory_format=torch.contiguous_format), bits)
    if finite:
        return x * mask
    return torch.where(mask, x, scalar_zero(x))


def zero_masked_(x: torch.Tensor, mask: torch.Tensor, bits: torch.Tensor | None = None) -> torch.Tensor:
    """In-place :func:`zero_masked`: ``x`` (a temporary, no autograd) gets 0 where ``mask`` is
    False and is returned. (A select, not a multiplication by the mask: multiplying a float
    tensor by a bool or byte mask first casts the whole mask to a float temporary. On a
    contiguous ``x`` the select is a bitwise and with the mask's bit pattern, a block of rows
    at a time.)"""
    if bits_dtype(x.dtype) is not None and _fast_select_ok(x, mask):
        return _select_into(x, mask, x, bits)
    return torch.where(mask, x, scalar_zero(x), out=x)


def check_token_tensor(where: str, name: str, x, mask, *, floating: bool = False) -> None:
    """Raise unless ``x`` is a (B, T) tensor (a float one with ``floating``) and ``mask`` a bool
    tensor of the same shape.

    Errors start with ``where`` (the component, e.g. ``"advantage_estimator 'gae'"``) and name the
    argument: ``"{where}: {name} must be a (B, T) tensor, got (5,)"``,
    ``"{where}: mask has shape (2, 4) but expected (2, 5)"``.
    """
    check_tensor(where, name, x, ndim=2, floating=floating, shape_doc="(B, T)")
    check_mask(where, mask, like=x)


def check_inputs(where: str, mask: torch.Tensor, **tensors: torch.Tensor | None) -> bool:
    """Shapes, dtypes and finiteness of (B, T) float inputs; errors name the argument and both shapes.

    ``tensors`` are the float inputs in order (the first is the reference shape; None entries are
    skipped); ``mask`` (B, T) bool. Raises ``TypeError`` for a non-tensor or non-float input or a
    non-bool mask, ``ValueError`` for a first input that is not 2-D or any shape that differs from
    the first's (``"{where}: weights has shape (5,) but log_prob has shape (5, 7)"``), and
    :class:`RowError` naming the rows for NaN or inf at a position where ``mask`` is True. Returns
    True when every input is finite at *every* position, masked ones included (then
    ``zero_masked(..., finite=True)`` may multiply instead of select).

    Cost: one device sync. The common all-finite case is recognised from the inputs' sums (a sum
    is finite only if every term is — an overflowing sum merely sends us to the exact test), which
    is far cheaper than a per-element ``isfinite``.
    """
    present = {k: v for k, v in tensors.items() if v is not None}
    first_name, first = next(iter(present.items()))
    for name, t in present.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{where}: {name} must be a floating-point tensor, got {t.dtype}")
    if first.ndim != 2:
        raise ValueError(f"{where}: {first_name} must be (B, T), got shape {tuple(first.shape)}")
    check_mask(where, mask)
    check_same_shape(where, **present, mask=mask)
    total = 0.0  # float32 sums (float64 for float64 inputs: a cast per element costs 2x), added in Python
    for t in present.values():
        total += (t.detach() if t.requires_grad else t).sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32).item()
    if math.isfinite(total):
        return True
    bad = None
    for t in present.values():
        b = ~torch.isfinite(t.detach())
        bad = b if bad is None else bad.logical_or_(b)
    if bool((bad & mask).any()):
        for name, t in present.items():
            check_finite(where, name, t.detach(), mask)
    return not bool(bad.any())


_CHUNK_ELEMENTS = 1 << 18
"""Elements per block of a blocked reduction: a temporary of this size stays in cache and
costs few fresh pages, where one the size of a large (B, T) batch costs more than the work."""


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x over positions where ``mask`` is True (over everything, or along ``dim``)."""
    if dim is not None and x.ndim == 2 and mask.shape == x.shape and dim in (1, -1) and not x.requires_grad:
        return _masked_row_sum(x, mask)
    z = zero_masked(x, mask)
    return z.sum() if dim is None else z.sum(dim)


def _masked_row_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``zero_masked(x, mask).sum(1)`` for (B, T) ``x``, a block of rows at a time (same values)."""
    B, T = x.shape
    rows = max(1, _CHUNK_ELEMENTS // max(T, 1))
    if B <= rows:
        return zero_masked(x, mask).sum(1)
    out = torch.empty(B, dtype=x.dtype, device=x.device)
    buf = torch.empty(rows, T, dtype=x.dtype, device=x.device)
    int_dtype = bits_dtype(x.dtype)
    if int_dtype is not None and _fast_select_ok(x, mask):
        # the select as a bitwise and with the mask's bit pattern (see mask_bits), in cache
        xv, mv, bits = x.view(int_dtype), mask.view(torch.int8), buf.view(int_dtype)
        for start in range(0, B, rows):
            n = min(rows, B - start)
            bits[:n].copy_(mv[start : start + n]).neg_().bitwise_and_(xv[start : start + n])
            torch.sum(buf[:n], 1, out=out[start : start + n])
        return out
    zero = scalar_zero(x)
    for start in range(0, B, rows):
        n = min(rows, B - start)
        torch.where(mask[start : start + n], x[start : start + n], zero, out=buf[:n])
        torch.sum(buf[:n], 1, out=out[start : start + n])
    return out


_SQUARES_CHUNK = 1 << 18
"""Elements per chunk of :func:`sum_of_squares`: its temporary (1 MiB in float32) stays in
cache, comes from the heap and is reused chunk after chunk, never a fresh mapping."""


def sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """Σ x² over all of ``x`` (a 0-d tensor of ``x``'s dtype), a chunk at a time with the chunk
    sums added in float64: no temporary the size of ``x`` (a large one costs fresh pages, often
    more than the arithmetic) and no float64 copy of ``x``."""
    if x.requires_grad or x.numel() <= _SQUARES_CHUNK or not x.is_floating_point():
        return (x * x).sum()
    flat = x.reshape(-1)
    n_chunks = -(-flat.numel() // _SQUARES_CHUNK)
    buf = torch.empty(_SQUARES_CHUNK, dtype=x.dtype, device=x.device)
    partial = torch.empty(n_chunks, dtype=x.dtype, device=x.device)
    for i, chunk in enumerate(flat.split(_SQUARES_CHUNK)):
        square = torch.mul(chunk, chunk, out=buf[: chunk.numel()])
        torch.sum(square, 0, out=partial[i])
    return partial.to(torch.promote_types(x.dtype, torch.float64)).sum().to(x.dtype)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·m / Σ m; 0 where nothing is valid."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid entries of ``x`` (over the whole tensor).

    Unbiased by default (Bessel's correction ``n / (n − 1)``, as verl's ``masked_var``). With
    ``n ≤ 1`` valid entries the variance is undefined; rllab returns 0 there (verl raises).
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum().to(x.dtype)
        var = torch.where(n > 1, var * n / (n - 1).clamp(min=1), torch.zeros_like(var))
    return var


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    *,
    remask: bool = False,
    masked_are_zero: bool = False,
    inplace: bool = False,
    out: torch.Tensor | None = None,
    bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """(x − mean) · rsqrt(var + eps) with the masked mean and unbiased variance over all of ``x``.

    ``x`` float, ``mask`` bool of the same shape; returns the shape of ``x``. The statistics
    are verl's ``masked_whiten`` (mean and Bessel-corrected variance of the valid entries, whole
    batch). ``shift_mean=False`` adds the mean back (scale only). Masked positions are whitened
    too (their values are not part of the statistics), exactly as verl does; ``remask=True``
    zeroes them instead. ``masked_are_zero=True`` tells the function that ``x`` already holds 0
    at every masked position (it saves one pass; the result is the same). ``inplace=True`` lets
    the function overwrite ``x`` (a temporary of the caller's) and return it, and ``out`` (a
    spent buffer of ``x``'s shape and dtype, not overlapping ``x``) receives the result instead
    of a new tensor: both save (B, T) allocations; the values are the same.

    With fewer than two valid entries the variance is undefined (verl raises): the result is
    then only centred (scale 1), so a lone valid entry gets 0 and no masked position is blown up
    by ``rsqrt(eps)``. ``bits``: the mask's :func:`mask_bits`, when the caller has it already.
    """
    target = x if out is None else out
    if (
        remask and shift_mean and masked_are_zero and (inplace or out is not None) and x.numel() <= _SQUARES_CHUNK
        and bits_dtype(x.dtype) is not None and _fast_select_ok(x, mask) and target.is_contiguous()
    ):
        return _whiten_small(x, mask, eps, target, bits)
    n = torch.count_nonzero(mask)
    mean = (x if masked_are_zero else zero_masked(x, mask)).sum() / n.clamp(min=1)
    if (
        remask
        and shift_mean
        and (inplace or out is not None)
        and bits_dtype(x.dtype) is not None
        and _fast_select_ok(x, mask)
        and target.is_contiguous()
    ):
        return _whiten_blocked(x, mask, n, mean, eps, target, bits)
    if out is not None and not x.requires_grad:
        shifted = torch.sub(x, mean, out=out)
    else:
        shifted = x.sub_(mean) if inplace else x - mean
    if remask and not shifted.requires_grad:
        centred = zero_masked_(shifted, mask, bits)
    else:
        centred = zero_masked(shifted, mask)
    var = sum_of_squares(centred) / (n - 1).clamp(min=1)
    scale = torch.where(n > 1, torch.rsqrt(var + eps), torch.ones_like(var))
    out = (centred if remask else shifted).mul_(scale)
    if not shift_mean:
        out = out.add_(zero_masked(mean.expand_as(out), mask) if remask else mean)
    return out


def _whiten_small(x, mask, eps, out, bits=None):
    """:func:`masked_whiten` with ``remask`` of an ``x`` that fits one block of the blocked path
    and holds 0 at masked positions, into ``out``: the same operations, in the same order, as
    that path's one block, with the count as a Python number (half the operations: a small
    call's cost is its operation count)."""
    n = int(torch.count_nonzero(mask))
    centred = torch.sub(x, x.sum() / max(n, 1), out=out)
    _select_into(centred, mask, centred, bits)
    flat = centred.reshape(-1)
    var = torch.sum(torch.mul(flat, flat), 0) / max(n - 1, 1)
    return centred.mul_(torch.rsqrt(var + eps)) if n > 1 else centred


def _whiten_blocked(x, mask, n, mean, eps, out, bits=None):
    """:func:`masked_whiten` with ``remask``, written into ``out`` (``x`` itself or a buffer of its
    shape): the centring, the select and the squares a block at a time (in cache), then one
    scaling pass. The same values as the unblocked path (same blocks for the sum of squares)."""
    int_dtype = bits_dtype(x.dtype)
    xf, of, mf = x.reshape(-1), out.reshape(-1), mask.reshape(-1).view(torch.int8)
    size = max(1, min(_SQUARES_CHUNK, xf.numel()))
    given = bits is not None and bits.dtype == int_dtype and bits.shape == x.shape
    bits_buf = torch.empty(size, dtype=int_dtype, device=x.device)
    squares = bits_buf.view(x.dtype)  # spent bits of the block hold its squares
    starts = range(0, xf.numel(), size)
    partial = torch.zeros(max(1, len(starts)), dtype=x.dtype, device=x.device)
    for i, start in enumerate(starts):
        stop = min(xf.numel(), start + size)
        centred = torch.sub(xf[start:stop], mean, out=of[start:stop])
        block = bits.reshape(-1)[start:stop] if given else bits_buf[: stop - start].copy_(mf[start:stop]).neg_()
        centred.view(int_dtype).bitwise_and_(block)
        torch.sum(torch.mul(centred, centred, out=squares[: stop - start]), 0, out=partial[i])
    total = partial[0] if len(partial) == 1 else partial.to(torch.promote_types(x.dtype, torch.float64)).sum()
    var = total.to(x.dtype) / (n - 1).clamp(min=1)
    scale = torch.where(n > 1, torch.rsqrt(var + eps), torch.ones_like(var))
    return out.mul_(scale)


def row_any(mask: torch.Tensor) -> torch.Tensor:
    """``mask.any(dim=-1)`` for a bool ``mask``, computed as a byte maximum (several times faster
    than ``any`` along a dimension on CPU)."""
    if mask.shape[-1] == 0:
        return torch.zeros(mask.shape[:-1], dtype=torch.bool, device=mask.device)
    return mask.view(torch.uint8).amax(dim=-1).bool()


def group_stats(values: torch.Tensor, index: torch.Tensor, valid: torch.Tensor | None = None):
    """Per-group count, mean and unbiased std of ``values`` (B,), broadcast back to rows.

    Groups are rows sharing an ``index`` value (any int64 ids, not necessarily contiguous).
    Uses segment sums (``index_add_``), no Python loop over groups. ``valid`` (B,) bool, when
    given, excludes rows from the statistics (they still receive their group's numbers).
    Returns ``(count, mean, std)``, each (B,): for a group of one, mean is the value and std
    is 0 (callers choose their own convention for singletons).
    """
    if values.ndim != 1 or index.shape != values.shape:
        raise ValueError(
            f"group_stats: values and index must both be (B,), got {tuple(values.shape)} and {tuple(index.shape)}"
        )
    _, inverse = torch.unique(index, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    w = torch.ones_like(values) if valid is None else valid.to(values.dtype)
    v = values if valid is None else torch.where(valid, values, torch.zeros_like(values))
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, inverse, w)
    total = torch.zeros_like(count).index_add_(0, inverse, v)
    mean = total / count.clamp(min=1)
    dev = torch.where(w > 0, v - mean[inverse], torch.zeros_like(v)) ** 2
    ss = torch.zeros_like(count).index_add_(0, inverse, dev)
    std = torch.sqrt(ss / (count - 1).clamp(min=1))
    std = torch.where(count > 1, std, torch.zeros_like(std))
    return count[inverse], mean[inverse], std[inverse]


class RowError(ValueError):
    """Bad values in specific rows of a batch; ``rows`` lists them."""

    def __init__(self, message: str, rows: list[int]):
        super().__init__(message)
        self.rows = rows


def check_finite(where: str, name: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Raise :class:`RowError` naming the rows of ``x`` that hold NaN or inf (where ``mask``).

    One device sync on the fast path (a single reduction: the sum of finite values is finite);
    the slow path that locates the bad rows runs only when something is wrong.
    """
    if x.numel() == 0:
        return
    total = (x if mask is None else zero_masked(x, mask)).sum()
    if bool(torch.isfinite(total)):
        return
    bad = ~torch.isfinite(x)
    if mask is not None:
        bad = bad & mask
    if bool(bad.any()):  # else: finite values whose sum overflowed
        rows = bad.reshape(bad.shape[0], -1).any(-1).nonzero().flatten().tolist() if bad.ndim else [0]
        sample = x.reshape(x.shape[0], -1)[rows[0]] if bad.ndim else x
        bad_vals = sample[~torch.isfinite(sample)][:3].tolist()
        shown = rows[:10]
        more = f" (and {len(rows) - 10} more)" if len(rows) > 10 else ""
        raise RowError(f"{where}: {name} is not finite in rows {shown}{more} (e.g. {bad_vals})", rows)
