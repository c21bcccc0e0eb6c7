"""Masked tensor helpers shared by plugins: one home, so every component masks, checks and
whitens the same way.

* selection: :func:`scalar_zero`, :func:`zero_masked`, :func:`zero_masked_`;
* statistics: :func:`masked_sum`, :func:`sum_of_squares`, :func:`masked_mean`, :func:`masked_var`, :func:`masked_whiten`,
  :func:`group_stats`, :func:`row_any`;
* input checks, whose errors name the component, the argument and the shapes (or the rows):
  :func:`check_token_tensor`, :func:`check_inputs`, :func:`check_finite`.

Every statistic is safe on fully masked input (it returns 0, never NaN) and ignores whatever
values sit at masked positions — NaN and inf included — because it selects (``torch.where``)
rather than multiplying by the mask.

Definitions (those of verl's ``core_algos``): ``masked_mean(x, m) = Σ x·m / Σ m``;
``masked_var`` is the unbiased (Bessel-corrected, ``Σm / (Σm − 1)``) variance;
``masked_whiten(x, m) = (x − masked_mean) · rsqrt(var + 1e-8)``.
"""

from __future__ import annotations

import math

import torch

from rllab.parallel.reducer import current_reducer

__all__ = [
    "scalar_zero",
    "zero_masked",
    "zero_masked_",
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


def check_same_shape(where: str, **tensors: torch.Tensor | None) -> None:
    """Raise a ValueError naming both arguments when the given tensors' shapes differ."""
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.shape != first.shape:
            raise ValueError(
                f"{where}: {name} has shape {tuple(t.shape)} but {first_name} has shape {tuple(first.shape)}"
            )


def check_tensor(where: str, name: str, x, *, ndim: int | None = None, floating: bool = False, shape_doc: str = "") -> None:
    """Raise a clear error unless ``x`` is a tensor of rank ``ndim`` (and a float dtype)."""
    doc = f" {shape_doc}" if shape_doc else ""
    if not isinstance(x, torch.Tensor) or (ndim is not None and x.ndim != ndim):
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{where}: {name} must be a{doc} tensor, got {got}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{where}: {name} must be a float tensor, got {x.dtype}")


def check_mask(where: str, mask: torch.Tensor, like: torch.Tensor | None = None, name: str = "mask") -> None:
    """Raise a clear error unless ``mask`` is a bool tensor (of the same shape as ``like``)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a bool tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{where}: {name} must have dtype torch.bool, got {mask.dtype}")
    if like is not None and mask.shape != like.shape:
        raise ValueError(f"{where}: {name} has shape {tuple(mask.shape)} but expected {tuple(like.shape)}")


def scalar_zero(x: torch.Tensor) -> torch.Tensor:
    """A 0-d zero with the dtype and device of ``x`` (the cheap "else" branch of ``torch.where``)."""
    return torch.zeros((), dtype=x.dtype, device=x.device)


def zero_masked(x: torch.Tensor, mask: torch.Tensor, finite: bool = False) -> torch.Tensor:
    """``x`` where ``mask``, 0 elsewhere; same shape as ``x`` (``mask`` broadcastable to it, bool).

    Selects (``torch.where``), so NaN or inf at a masked position cannot leak into the result or
    its gradient (masked positions get gradient 0). When the caller has established that ``x`` is
    finite everywhere (``finite=True``, e.g. from :func:`check_inputs`) and ``x`` needs a gradient,
    ``x · mask``, whose backward is cheaper, gives the same values and gradients.
    """
    if finite and x.requires_grad:
        return x * mask
    return torch.where(mask, x, scalar_zero(x))


def zero_masked_(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """In-place :func:`zero_masked` of ``x`` (a temporary, no autograd), returned."""
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

    Cost: one device sync. The common all-finite case is recognised from the sum of the inputs'
    sums (a sum is finite only if every term is — an overflowing sum merely sends us to the exact
    test), which is far cheaper than a per-element ``isfinite``.
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
    # float32 sums (float64 for float64 inputs: a cast per element costs 2x), added on the device
    total = sum(t.detach().sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32) for t in present.values())
    if math.isfinite(total.item()):
        return True
    bad = None
    for t in present.values():
        b = ~torch.isfinite(t.detach())
        bad = b if bad is None else bad.logical_or_(b)
    if bool((bad & mask).any()):
        for name, t in present.items():
            check_finite(where, name, t.detach(), mask)
    return not bool(bad.any())


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x over positions where ``mask`` is True (over everything, or along ``dim``)."""
    z = zero_masked(x, mask)
    return z.sum() if dim is None else z.sum(dim)


def sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """Σ x² over all of ``x`` (a 0-d tensor of ``x``'s dtype)."""
    return torch.sum(x * x)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·m / Σ m; 0 where nothing is valid."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def log_prob_gap(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The rollout-vs-trainer log-prob gap over the valid tokens of ``mask`` (all (B, T); 0-d outputs).

    With Δ_t = old_log_prob_t − rollout_log_prob_t (log π_train/π_rollout, clamped to ±20 for k3):

    * ``mismatch/abs_diff`` — mean |Δ_t|;
    * ``mismatch/k1`` — mean −Δ_t, the k1 estimate of KL(π_rollout ‖ π_train) from the sampled
      tokens (may be negative on a finite sample);
    * ``mismatch/k3`` — mean exp(Δ_t) − 1 − Δ_t, the non-negative k3 estimate of the same KL.

    Detached; masked positions never matter (they may hold anything, NaN included). 0 when
    nothing is valid.
    """
    delta = zero_masked(old_log_prob.detach().float() - rollout_log_prob.detach().float(), mask)
    clamped = delta.clamp(-20.0, 20.0)
    return {
        "mismatch/abs_diff": masked_mean(delta.abs(), mask),
        "mismatch/k1": masked_mean(-delta, mask),
        "mismatch/k3": masked_mean(torch.expm1(clamped) - clamped, mask),
    }


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
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8, *, remask: bool = False
) -> torch.Tensor:
    """(x − mean) · rsqrt(var + eps) with the masked mean and unbiased variance over all of ``x``.

    ``x`` float, ``mask`` bool of the same shape; returns a new tensor of ``x``'s shape. The
    statistics are verl's ``masked_whiten``: mean and Bessel-corrected variance of the valid
    entries of the whole batch (whatever sits at masked positions, NaN included, is not part of
    them). ``shift_mean=False`` adds the mean back (scale only). Masked positions are whitened
    too, exactly as verl does; ``remask=True`` gives 0 there instead.

    With fewer than two valid entries the variance is undefined (verl raises): the result is
    then only centred (scale 1), so a lone valid entry gets 0 and no masked position is blown up
    by ``rsqrt(eps)``. No gradient flows through it (a batch statistic applied to advantages).
    Under data parallelism the moments are summed over ranks (:func:`rllab.parallel.reducer.current_reducer`).
    """
    reducer = current_reducer()  # data parallel: the moments of the whole batch, over every rank
    with torch.no_grad():
        n = int(reducer.sum(int(torch.count_nonzero(mask))))
        centred = zero_masked(x, mask)
        mean = reducer.sum(centred.sum()) / max(n, 1)
        centred = zero_masked_(centred.sub_(mean), mask)
        scale = torch.rsqrt(reducer.sum(sum_of_squares(centred)) / (n - 1) + eps) if n > 1 else 1.0
        out = centred.mul_(scale) if remask else (x - mean).mul_(scale)
        if not shift_mean:
            out = out.add_(zero_masked(mean.expand_as(out), mask) if remask else mean)
    return out


def row_any(mask: torch.Tensor) -> torch.Tensor:
    """``mask.any(dim=-1)`` for a bool ``mask``: whether each row has a token that counts."""
    return mask.any(dim=-1)


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
