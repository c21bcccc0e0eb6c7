"""Comparing two frameworks' step-by-step values: rows, the first disagreement, the table.

A :class:`Row` is one optimizer step's quantity on both sides (``loss``, ``grad_norm``, ``lr``,
``weights``); :func:`compare` builds the rows from two mappings ``quantity -> [value per step]``
and marks each against its tolerance; :func:`first_disagreement` is the earliest row that is
off (by step, then in the order of :data:`QUANTITIES`); :func:`table` prints them.

Relative difference: ``|a − b| / max(|a|, |b|, floor)`` (:data:`FLOORS`). For ``weights`` the two sides give the
distance moved from the shared initial weights and the checker gives the distance between the two
models, so the relative difference is that of the *update*, not of the weights (which would hide
any difference under an ``lr`` of 1e-6).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import attrs

QUANTITIES = ("loss", "grad_norm", "lr", "weights")
TOLERANCE = {"loss": 1e-4, "grad_norm": 1e-4, "lr": 1e-9, "weights": 1e-3}
"""Relative tolerance per quantity (float32 on the CPU; different summation orders)."""
FLOOR = 1e-12
FLOORS = {"loss": 1e-2}
"""Smallest denominator per quantity: a policy loss is a sum of terms of the size of the advantages
(about 1) that nearly cancel (advantages have mean 0 in a group), so its value sits near 0 and
only its absolute error (≤ tol × 0.01) is meaningful."""


@attrs.frozen
class Row:
    step: int
    quantity: str
    trl: float
    rllab: float
    rel: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.rel <= self.tol


def rel_diff(a: float, b: float, floor: float = FLOOR) -> float:
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    return abs(a - b) / max(abs(a), abs(b), floor)


def compare(trl: Mapping[str, Sequence[float]], rllab: Mapping[str, Sequence[float]], *,
            distance: Mapping[str, Sequence[float]] | None = None, tolerance: Mapping[str, float] | None = None) -> list[Row]:
    """Rows for every step and quantity both sides have; ``distance[q][i]``: a distance between
    the two sides measured directly (``weights``), used in place of ``|a − b|``."""
    tol = {**TOLERANCE, **(tolerance or {})}
    rows = []
    for q in QUANTITIES:
        if q not in trl or q not in rllab:
            continue
        a, b = list(trl[q]), list(rllab[q])
        if len(a) != len(b):
            raise ValueError(f"{q}: {len(a)} steps on the TRL side, {len(b)} on rllab's")
        for i, (x, y) in enumerate(zip(a, b)):
            if distance is not None and q in distance:
                rel = distance[q][i] / max(abs(x), abs(y), FLOOR)
            else:
                rel = rel_diff(float(x), float(y), FLOORS.get(q, FLOOR))
            rows.append(Row(step=i, quantity=q, trl=float(x), rllab=float(y), rel=rel, tol=tol.get(q, 1e-4)))
    order = {q: j for j, q in enumerate(QUANTITIES)}
    return sorted(rows, key=lambda r: (r.step, order[r.quantity]))


def first_disagreement(rows: Sequence[Row]) -> Row | None:
    """The earliest row (by step, then quantity) outside its tolerance; None when all agree."""
    return next((r for r in rows if not r.ok), None)


def table(rows: Sequence[Row]) -> str:
    """A markdown table: step, quantity, trl, rllab, rel diff, and whether it agrees."""
    lines = ["| step | quantity | trl | rllab | rel diff | agrees |", "|---:|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.step} | {r.quantity} | {r.trl:.6g} | {r.rllab:.6g} | {r.rel:.2e} | {'yes' if r.ok else 'NO'} |")
    return "\n".join(lines)


def verdict(rows: Sequence[Row]) -> str:
    bad = first_disagreement(rows)
    steps = 1 + max((r.step for r in rows), default=-1)
    if bad is None:
        worst = max(rows, key=lambda r: r.rel / r.tol, default=None)
        tail = f" (largest rel diff {worst.rel:.1e}, {worst.quantity} at step {worst.step})" if worst else ""
        return f"agree: {steps} optimizer steps, every quantity within tolerance{tail}"
    return (f"DISAGREE first at optimizer step {bad.step}, {bad.quantity}: trl {bad.trl:.6g}, rllab {bad.rllab:.6g}, "
            f"rel diff {bad.rel:.2e} > {bad.tol:.0e}")
