"""The entropy–performance law per arm, with bootstrap CIs over seeds; and each arm's entropy against the baseline's.

Cui et al. 2025 ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv 2505.22617) find that along training the policy's reward R and its entropy H follow::

    R = −a · exp(H) + b

so performance is bought with entropy, and once entropy is spent (H → 0) the reward tops out at
``−a + b``. The law is linear in ``x = exp(H)``, so it is fitted by ordinary least squares
(``numpy.polyfit`` of degree 1: slope ``−a``, intercept ``b``) — no iteration, no starting point.

Per (task, arm) the points are every run's training metrics (``actor/entropy`` for H, the training
reward ``rollout/accuracy`` for R — the share of right answers, which a random-reward control logs
as well) averaged over consecutive bins of :data:`BIN` steps (exp(H) averaged, as the law is linear
in it), to tame the per-step noise of a small batch; the fit is over the pooled points of all seeds, its R² the share of the points' variance it
explains. ``a`` and ``b`` get 95% percentile-bootstrap CIs from refits on seeds drawn with
replacement. Beside it, each arm's entropy — the mean over its last :data:`LAST_HALF` of steps and
over the whole run — with P(arm > baseline) (:func:`rllab_suite.stats.prob_improvement`).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from rllab_suite import stats

ENTROPY = "actor/entropy"
REWARD = "rollout/accuracy"
BIN = 5
"""Training steps averaged into one (H, R) point."""
LAST_HALF = 0.5
"""The share of a run's last steps over which its "late" entropy is averaged."""
N_BOOT = 300
"""Bootstrap refits per (task, arm)."""


def law(H, a: float, b: float):
    """``−a · exp(H) + b``."""
    return -a * np.exp(np.asarray(H, dtype=float)) + b


@attrs.frozen(kw_only=True)
class LawFit:
    a: float = math.nan
    b: float = math.nan
    r2: float = math.nan
    """The share of the points' variance in R the fit explains (1 − SS_res / SS_tot)."""
    n: int = 0
    """Points fitted."""
    status: str = "ok"
    """``ok``, or why there is no fit (too few points, entropy that never moved)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def fit_law(H, R) -> LawFit:
    """Least-squares ``a``, ``b`` of ``R = −a · exp(H) + b`` over the finite points ``(H, R)``, and its R²."""
    H, R = np.asarray(H, dtype=float), np.asarray(R, dtype=float)
    good = np.isfinite(H) & np.isfinite(R)
    H, R = H[good], R[good]
    if H.size < 3:
        return LawFit(n=int(H.size), status=f"too few points to fit ({H.size}; need 3 or more)")
    x = np.exp(H)
    if np.ptp(x) <= 1e-12 * max(1.0, float(np.abs(x).max())):
        return LawFit(n=int(H.size), status="the entropy never moved: a is not identified")
    slope, b = np.polyfit(x, R, 1)
    ss_res = float(np.sum((R - (slope * x + b)) ** 2))
    ss_tot = float(np.sum((R - R.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-24 else math.nan)
    return LawFit(a=float(-slope), b=float(b), r2=r2, n=int(H.size))


def binned(record, *, entropy: str = ENTROPY, reward: str = REWARD, bin_: int = BIN) -> tuple[list, list]:
    """One run's (H, R) points over consecutive bins of ``bin_`` steps that logged both (a last,
    shorter bin included): R the bin's mean, H = log of the bin's mean of exp(H) — the law is linear
    in exp(H), so points on it average to a point on it."""
    hs, hv = record.train.get(entropy, ((), ()))
    rs, rv = record.train.get(reward, ((), ()))
    h, r = dict(zip(hs, hv)), dict(zip(rs, rv))
    steps = sorted(set(h) & set(r))
    H, R = [], []
    for i in range(0, len(steps), bin_):
        chunk = steps[i:i + bin_]
        H.append(float(np.log(np.mean([math.exp(h[s]) for s in chunk]))))
        R.append(float(np.mean([r[s] for s in chunk])))
    return H, R


def _pooled(runs: list) -> tuple[list, list]:
    H, R = [], []
    for r in runs:
        h, v = binned(r)
        H += h
        R += v
    return H, R


def _late(record, metric: str = ENTROPY) -> float:
    """A run's mean of ``metric`` over its last :data:`LAST_HALF` of the steps that logged it."""
    _, vals = record.train.get(metric, ((), ()))
    if record.status != "done" or not vals:
        return math.nan
    k = max(1, math.ceil(LAST_HALF * len(vals)))
    return float(np.mean(vals[-k:]))


def _whole(record, metric: str = ENTROPY) -> float:
    _, vals = record.train.get(metric, ((), ()))
    return float(np.mean(vals)) if record.status == "done" and vals else math.nan


def _ci(values) -> dict:
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if v.size < 2:
        return {"low": math.nan, "high": math.nan}
    return {"low": float(np.percentile(v, 2.5)), "high": float(np.percentile(v, 97.5))}


