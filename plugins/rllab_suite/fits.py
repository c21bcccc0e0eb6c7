"""Curves fitted to compute: ScaleRL's saturating curve per arm, with bootstrap CIs over seeds.

Khatri et al. 2025 ("The Art of Scaling Reinforcement Learning Compute for LLMs", arXiv
2510.13786) fit held-out performance R against training compute C with a sigmoid in log C::

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)

``R0`` the performance before training (here the mean step-0 accuracy over seeds, held fixed),
``A`` the asymptote (the accuracy the recipe saturates at), ``C_mid`` the compute at which half of
the gain ``A − R0`` is reached (efficiency) and ``B`` the steepness. Two recipes that differ in
``A`` scale differently; two with the same ``A`` and different ``C_mid`` differ only in how fast
they get there.

Per (task, arm) the curve is fitted to every seed's held-out accuracy at its eval steps against the
compute spent up to them (``tokens``: the sampled response tokens, ``rollout/tokens``; or
``seconds``: ``time/step``) with ``scipy.optimize.curve_fit`` under bounds (``A`` in [0, 1],
``B`` in [0.05, 20], ``C_mid`` within a factor 1000 of the data's range). ``A`` and ``C_mid`` get
95% percentile-bootstrap CIs from refits on seeds drawn with replacement — the same draw for every
arm, so two arms are compared on paired resamples (their seeds share prompts). A fit that fails,
whose parameters the data do not identify (left at their starting guesses, a singular Jacobian, a
curve no better than a constant: flat within its noise), or whose ``C_mid`` ends on its bound
(the data never bent, so ``A`` is an extrapolation), says so;
so does an ``A`` on its bound (0 or 1: the bound, not the data, set it), and each interval gives
the share of its refits that failed (an interval over the refits that converged is over a subset).

As ScaleRL validates its fits, each arm's curve is also fitted to the early part of the compute
alone (evaluations at up to :data:`EARLY_FRACTION` of the largest compute) and used to predict the
later evaluations: the prediction error (mean absolute error, points, of the prediction against the
mean over seeds at each later evaluation), beside that of the trivial forecast that accuracy stays
at the last early evaluation's mean, says whether the curve forecasts at all.

A fitted asymptote is a description, never a verdict: a pair whose either arm has an extrapolated
``A``, an ``A`` on its bound, or more than :data:`MAX_FAILED` of its refits failed is *not compared*.
"""

from __future__ import annotations

import math
import warnings

import attrs
import numpy as np

N_BOOT = 300
"""Bootstrap refits per (task, arm)."""
B_BOUNDS = (0.05, 20.0)
SPAN = 1000.0
"""``C_mid`` may lie this factor below the smallest or above the largest compute of the data."""
EARLY_FRACTION = 0.5
"""The predictive check fits the evaluations at up to this share of the largest compute and predicts the rest."""
MAX_FAILED = 0.1
"""A pair of arms is compared only when at most this share of either arm's refits failed."""


