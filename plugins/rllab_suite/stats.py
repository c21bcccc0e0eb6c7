"""Statistics over seeds, after Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical
Precipice"): interval estimates, never bare means.

- **mean with a 95% bootstrap CI** over seeds (``scipy.stats.bootstrap``, percentile method:
  BCa is undefined when every seed scores the same, which is common on small held-out sets);
- **IQM**, the interquartile mean (``scipy.stats.trim_mean(x, 0.25)``) of every run of a
  variant, pooled over tasks, with a stratified bootstrap CI — reported from ``MIN_IQM_RUNS``
  runs, below which it would trim nothing;
- **probability of improvement** P(X > Y) of a variant X over the baseline Y: per task the
  Mann–Whitney U statistic over n·m (``scipy.stats.mannwhitneyu``, ties count ½), averaged over
  tasks, with a stratified bootstrap CI — reported from ``MIN_POI_SEEDS`` seeds per side.

With few seeds the intervals are wide and a percentile bootstrap under-covers; the tables say how
many runs each number rests on.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as st

CONFIDENCE = 0.95
N_RESAMPLES = 2000
MIN_IQM_RUNS = 4
MIN_POI_SEEDS = 3
MIN_RELIABLE_SEEDS = 5
"""Below this many seeds per (task, arm) a report marks its intervals as unreliable."""


def _finite(x) -> np.ndarray:
    a = np.asarray(list(x), dtype=float)
    return a[np.isfinite(a)]


def mean_ci(x, *, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high); the interval is NaN with fewer than two values."""
    a = _finite(x)
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    m = float(a.mean())
    if a.size < 2:
        return (m, math.nan, math.nan)
    if np.all(a == a[0]):
        return (m, m, m)
    res = st.bootstrap((a,), np.mean, confidence_level=CONFIDENCE, n_resamples=N_RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
    return (m, float(res.confidence_interval.low), float(res.confidence_interval.high))


def iqm(x) -> float:
    a = _finite(x)
    return float(st.trim_mean(a, 0.25)) if a.size else math.nan


def iqm_ci(groups: list, *, seed: int = 0) -> tuple[float, float, float] | None:
    """IQM of all runs pooled over the groups (tasks), with a bootstrap CI resampling within each
    group; None below :data:`MIN_IQM_RUNS` runs."""
    groups = [_finite(g) for g in groups]
    groups = [g for g in groups if g.size]
    pooled = np.concatenate(groups) if groups else np.array([])
    if pooled.size < MIN_IQM_RUNS:
        return None
    value = iqm(pooled)
    if np.all(pooled == pooled[0]) or any(g.size < 2 for g in groups):
        return (value, value if np.all(pooled == pooled[0]) else math.nan, value if np.all(pooled == pooled[0]) else math.nan)

    def stat(*gs, axis=-1):
        return st.trim_mean(np.concatenate(gs, axis=axis), 0.25, axis=axis)

    res = st.bootstrap(tuple(groups), stat, confidence_level=CONFIDENCE, n_resamples=N_RESAMPLES, method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return (value, float(res.confidence_interval.low), float(res.confidence_interval.high))


def prob_improvement(pairs: list[tuple], *, seed: int = 0) -> tuple[float, float, float] | None:
    """P(X > Y) averaged over tasks, ``pairs`` = [(x_scores, y_scores) per task]; None when a
    task has fewer than :data:`MIN_POI_SEEDS` scores on either side."""
    pairs = [(_finite(x), _finite(y)) for x, y in pairs]
    if not pairs or any(x.size < MIN_POI_SEEDS or y.size < MIN_POI_SEEDS for x, y in pairs):
        return None

    def one(x, y, axis=-1):
        u = st.mannwhitneyu(x, y, alternative="two-sided", axis=axis, method="asymptotic").statistic
        return u / (x.shape[axis] * y.shape[axis])

    value = float(np.mean([one(x, y) for x, y in pairs]))
    flat = [a for xy in pairs for a in xy]
    if all(np.all(a == flat[0][0]) for a in flat):
        return (value, value, value)

    def stat(*samples, axis=-1):
        return np.mean([one(samples[i], samples[i + 1], axis=axis) for i in range(0, len(samples), 2)], axis=0)

    res = st.bootstrap(tuple(flat), stat, confidence_level=CONFIDENCE, n_resamples=N_RESAMPLES, method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (value, lo, hi)


def auc(steps, values) -> float:
    """Area under a curve, normalised by its step range: the mean height (trapezoid rule)."""
    s, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if s.size == 0:
        return math.nan
    if s.size == 1 or s[-1] == s[0]:
        return float(v.mean())
    return float(np.trapezoid(v, s) / (s[-1] - s[0]))
