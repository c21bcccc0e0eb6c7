"""Comparing two frameworks' step-by-step values: rows, the first disagreement, the table.

A :class:`Row` is one optimizer step's quantity on both sides (``loss``, ``grad_norm``, ``lr``,
``weights``); :func:`compare` builds the rows from two mappings ``quantity -> [value per step]``
and marks each against its tolerance; :func:`first_disagreement` is the earliest row that is
off (by step, then in the order of :data:`QUANTITIES`); :func:`table` prints them.

Relative difference: ``|a − b| / max(|a|, |b|, floor)`` (:data:`FLOORS`). For ``weights`` the two sides give the
distance moved from the shared initial weights and the checker gives the distance between the two
models, so the relative difference is that of the *update*, not of the weights (which would hide
any difference under an ``lr`` of 1e-6).

**Signal.** A step whose generation batch has no group with reward variance has every advantage
0: both sides' policy losses and gradients are 0 up to rounding, and agreeing on them proves
nothing (with a KL term, TRL's exact 0 against rllab's 1e-9 would even read as a disagreement). Such
rows carry ``signal = False``: they are shown, never counted as agreement or disagreement, and
:func:`status` makes the whole check fail with "no signal" (exit status 2) unless every step had signal.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import attrs

QUANTITIES = ("loss", "grad_norm", "lr", "weights")
TOLERANCE = {"loss": 1e-4, "grad_norm": 1e-4, "lr": 1e-9, "weights": 1e-2}
"""Relative tolerance per quantity (float32 on the CPU; different summation orders).

Measured floors: TRL's gradient norm against itself with its micro-batches split in two (another
reduction order) agrees to 1e-7, rllab's against TRL's to 1e-7 (both measured as ``clip_grad_norm_``
measures, :func:`rllab_referee.stepcheck.grad_norm`). The update (``weights``) is far more sensitive:
Adam's first step moves each coordinate by ``lr · g / (|g| + ε)``, so the coordinates whose gradient
is near ε = 1e-8 — most lm_head rows, whose gradient is a sum of ``p · A`` over advantages that sum to 0,
i.e. rounding noise — turn 1e-9 differences of float32 rounding into a sizeable fraction of ``lr``.
TRL against itself (micro-batches split in two) differs by 4e-5 of the update; rllab's forward (position
ids from the mask, another summation order) against TRL's by up to 1.1e-3 on the tiny model, where the
gradients agree to 1e-7. 1e-2 stays far below what any optimizer difference gives (SGD against AdamW:
a relative difference near 1)."""
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
    signal: bool = True
    """Whether the step's batch had a group with reward variance (a non-zero advantage)."""

    @property
    def ok(self) -> bool:
        return self.rel <= self.tol


NO_SIGNAL_EXIT = 2
"""Exit status of a check some of whose steps had no signal (1: a disagreement)."""


def group_signal(rewards: Sequence[float], groups: Sequence[int], trained: Sequence[bool] | None = None) -> tuple[int, int]:
    """(groups, groups with signal): a group has signal when a row that is trained on (``trained``: it
    has a token in the loss; default all) has a non-zero advantage, its reward differing from its
    group's mean. (A group whose differing rows were all masked out, a truncated completion under
    ``mask_truncated_completions``, moves nothing.)"""
    by: dict[int, list[tuple[float, bool]]] = {}
    for i, (r, g) in enumerate(zip(rewards, groups)):
        by.setdefault(int(g), []).append((float(r), True if trained is None else bool(trained[i])))
    live = 0
    for rows in by.values():
        mean = sum(r for r, _ in rows) / len(rows)
        live += any(t and r != mean for r, t in rows) and max(r for r, _ in rows) != min(r for r, _ in rows)
    return len(by), live


def with_signal(rows: Sequence[Row], signal: Sequence[bool], per: int = 1) -> list[Row]:
    """``rows`` with ``signal`` set from ``signal[step // per]`` (per: optimizer steps per batch)."""
    return [attrs.evolve(r, signal=bool(signal[r.step // per])) for r in rows]


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
    """The earliest row with signal (by step, then quantity) outside its tolerance; None when all agree."""
    return next((r for r in rows if r.signal and not r.ok), None)


def status(rows: Sequence[Row]) -> int:
    """0: every step had signal and agrees; 1: a step with signal disagrees; :data:`NO_SIGNAL_EXIT`: else."""
    if first_disagreement(rows) is not None:
        return 1
    return 0 if rows and all(r.signal for r in rows) else NO_SIGNAL_EXIT


def table(rows: Sequence[Row]) -> str:
    """A markdown table: step, quantity, trl, rllab, rel diff, and whether it agrees."""
    lines = ["| step | quantity | trl | rllab | rel diff | agrees |", "|---:|---|---:|---:|---:|---|"]
    for r in rows:
        agrees = "no signal" if not r.signal else "yes" if r.ok else "NO"
        lines.append(f"| {r.step} | {r.quantity} | {r.trl:.6g} | {r.rllab:.6g} | {r.rel:.2e} | {agrees} |")
    return "\n".join(lines)


def verdict(rows: Sequence[Row]) -> str:
    bad = first_disagreement(rows)
    steps = 1 + max((r.step for r in rows), default=-1)
    blind = sorted({r.step for r in rows if not r.signal})
    if bad is None and len(blind) == steps:
        return (f"no signal: in none of the {steps} optimizer steps did a group's rewards differ, so every advantage was 0 "
                "and nothing was compared (try other seeds, prompts or more steps)")
    if bad is None:
        seen = [r for r in rows if r.signal]
        worst = max(seen, key=lambda r: r.rel / r.tol)
        tail = f" (largest rel diff {worst.rel:.1e}, {worst.quantity} at step {worst.step})"
        if blind:
            return (f"no signal on optimizer step(s) {', '.join(map(str, blind))} (every advantage 0: not compared); "
                    f"the other {steps - len(blind)} agree{tail}")
        return f"agree: {steps} optimizer steps with signal, every quantity within tolerance{tail}"
    return (f"DISAGREE first at optimizer step {bad.step}, {bad.quantity}: trl {bad.trl:.6g}, rllab {bad.rllab:.6g}, "
            f"rel diff {bad.rel:.2e} > {bad.tol:.0e}")
