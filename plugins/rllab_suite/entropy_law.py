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

**On held-out accuracy, checked by prediction** (:func:`heldout_check`), as the paper validates the
law: at each evaluation step the held-out accuracy R and the entropy H of the policy there (the
:data:`BIN` training steps up to it, exp(H) averaged; at step 0, the first step's). Per arm, the
law is fitted to every seed's points (a, b, R²), and to the points at up to :data:`EARLY_FRACTION`
of the last evaluation step only, which then predicts the later held-out accuracy from the later
entropy: the prediction's mean absolute error (points), beside that of the trivial forecast that
each run stays at its last early accuracy, and the difference of the two — each with a 95%
percentile-bootstrap CI from refits on runs drawn with replacement. The series it reads (each run's
eval steps, held-out accuracy and entropy) are kept in ``summary.json`` (``entropy_law.series``).
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
EARLY_FRACTION = 0.5
"""The held-out check fits the evaluations at up to this share of the last evaluation step and predicts the later ones."""


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


def eval_points(record, *, entropy: str = ENTROPY, bin_: int = BIN) -> dict:
    """One run's evaluations with the entropy there: ``{"steps", "accuracy", "entropy"}``, the
    entropy at eval step s the log of the mean of exp(H) over the training steps max(1, s − bin_ + 1)
    … max(1, s) that logged it (at step 0, the first step's: the warm start's policy); an evaluation
    without an entropy near it, or without a finite accuracy, is left out."""
    hs, hv = record.train.get(entropy, ((), ()))
    h = dict(zip(hs, hv))
    out = {"steps": [], "accuracy": [], "entropy": []}
    for step, acc in zip(record.steps, record.accuracy):
        near = [h[t] for t in range(max(1, int(step) - bin_ + 1), max(1, int(step)) + 1) if t in h and math.isfinite(h[t])]
        if not near or not math.isfinite(acc):
            continue
        out["steps"].append(int(step))
        out["accuracy"].append(float(acc))
        out["entropy"].append(float(np.log(np.mean(np.exp(near)))))
    return out


def _check_once(series: list[dict], cutoff: float) -> dict:
    """The law fitted to all points and to the early ones, and the early fit's prediction errors (fractions)."""
    H = [h for r in series for h in r["entropy"]]
    R = [v for r in series for v in r["accuracy"]]
    full = fit_law(H, R)
    early = [(h, v) for r in series for s, h, v in zip(r["steps"], r["entropy"], r["accuracy"]) if s <= cutoff]
    fit = fit_law([h for h, _ in early], [v for _, v in early])
    law_err, last_err = [], []
    for r in series:
        before = [v for s, v in zip(r["steps"], r["accuracy"]) if s <= cutoff]
        later = [(h, v) for s, h, v in zip(r["steps"], r["entropy"], r["accuracy"]) if s > cutoff]
        if not before or not later:
            continue
        for h, v in later:
            law_err.append(abs(float(law(h, fit.a, fit.b)) - v) if fit.ok else math.nan)
            last_err.append(abs(before[-1] - v))
    mae = lambda e: float(np.mean(e)) if e and all(math.isfinite(x) for x in e) else math.nan  # noqa: E731
    return {"full": full, "early": fit, "early_points": len(early), "predicted": len(law_err), "mae_law": mae(law_err), "mae_last": mae(last_err)}


def heldout_check(series: list[dict], *, fraction: float = EARLY_FRACTION, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """The law on held-out accuracy for one arm's runs (:func:`eval_points` of each), and checked by
    prediction (see the module docstring); errors in fractions (0.05 = 5 points)."""
    series = [r for r in series if r["steps"]]
    last = max((s for r in series for s in r["steps"]), default=0)
    cutoff = fraction * last
    one = _check_once(series, cutoff)
    full, early = one["full"], one["early"]
    out = {"status": full.status, "a": full.a, "b": full.b, "r2": full.r2, "points": full.n, "runs": len(series),
           "cutoff": cutoff, "early": {"status": early.status, "a": early.a, "b": early.b, "r2": early.r2, "points": early.n},
           "predicted": one["predicted"], "mae_law": one["mae_law"], "mae_last": one["mae_last"], "mae_diff": one["mae_law"] - one["mae_last"]}
    if not one["predicted"]:
        out["prediction_status"] = "nothing after the cutoff to predict"
    elif not early.ok:
        out["prediction_status"] = f"the early fit is not a result: {early.status}"
    else:
        out["prediction_status"] = "ok"
    if len(series) >= 2:
        rng = np.random.default_rng(seed)
        boot = [_check_once([series[i] for i in rng.integers(0, len(series), size=len(series))], cutoff) for _ in range(n_boot)]
        out["a_ci"] = _ci(b["full"].a for b in boot)
        out["b_ci"] = _ci(b["full"].b for b in boot)
        for key in ("mae_law", "mae_last"):
            out[f"{key}_ci"] = _ci(b[key] for b in boot)
        out["mae_diff_ci"] = _ci(b["mae_law"] - b["mae_last"] for b in boot)
        out["boot_failed"] = sum(not math.isfinite(b["mae_law"]) for b in boot)
    return out


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
    out = {"entropy": ENTROPY, "reward": REWARD, "bin": BIN, "late": LAST_HALF, "n_boot": n_boot, "baseline": baseline, "tasks": {},
           "early_fraction": EARLY_FRACTION, "series": {}, "heldout": {}}
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
                # runs drawn with replacement: a run is a (start, seed), so with several starts every start's runs count
                by_run = {(-1 if r.start is None else r.start, r.seed): r for r in rs}
                keys = sorted(by_run)
                boot = []
                for _ in range(n_boot):
                    f = fit_law(*_pooled([by_run[keys[i]] for i in rng.integers(0, len(keys), size=len(keys))]))
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
        series = {a: [{"seed": r.seed, **({} if r.start is None else {"start": r.start}), **eval_points(r)} for r in rs] for a, rs in runs.items() if rs}
        out["series"][task] = series
        out["heldout"][task] = {a: heldout_check(ss, n_boot=n_boot, seed=seed) for a, ss in series.items()}
        starts = list(dict.fromkeys(r.get("start") for ss in series.values() for r in ss))
        if len(starts) > 1:  # each starting model's runs alone: the law is a property of one model's training
            out.setdefault("heldout_per_start", {})[task] = [
                {"start": st, "arms": {a: heldout_check([r for r in ss if r.get("start") == st], n_boot=n_boot, seed=seed)
                                       for a, ss in series.items() if any(r.get("start") == st for r in ss)}} for st in starts]
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
    return lines + [""] + heldout_lines(law_, task)


def prediction_reading(d: dict) -> str:
    """Whether the early fit predicted the later held-out accuracy better than each run's last early value, from the CI of the difference."""
    if d.get("prediction_status") != "ok":
        return d.get("prediction_status") or "—"
    ci = d.get("mae_diff_ci") or {}
    lo, hi = ci.get("low", math.nan), ci.get("high", math.nan)
    if not (isinstance(lo, float) and math.isfinite(lo)):
        return "no interval (one run)"
    if hi < 0:
        return "better than the last value"
    if lo > 0:
        return "worse than the last value"
    return "not told apart from the last value"


def _pts(d: dict, name: str) -> str:
    v = d.get(name, math.nan)
    s = _num(100 * v, ".1f") if isinstance(v, float) and math.isfinite(v) else "—"
    ci = d.get(f"{name}_ci")
    if ci and isinstance(ci.get("low"), float) and math.isfinite(ci["low"]):
        sign = "+" if name == "mae_diff" else ""
        s = (f"{100 * v:{sign}.1f}" if s != "—" else s) + f" [{100 * ci['low']:{sign}.1f}, {100 * ci['high']:{sign}.1f}]"
    return s


def heldout_lines(law_: dict | None, task: str, *, heading: bool = True) -> list[str]:
    """The law on held-out accuracy and its predictive check for one task, as Markdown ([] when the summary has none)."""
    arms = ((law_ or {}).get("heldout") or {}).get(task)
    if not arms:
        return []
    frac = round(100 * law_.get("early_fraction", EARLY_FRACTION))
    lines = [f"### the law on held-out accuracy, checked by prediction, task `{task}`", ""] if heading else []
    lines += [f"R = held-out accuracy at each evaluation, H = `{law_['entropy']}` there (the {law_['bin']} training steps up to it, exp(H) "
              f"averaged; at step 0 the first step's). Fitted to every seed's evaluations, and to those at up to {frac}% of the last "
              "evaluation step alone, which then predicts each later evaluation from its entropy: the mean absolute error of that "
              "prediction (points), that of predicting each run's last early accuracy, and their difference (law − last value), "
              f"with 95% percentile-bootstrap CIs from {law_['n_boot']} refits on runs drawn with replacement.", "",
              "| arm | a [95% CI] | b [95% CI] | R² | points | early fit (steps ≤ cutoff): a, b, R², points | predicted | "
              "law's error, points [95% CI] | last value's error, points [95% CI] | law − last value [95% CI] | prediction |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a, d in arms.items():
        e = d["early"]
        early = (f"≤ {d['cutoff']:g}: {_num(e['a'], '.3g')}, {_num(e['b'], '.3g')}, {_num(e['r2'], '.2f')}, {e['points']}"
                 if e["status"] == "ok" else f"≤ {d['cutoff']:g}: {e['status']}")
        fit = f"{_with_ci(d, 'a', '.3g')} | {_with_ci(d, 'b', '.3g')} | {_num(d['r2'], '.2f')}" if d["status"] == "ok" else f"{d['status']} | — | —"
        lines.append(f"| {a} | {fit} | {d['points']} | {early} | {d['predicted']} | {_pts(d, 'mae_law')} | {_pts(d, 'mae_last')} | "
                     f"{_pts(d, 'mae_diff')} | {prediction_reading(d)} |")
    per = ((law_ or {}).get("heldout_per_start") or {}).get(task) or []
    if per:
        lines += ["", "The rows above pool the runs of every starting model; each start's runs alone:", "",
                  "| start | arm | a | b | R² | points | law's error, points [95% CI] | last value's error, points [95% CI] | "
                  "law − last value [95% CI] | prediction |", "|---|---|---|---|---|---|---|---|---|---|"]
        for st in per:
            for a, d in st["arms"].items():
                lines.append(f"| {st['start']} | {a} | {_num(d['a'], '.3g')} | {_num(d['b'], '.3g')} | {_num(d['r2'], '.2f')} | {d['points']} | "
                             f"{_pts(d, 'mae_law')} | {_pts(d, 'mae_last')} | {_pts(d, 'mae_diff')} | {prediction_reading(d)} |")
    return lines + [""]
