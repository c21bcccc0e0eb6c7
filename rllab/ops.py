"""Masked tensor helpers shared by plugins.

Every helper is safe on fully masked input (it returns 0, never NaN) and ignores whatever values
sit at masked positions — NaN and inf included — because it selects with ``torch.where`` rather
than multiplying by the mask.

Definitions (``../ALGORITHMS.md``): ``masked_mean(x, m) = Σ x·m / Σ m``;
``masked_var`` is the unbiased (Bessel-corrected, ``Σm / (Σm − 1)``) variance;
``masked_whiten(x, m) = (x − masked_mean) · rsqrt(var + 1e-8)``.
"""

from __future__ import annotations

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "group_stats",
    "check_finite",
    "RowError",
]


def _zeroed(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x over positions where ``mask`` is True (over everything, or along ``dim``)."""
    z = _zeroed(x, mask)
    return z.sum() if dim is None else z.sum(dim)


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


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) · rsqrt(var + eps) with the unbiased masked mean and variance.

    Masked positions are whitened too (their values are not part of the statistics), exactly as
    verl does; callers that need zeros there multiply by the mask. With ≤ 1 valid entry the
    variance is 0, so the result is ``(x − mean) · 1e4``: 0 at the valid entry.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out


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
    total = (x if mask is None else torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))).sum()
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