def saturating(C, A: float, B: float, C_mid: float, R0: float):
    """``R0 + (A − R0) / (1 + (C_mid / C)^B)``; ``R0`` at C = 0, ``A`` as C → ∞, half-way at ``C_mid``."""
    C = np.asarray(C, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        return R0 + (A - R0) / (1.0 + np.power(C_mid / C, B))


@attrs.frozen(kw_only=True)
class Fit:
    A: float = math.nan
    B: float = math.nan
    C_mid: float = math.nan
    R0: float = math.nan
    status: str = "ok"
    """``ok``; ``extrapolated: …`` (C_mid beyond the compute measured: A lies beyond the data); or
    why the fit is not a result (did not converge, too few points, a parameter on its bound)."""

    @property
    def ok(self) -> bool:
        """A usable fit: ``ok`` or ``extrapolated``."""
        return self.status == "ok" or self.status.startswith("extrapolated")


def fit_curve(C, R, R0: float) -> Fit:
    """Fit ``A``, ``B``, ``C_mid`` (``R0`` fixed) to points ``(C, R)`` with C > 0."""
    from scipy.optimize import OptimizeWarning, curve_fit

    C, R = np.asarray(C, dtype=float), np.asarray(R, dtype=float)
    good = np.isfinite(C) & np.isfinite(R) & (C > 0)
    C, R = C[good], R[good]
    if np.unique(C).size < 4 or not math.isfinite(R0):
        return Fit(R0=R0, status=f"too few evaluations to fit three parameters ({np.unique(C).size} compute values after step 0; need 4 or more)")
    lo, hi = C.min() / SPAN, C.max() * SPAN
    p0 = (float(np.clip(R.max(), 0.0, 1.0)), 1.0, float(np.median(C)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", OptimizeWarning)
            popt, _ = curve_fit(lambda c, A, B, Cm: saturating(c, A, B, Cm, R0), C, R, p0=p0,
                                bounds=((0.0, B_BOUNDS[0], lo), (1.0, B_BOUNDS[1], hi)), maxfev=5000)
    except OptimizeWarning as e:
        return Fit(R0=R0, status=f"parameters not identified ({str(e).splitlines()[0][:80]})")
    except (RuntimeError, ValueError) as e:
        return Fit(R0=R0, status=f"did not converge ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
    A, B, Cm = (float(x) for x in popt)
    if math.isclose(B, p0[1], rel_tol=1e-9) and math.isclose(Cm, p0[2], rel_tol=1e-9):
        return Fit(A=A, B=B, C_mid=Cm, R0=R0, status=f"parameters not identified: B and C_mid stayed at their starting guesses "
                   f"({p0[1]:g} and the median compute, {p0[2]:.3g}): nothing in the data moved them")
    status = "ok"
    if Cm >= hi * (1 - 1e-3) or Cm <= lo * (1 + 1e-3):
        status = f"C_mid at its bound ({Cm:.3g}): the curve never bends within the data, so A is not identified"
    elif B >= B_BOUNDS[1] * (1 - 1e-3) or B <= B_BOUNDS[0] * (1 + 1e-3):
        status = f"B at its bound ({B:.3g}): the evaluations do not resolve the rise, so C_mid is not identified"
    elif unidentified := _unidentified(C, R, R0, A, B, Cm):
        status = f"parameters not identified: {unidentified}"
    elif Cm > C.max():
        status = f"extrapolated: C_mid {Cm:.3g} beyond the largest compute measured ({C.max():.3g}), so A lies beyond the data"
    return Fit(A=A, B=B, C_mid=Cm, R0=R0, status=status)


SINGULAR = 1e-6
"""The fit's Jacobian (columns A, B, log C_mid) is singular when its smallest singular value is below
this share of its largest: some direction of the parameters changes no fitted point."""


def _unidentified(C, R, R0: float, A: float, B: float, Cm: float) -> str:
    """Why a converged fit's ``B`` and ``C_mid`` mean nothing ("" when they do): a Jacobian that is
    singular at the solution (on a flat curve, A = R0, B and C_mid change nothing), or a curve that
    explains the evaluations no better than a constant does (F-test of the fit against their mean,
    5% level: the data are flat within their noise, so there is no rise whose steepness and
    midpoint could be read). Parameters left at their starting guesses are caught before."""
    u = np.power(Cm / C, B)
    s = 1.0 / (1.0 + u)
    common = -(A - R0) * u * s * s  # the rise times d s / d(B·ln(C_mid/C))
    J = np.column_stack([s, common * np.log(Cm / C), common * B])  # dR/dA, dR/dB, dR/d ln C_mid
    sv = np.linalg.svd(J, compute_uv=False) if np.isfinite(J).all() else np.array([0.0])
    if sv.size < 3 or not sv[0] > 0 or sv[-1] < SINGULAR * sv[0]:
        return f"the fit is singular (a flat curve: its rise A − R0 = {100 * (A - R0):+.2g} points leaves B and C_mid without effect)"
    from scipy.stats import f as f_dist

    n = R.size
    rss_flat = float(np.sum((R - R.mean()) ** 2))
    rss_fit = float(np.sum((R - saturating(C, A, B, Cm, R0)) ** 2))
    if n <= 3:
        return ""
    if rss_flat == 0.0:
        return "a flat curve: every evaluation has the same accuracy, so B and C_mid describe nothing"
    F = math.inf if rss_fit == 0.0 else ((rss_flat - rss_fit) / 2) / (rss_fit / (n - 3))
    crit = float(f_dist.ppf(0.95, 2, n - 3))
    if not F > crit:
        return (f"a flat curve: the fit explains the evaluations no better than their mean does (F = {F:.2g}, "
                f"below {crit:.2g} at the 5% level), so B and C_mid describe noise")
    return ""


def _points(records) -> tuple[np.ndarray, np.ndarray, float]:
    """Every run's (compute, accuracy) at its eval steps after step 0, and R0 = the mean step-0 accuracy."""
    C, R, start = [], [], []
    for r, comp in records:
        for s, c, a in zip(r.steps, comp, r.accuracy):
            if s == 0:
                start.append(a)
            else:
                C.append(c)
                R.append(a)
    return np.asarray(C, dtype=float), np.asarray(R, dtype=float), float(np.mean(start)) if start else math.nan


def _ci(values) -> dict:
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if v.size < 2:
        return {"mean": math.nan, "low": math.nan, "high": math.nan}
    return {"mean": math.nan, "low": float(np.percentile(v, 2.5)), "high": float(np.percentile(v, 97.5))}


def fit_all(records, *, tasks: list, arms: list, kind: str = "tokens", baseline: str | None = None, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Per task: each arm's fit with bootstrap CIs of ``A`` and ``C_mid``, and per pair of fitted
    arms (each against ``baseline`` when given, else every pair) whether they differ in ``A``, only
    in ``C_mid``, or neither (paired bootstrap of ``A_x − A_y`` and ``C_mid_x / C_mid_y``)."""
    rng = np.random.default_rng(seed)
    out = {"kind": kind, "n_boot": n_boot, "tasks": {}}
    for task in tasks:
        runs = {a: [(r, r.compute(kind)) for r in records if r.task == task and r.variant == a and r.status == "done"] for a in arms}
        seeds = sorted({r.seed for rs in runs.values() for r, _ in rs})
        arms_out, boots = {}, {}
        for a, rs in runs.items():
            if not rs:
                continue
            if all(len(r.steps) <= 1 or r.steps[-1] == 0 for r, _ in rs):
                arms_out[a] = {"status": "no training (the warm start alone)", "R0": _points(rs)[2]}
                continue
            if any(not np.isfinite(c).all() for _, c in rs):
                arms_out[a] = {"status": f"no {kind} logged (rollout/tokens or time/step missing)", "R0": math.nan}
                continue
            fit = fit_curve(*_points(rs))
            arms_out[a] = {"status": fit.status, "A": fit.A, "B": fit.B, "C_mid": fit.C_mid, "R0": fit.R0,
                           "A_on_bound": fit.ok and (fit.A >= 1 - 1e-3 or fit.A <= 1e-3), "prediction": predictive_check(rs)}
            if fit.ok:  # an arm without a fit gets no interval either
                boots[a] = []
        for _ in range(n_boot if len(seeds) >= 2 else 0):
            draw = rng.choice(seeds, size=len(seeds), replace=True)
            for a in boots:
                by_seed = {r.seed: (r, c) for r, c in runs[a]}
                f = fit_curve(*_points([by_seed[s] for s in draw if s in by_seed]))
                boots[a].append((f.A, f.C_mid) if f.ok else (math.nan, math.nan))
        for a, b in boots.items():
            d = arms_out[a]
            d["A_ci"], d["C_mid_ci"] = _ci([x[0] for x in b]), _ci([x[1] for x in b])
            d["boot_failed"] = sum(not math.isfinite(x[0]) for x in b)
            d["boot_failure_rate"] = d["boot_failed"] / len(b) if b else math.nan
        fitted = list(boots)
        pairs = [(a, baseline) for a in fitted if a != baseline] if baseline in fitted else [(a, b) for i, a in enumerate(fitted) for b in fitted[i + 1:]]
        done = [_pair(a, b, boots[a], boots[b]) for a, b in pairs]
        for p in done:  # an asymptote the data do not pin down is never turned into a verdict
            why = [f"{x}: {reason}" for x in (p["arm"], p["other"]) for reason in _unpinned(arms_out[x])]
            if why:
                p["verdict"] = "not compared: " + "; ".join(why)
        out["tasks"][task] = {"arms": arms_out, "pairs": done}
    return out


def _unpinned(d: dict) -> list[str]:
    """Why an arm's fitted ``A`` cannot carry a comparison: extrapolated, on its bound, or too many failed refits."""
    out = []
    if d["status"].startswith("extrapolated"):
        out.append("A extrapolated beyond the compute measured")
    if d.get("A_on_bound"):
        out.append(f"A on its bound ({100 * d['A']:.0f}%)")
    rate = d.get("boot_failure_rate", 0.0)
    if math.isfinite(rate) and rate > MAX_FAILED:
        out.append(f"{100 * rate:.0f}% of the refits failed")
    return out


def predictive_check(rs, *, fraction: float = EARLY_FRACTION) -> dict:
    """Fit the evaluations at up to ``fraction`` of the largest compute, predict the later ones:
    ``{"status", "cutoff", "early_points", "later_steps", "mae", "mae_last"}``, ``mae`` the mean
    absolute error of the prediction against the mean over seeds at each later eval step (NaN when
    the early fit is not usable or nothing is left to predict), ``mae_last`` that of the trivial
    forecast that accuracy stays at the last early eval step's mean over seeds."""
    C, R, R0 = _points(rs)
    out = {"status": "", "cutoff": math.nan, "early_points": 0, "later_steps": 0, "mae": math.nan, "mae_last": math.nan}
    if C.size == 0:
        return {**out, "status": "no evaluations after step 0"}
    cutoff = fraction * float(C.max())
    early = C <= cutoff
    fit = fit_curve(C[early], R[early], R0)
    later, before = {}, {}
    for r, comp in rs:
        for s, c, a in zip(r.steps, comp, r.accuracy):
            if s > 0 and c > cutoff:
                later.setdefault(s, []).append((c, a))
            elif c <= cutoff and math.isfinite(a):
                before.setdefault(s, []).append(a)
    out.update(cutoff=cutoff, early_points=int(early.sum()), later_steps=len(later))
    if later and before:
        last = float(np.mean(before[max(before)]))
        out["mae_last"] = float(np.mean([abs(last - float(np.mean([a for _, a in v]))) for v in later.values()]))
    if not fit.ok:
        return {**out, "status": f"early fit not usable: {fit.status}"}
    if not later:
        return {**out, "status": "nothing after the cutoff to predict"}
    errs = [abs(float(saturating(np.mean([c for c, _ in v]), fit.A, fit.B, fit.C_mid, R0)) - float(np.mean([a for _, a in v]))) for v in later.values()]
    return {**out, "status": "ok", "mae": float(np.mean(errs))}


def _pair(a: str, b: str, ba: list, bb: list) -> dict:
    dA = [x[0] - y[0] for x, y in zip(ba, bb)]
    ratio = [x[1] / y[1] for x, y in zip(ba, bb) if math.isfinite(x[1]) and math.isfinite(y[1]) and y[1] > 0]
    dA_ci, r_ci = _ci(dA), _ci(ratio)
    if math.isfinite(dA_ci["low"]) and (dA_ci["low"] > 0 or dA_ci["high"] < 0):
        verdict = f"differ in A: {a} saturates {'higher' if dA_ci['low'] > 0 else 'lower'}"
    elif math.isfinite(r_ci["low"]) and (r_ci["low"] > 1 or r_ci["high"] < 1):
        verdict = f"same A within the CI; differ only in efficiency: {a} reaches half its gain with {'more' if r_ci['low'] > 1 else 'less'} compute"
    elif not math.isfinite(dA_ci["low"]):
        verdict = "not compared: too few bootstrap fits converged"
    else:
        verdict = "not told apart: A and C_mid both overlap"
    return {"arm": a, "other": b, "dA_ci": dA_ci, "C_mid_ratio_ci": r_ci, "verdict": verdict}


def _has_ci(d: dict, name: str) -> bool:
    """Whether an arm has a fitted ``name`` and a bootstrap interval for it."""
    return math.isfinite(d.get(name, math.nan)) and math.isfinite(d.get(f"{name}_ci", {}).get("low", math.nan))


def _num(x: float, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, float) and math.isfinite(x) else "—"


def markdown_lines(fits: dict, task: str) -> list[str]:
    """The fits table and the pair verdicts of one task, as Markdown."""
    t = fits["tasks"].get(task)
    if not t or not t["arms"]:
        return []
    unit = "tokens" if fits["kind"] == "tokens" else "s"
    lines = [
        f"## curves fitted to compute, task `{task}`", "",
        f"R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) over training {fits['kind']} (ScaleRL), R0 the mean step-0 accuracy; "
        f"95% percentile-bootstrap CIs from {fits['n_boot']} refits on seeds drawn with replacement.", "",
        "A fitted asymptote describes a curve and is never a verdict; pairs with an extrapolated A, an A on its bound, or "
        f"more than {100 * MAX_FAILED:.0f}% failed refits are not compared. *Predicts*: the curve fitted to the evaluations at up to "
        f"{100 * EARLY_FRACTION:.0f}% of the largest compute, its mean absolute error (points) on the later evaluations' means over seeds, "
        "beside that of keeping the last early evaluation's mean (the last value): a curve that forecasts beats it.", "",
        "| arm | A % [95% CI] | C_mid " + unit + " [95% CI] | B | R0 % | refit failures | predicts (MAE, points) | fit |", "|---|---|---|---|---|---|---|---|",
    ]
    for a, d in t["arms"].items():
        A = _num(100 * d.get("A", math.nan), ".1f") + (f" [{_num(100 * d['A_ci']['low'], '.1f')}, {_num(100 * d['A_ci']['high'], '.1f')}]" if _has_ci(d, "A") else "")
        C = _num(d.get("C_mid", math.nan), ".3g") + (f" [{_num(d['C_mid_ci']['low'], '.3g')}, {_num(d['C_mid_ci']['high'], '.3g')}]" if _has_ci(d, "C_mid") else "")
        rate = d.get("boot_failure_rate", math.nan)
        fails = f"{d['boot_failed']} of {fits['n_boot']} ({100 * rate:.0f}%)" if math.isfinite(rate) else "—"
        pred = d.get("prediction") or {}
        last = pred.get("mae_last", math.nan)
        pred = (f"{100 * pred['mae']:.1f}" + (f" (last value {100 * last:.1f})" if math.isfinite(last) else "")
                if math.isfinite(pred.get("mae", math.nan)) else (pred.get("status") or "—"))
        bound = "; A on its bound" if d.get("A_on_bound") else ""
        lines.append(f"| {a} | {A} | {C} | {_num(d.get('B', math.nan), '.2f')} | {_num(100 * d.get('R0', math.nan), '.1f')} | {fails} | {pred} | {d['status']}{bound} |")
    lines.append("")
    for p in t["pairs"]:
        dA = p["dA_ci"]
        lines.append(f"- {p['arm']} vs {p['other']}: {p['verdict']} (A difference [{_num(100 * dA['low'], '.1f')}, {_num(100 * dA['high'], '.1f')}] points, "
                     f"C_mid ratio [{_num(p['C_mid_ratio_ci']['low'], '.2f')}, {_num(p['C_mid_ratio_ci']['high'], '.2f')}])")
    return lines + [""] if t["pairs"] else lines
