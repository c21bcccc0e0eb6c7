"""Committed suite results read back: a ``runs.csv`` row (with its per-problem values) as a claim reads a run.

Shared by :mod:`rllab_suite.findings` and :mod:`rllab_suite.pooled`.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import attrs


@attrs.frozen(kw_only=True)
class CsvRun:
    """One row of a committed ``runs.csv``, read as a :class:`rllab_suite.records.RunRecord` is for a claim."""

    variant: str
    task: str
    seed: int
    status: str
    values: dict
    problems: dict = attrs.field(factory=dict)
    """metric -> per-problem values, from the committed ``problems.csv`` (absent for older results)."""
    start: int | None = None
    """The warm-start seed the run began from (runs.csv's ``start``, for a suite with several starts)."""
    start_sha256: str | None = None

    def metric_value(self, metric: str) -> float:
        if metric in self.problems:
            return sum(self.problems[metric]) / len(self.problems[metric])
        key = f"last {metric[6:]}" if metric.startswith("track:") else metric
        try:
            return float(self.values.get(key, "nan"))
        except ValueError:
            return math.nan

    def problem_values(self, metric: str) -> list[float] | None:
        return self.problems.get(metric)


def read_runs_csv(path: Path) -> list[CsvRun]:
    """A committed ``runs.csv``, with each run's per-problem values from ``problems.csv`` beside it when present."""
    def start(r: dict) -> int | None:
        return int(r["start"]) if r.get("start") not in (None, "") else None

    per: dict[tuple, dict] = {}
    if (path.parent / "problems.csv").is_file():
        with (path.parent / "problems.csv").open(newline="") as f:
            for r in csv.DictReader(f):
                per.setdefault((r["variant"], r["task"], int(r["seed"]), start(r)), {})[r["metric"]] = [float(v) for v in r["values"].split()]
    with path.open(newline="") as f:
        return [CsvRun(variant=r["variant"], task=r["task"], seed=int(r["seed"]), status=r["status"], values=r,
                       problems=per.get((r["variant"], r["task"], int(r["seed"]), start(r)), {}), start=start(r),
                       start_sha256=r.get("start_sha256") or None) for r in csv.DictReader(f)]


def read_summary_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