def fit_all(records, *, tasks: list, arms: list, baseline: str | None = None, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Per task and arm that logged entropy: the law's fit with bootstrap CIs of ``a`` and ``b``,
    and the arm's late and whole-run entropy (mean over seeds, 95% CI) with P(> ``baseline``)."""
    rng = np.random.default_rng(seed)
    out = {"entropy": ENTROPY, "reward": REWARD, "bin": BIN, "late": LAST_HALF, "n_boot": n_boot, "baseline": baseline, "tasks": {}}
    for task in tasks:
        runs = {a: [r for r in records if r.task == task and r.variant == a and r.status == "done" and ENTROPY in r.train] for a in arms}
        arms_out = {}
        for a, rs in runs.items():
            if not rs:
                continue
            fit = fit_law(*_pooled(rs))
            d = {"status": fit.status, "a": fit.a, "b": fit.b, "r2": fit.r2, "points": fit.n, "seeds": len(rs)}
            for name, fn in (("late", _late), ("whole", _whole)):
                m, lo, hi = stats.mean_ci([fn(r) for r in rs])
                d[f"entropy_{name}"] = {"mean": m, "low": lo, "high": hi}
            if fit.ok and len(rs) >= 2:
                by_seed = {r.seed: r for r in rs}
                seeds = sorted(by_seed)
                boot = []
                for _ in range(n_boot):
                    f = fit_law(*_pooled([by_seed[s] for s in rng.choice(seeds, size=len(seeds), replace=True)]))
                    boot.append((f.a, f.b) if f.ok else (math.nan, math.nan))
                d["a_ci"], d["b_ci"] = _ci(x[0] for x in boot), _ci(x[1] for x in boot)
                d["boot_failed"] = sum(not math.isfinite(x[0]) for x in boot)
            arms_out[a] = d
        if baseline in runs and runs[baseline]:
            for a, d in arms_out.items():
                if a == baseline:
                    continue
                for name, fn in (("late", _late), ("whole", _whole)):
                    poi = stats.prob_improvement([([fn(r) for r in runs[a]], [fn(r) for r in runs[baseline]])])
                    d[f"p_higher_{name}"] = dict(zip(("mean", "low", "high"), poi)) if poi is not None else None
        out["tasks"][task] = arms_out
    return out


def _num(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, float) and math.isfinite(x) else "—"


def _with_ci(d: dict, name: str, fmt: str) -> str:
    s = _num(d.get(name, math.nan), fmt)
    ci = d.get(f"{name}_ci")
    return s + (f" [{_num(ci['low'], fmt)}, {_num(ci['high'], fmt)}]" if ci and math.isfinite(ci["low"]) else "")


def _stat(d: dict | None, fmt: str) -> str:
    if not d or d.get("mean") is None or not math.isfinite(d["mean"]):
        return "—"
    return _num(d["mean"], fmt) + (f" [{_num(d['low'], fmt)}, {_num(d['high'], fmt)}]" if math.isfinite(d.get("low", math.nan)) else "")


def markdown_lines(law_: dict | None, task: str) -> list[str]:
    """The entropy table and the law's fits of one task, as Markdown."""
    arms = (law_ or {}).get("tasks", {}).get(task)
    if not arms:
        return []
    base = law_["baseline"]
    late = round(100 * law_["late"])
    lines = [
        f"## entropy and the entropy–performance law, task `{task}`", "",
        f"Entropy (`{law_['entropy']}`): each run's mean over its last {late}% of steps and over the whole run, mean over seeds "
        f"with a 95% bootstrap CI, and P(arm's > {base or 'baseline'}'s). The law R = −a·exp(H) + b (Cui et al. 2025) fitted by least "
        f"squares to the (H, R) points of every seed (R = `{law_['reward']}`; each point the mean over {law_['bin']} steps); "
        f"a and b with 95% percentile-bootstrap CIs from {law_['n_boot']} refits on seeds drawn with replacement; R² of the pooled fit.", "",
        f"| arm | entropy, last {late}% | P(higher, last {late}%) | entropy, whole run | P(higher, whole run) | a [95% CI] | b [95% CI] | R² | points | fit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a, d in arms.items():
        pl = "baseline" if a == base else _stat(d.get("p_higher_late"), ".2f")
        pw = "baseline" if a == base else _stat(d.get("p_higher_whole"), ".2f")
        fails = f" ({d['boot_failed']} of {law_['n_boot']} refits failed)" if d.get("boot_failed") else ""
        lines.append(f"| {a} | {_stat(d['entropy_late'], '.3f')} | {pl} | {_stat(d['entropy_whole'], '.3f')} | {pw} | "
                     f"{_with_ci(d, 'a', '.3g')} | {_with_ci(d, 'b', '.3g')} | {_num(d['r2'], '.2f')} | {d['points']} | {d['status']}{fails} |")
    return lines + [""]
