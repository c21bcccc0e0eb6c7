"""Verdicts computed from a suite's claims: a fixed vocabulary, decided by code, never by prose.

A suite file states what a paper claims and how big an effect must be to count::

    [claims.tis_recovers_sync]
    statement = "TIS recovers the synchronous run under staleness"
    arm = "tis"
    against = "sync"
    metric = "auc_accuracy"     # final_accuracy, auc_accuracy, final_reward, auc_reward, pass@K, track:NAME
    direction = "equal"         # higher, lower (the paper's direction for arm − against) or equal
    min_effect = 0.03           # the smallest effect that counts, in the metric's units (0.03 = 3 points)
    margin = 0.02               # the equivalence margin ±m, in the same units

The effect is ``mean(arm) − mean(against)``: the mean over seeds of each run's metric. Its
intervals come from a bootstrap (:func:`bootstrap_difference`) that resamples seeds (paired by seed
where both arms ran the same seeds: seeds share prompts) and, where the runs recorded per-problem
results (``eval_problems.jsonl``), the held-out problems too (the same draw for both arms: they are
evaluated on the same problems) — the two-level interval. The verdict, one of :data:`VERDICTS`:

- ``reproduced`` — a higher/lower claim whose 95% CI excludes 0 in the paper's direction, with the
  effect (the point estimate) at least ``min_effect``;
- ``opposite`` — the 95% CI excludes 0 against the paper's direction with an effect at least
  ``min_effect`` (for an ``equal`` claim: the arms differ by at least ``min_effect``, CI excluding 0);
- ``equivalent within ±m`` — two one-sided tests at α = 0.05 (TOST): the 90% CI lies inside
  (−m, +m);
- ``not separable at this budget`` — none of these.

**Several starting models** (a suite's ``starts``: independently warm-started models, every arm run
from each): each claim is decided per start, as above on that start's runs, and over all of them.
The overall effect is the mean of the starts' effects, and its interval resamples three levels
(:func:`bootstrap_over_starts`): the starts, then the seeds within each start drawn, then the
held-out problems — so a verdict over starts holds only if the effect is steady across starting
models, not only across seeds. With 3 starts the start level has few distinct resamples (10); the
per-start verdicts are reported beside it, and a claim whose verdict is not the same from every
start says so (``differs``).

**Assay sensitivity.** An equivalence verdict is only informative where the same runs could have
shown a difference: two arms that both fail to learn are "equivalent". So an ``equivalent within
±m`` verdict also needs the claim's reference arm (``against``) to beat the suite's no-learning
control (the ``no_rl`` arm, the warm start evaluated alike) on the claim's metric, separably (its
95% CI, :func:`bootstrap_difference` of against − control, above 0) in the same runs
(:func:`assay`): from that start, for a per-start verdict; from *every* start that enters it, for
the verdict over starts (a start whose reference does not learn cannot vouch for equivalence, and
its near-zero effects narrow the pooled interval). Without it the verdict reads ``not separable at
this budget``, the reason naming the start and the reference's gain over the control with its CI.
A suite without a ``no_rl`` arm checks each run against its own evaluation before the first step
(:data:`STEP0`, recorded per problem as ``initial_accuracy`` / ``initial_reward``: the same starting
model, evaluated alike), paired by seed. Where the claim's metric has no control value — a training
metric the control never logs, or pass@K the control lacks (and which has no step-0 counterpart) —
the reference must learn at all instead: the same check on final held-out accuracy, in the same
strata; failing anywhere, not separable as above (the reason says the check was made on final
accuracy and why), passing, the verdict stands and says it was checked on final accuracy. Where
nothing can check it — no control is recorded, such a metric's runs recorded no final accuracy
either, or the claim compares against the control itself — the verdict stands,
marked :data:`ASSAY_UNCHECKED`, and the reason says why. Reproduced and opposite verdicts do not
depend on it: a difference that separates is evidence from any start. Per start, whether the
suite learns at all (:func:`learning_by_start`: some arm's final accuracy above ``no_rl``'s, else
above its own step-0 evaluation, 95% CI above 0) is reported beside the per-start verdicts
(:func:`learning_lines`).

Only an ``equal`` claim (and only its ``equivalent`` verdict) may be stated as "recovers",
"equal", "matches", "parity" or "no cost" (:func:`claims_equivalence`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

N_BOOT = 2000
METRICS = ("final_accuracy", "auc_accuracy", "final_reward", "auc_reward")
"""The metrics a claim may name, besides ``pass@K`` (the sampled evaluation's pass@k at the last
evaluation, K an integer) and ``track:NAME`` (a tracked training metric's mean over each run's last
steps, in its own units; no per-problem values)."""
DIRECTIONS = ("higher", "lower", "equal")
REPRODUCED, OPPOSITE, EQUIVALENT, NOT_SEPARABLE = "reproduced", "opposite", "equivalent within ±{m}", "not separable at this budget"
VERDICTS = (REPRODUCED, OPPOSITE, EQUIVALENT, NOT_SEPARABLE)
NO_LEARNING_CONTROL = "no_rl"
"""The control arm an equivalence verdict's reference must beat (assay sensitivity): the warm start, not trained, evaluated alike."""
STEP0 = "its step-0 evaluation"
"""The control of a suite without ``no_rl``: each run's own evaluation before its first step (the same starting model, evaluated alike)."""
ASSAY_UNCHECKED = "(no control to check assay sensitivity)"
"""The mark beside an equivalence verdict whose assay sensitivity could not be checked."""
CLAIM_KEYS = {"statement", "arm", "against", "metric", "direction", "min_effect", "margin", "paper"}
EQUIVALENCE_WORDS = re.compile(r"\b(recover(s|ed|ing)?|equal(s|ly)?|no cost|match(es|ed)?|parity)\b", re.IGNORECASE)
"""Wording that claims equivalence: allowed only beside an ``equivalent`` verdict."""


class ClaimError(ValueError):
    """A suite's ``[claims]`` entry that cannot be decided."""


@attrs.frozen(kw_only=True)
class Claim:
    name: str
    statement: str
    arm: str
    against: str
    metric: str
    direction: str
    min_effect: float
    margin: float
    paper: str = ""

    def to_dict(self) -> dict:
        return attrs.asdict(self)


def parse_claims(raw: Any, arms: list[str], where: str) -> tuple[Claim, ...]:
    """The ``[claims.NAME]`` tables of a suite file; every key is required but ``paper``, every
    problem names the claim and the key."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ClaimError(f"{where}: [claims] must be a table of claim tables ([claims.NAME]), got {raw!r}")
    out = []
    for name, body in raw.items():
        at = f"{where}: claim {name!r}"
        if not isinstance(body, dict):
            raise ClaimError(f"{at}: must be a table (statement, arm, against, metric, direction, min_effect, margin)")
        unknown = sorted(set(body) - CLAIM_KEYS)
        if unknown:
            raise ClaimError(f"{at}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(CLAIM_KEYS))}")
        missing = sorted(CLAIM_KEYS - {"paper"} - set(body))
        if missing:
            raise ClaimError(f"{at}: missing {', '.join(missing)} (a verdict needs the claim's direction, its minimum effect and its equivalence margin)")
        for key in ("arm", "against"):
            if body[key] not in arms:
                raise ClaimError(f"{at}: {key} = {body[key]!r} is not an arm of the suite; arms: {', '.join(arms)}")
        if body["arm"] == body["against"]:
            raise ClaimError(f"{at}: arm and against are both {body['arm']!r}; a claim compares two arms")
        metric = body["metric"]
        if metric not in METRICS and not re.fullmatch(r"pass@[1-9][0-9]*", str(metric)) and not re.fullmatch(r"track:\S+", str(metric)):
            raise ClaimError(f"{at}: metric = {metric!r}; one of {', '.join(METRICS)}, pass@K (K a positive integer) or track:NAME (a tracked training metric)")
        if body["direction"] not in DIRECTIONS:
            raise ClaimError(f"{at}: direction = {body['direction']!r}; one of {', '.join(DIRECTIONS)} (arm − against)")
        for key in ("min_effect", "margin"):
            v = body[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < (math.inf if is_track(metric) else 1)):
                raise ClaimError(f"{at}: {key} = {v!r}; " + (f"a positive number in {metric[6:]}'s units" if is_track(metric) else
                                                            "a number in (0, 1) in the metric's units (0.02 = 2 points)"))
        if body["direction"] != "equal" and EQUIVALENCE_WORDS.search(str(body["statement"])):
            raise ClaimError(f"{at}: the statement {body['statement']!r} claims equivalence ({EQUIVALENCE_WORDS.search(body['statement']).group(0)!r}); "
                             f"give direction = \"equal\" (decided by an equivalence test within ±margin), or word it as a direction")
        out.append(Claim(name=str(name), statement=str(body["statement"]), arm=body["arm"], against=body["against"], metric=str(metric),
                         direction=body["direction"], min_effect=float(body["min_effect"]), margin=float(body["margin"]), paper=str(body.get("paper", ""))))
    return tuple(out)


# --------------------------------------------------------------------------- the interval


def bootstrap_difference(x, y, *, x_seeds=None, y_seeds=None, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """``mean(x) − mean(y)`` with 95% and 90% percentile-bootstrap intervals.

    ``x``, ``y``: one row per run (seed) of per-problem values, shape (seeds, problems) — or one
    value per run (problems = 1), when only the runs' means are known. Each resample draws seeds
    with replacement (the same draw for both arms when ``x_seeds == y_seeds``, else independently)
    and, when there are several problems, problems with replacement (the same draw for both arms:
    their columns must be the same problems). A side with one seed and one problem has no interval.
    """
    import numpy as np

    x, y = _rows(x), _rows(y)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"the two arms were evaluated on different numbers of problems ({x.shape[1]} and {y.shape[1]}); per-problem rows must be the same problems")
    effect = float(x.mean() - y.mean())
    P = x.shape[1]
    out = {"effect": effect, "ci95": (math.nan, math.nan), "ci90": (math.nan, math.nan), "problems": P, "seeds": (x.shape[0], y.shape[0]),
           "levels": "problems and seeds" if P > 1 else "seeds"}
    if (x.shape[0] < 2 or y.shape[0] < 2) and P < 2:
        return out
    rng = np.random.default_rng(seed)
    paired = x_seeds is not None and y_seeds is not None and list(x_seeds) == list(y_seeds)
    W = rng.multinomial(P, np.full(P, 1.0 / P), size=n_boot) / P if P > 1 else np.ones((n_boot, 1))
    cols = np.arange(n_boot)[:, None]
    ix = rng.integers(0, x.shape[0], size=(n_boot, x.shape[0]))
    iy = ix if paired else rng.integers(0, y.shape[0], size=(n_boot, y.shape[0]))
    diffs = (x @ W.T)[ix, cols].mean(axis=1) - (y @ W.T)[iy, cols].mean(axis=1)
    out["ci95"] = tuple(float(v) for v in np.percentile(diffs, [2.5, 97.5]))
    out["ci90"] = tuple(float(v) for v in np.percentile(diffs, [5.0, 95.0]))
    return out


def bootstrap_over_starts(groups, *, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """:func:`bootstrap_difference` over several starting models: ``groups`` holds one ``(x, y,
    x_seeds, y_seeds)`` per start, each as :func:`bootstrap_difference` takes them (every start's
    rows on the same problems). The effect is the mean over starts of ``mean(x) − mean(y)``; each
    resample draws as many starts with replacement, then, for each start drawn, its seeds (paired
    across arms as in :func:`bootstrap_difference`) and one problem draw shared by all. One start:
    :func:`bootstrap_difference` itself."""
    import numpy as np

    gs = [(_rows(x), _rows(y), xs, ys) for x, y, xs, ys in groups]
    if not gs:
        raise ValueError("no starts to compare")
    if len(gs) == 1:
        x, y, xs, ys = gs[0]
        return {**bootstrap_difference(x, y, x_seeds=xs, y_seeds=ys, n_boot=n_boot, seed=seed), "starts": 1}
    P = gs[0][0].shape[1]
    if any(x.shape[1] != P or y.shape[1] != P for x, y, _, _ in gs):
        raise ValueError("the starts' runs were evaluated on different numbers of problems; per-problem rows must be the same problems")
    S = len(gs)
    effect = float(np.mean([x.mean() - y.mean() for x, y, _, _ in gs]))
    out = {"effect": effect, "problems": P, "seeds": (sum(x.shape[0] for x, *_ in gs), sum(y.shape[0] for _, y, *_ in gs)), "starts": S,
           "levels": "starts, problems and seeds" if P > 1 else "starts and seeds"}
    rng = np.random.default_rng(seed)
    W = rng.multinomial(P, np.full(P, 1.0 / P), size=n_boot) / P if P > 1 else np.ones((n_boot, 1))
    cols = np.arange(n_boot)[:, None]
    weighted = [(x @ W.T, y @ W.T, xs is not None and ys is not None and list(xs) == list(ys)) for x, y, xs, ys in gs]
    drawn = rng.integers(0, S, size=(n_boot, S))
    total = np.zeros(n_boot)
    for slot in range(S):  # each slot's start drawn, then its seeds drawn afresh
        per = np.empty((S, n_boot))
        for k, (xw, yw, paired) in enumerate(weighted):
            ix = rng.integers(0, xw.shape[0], size=(n_boot, xw.shape[0]))
            iy = ix if paired else rng.integers(0, yw.shape[0], size=(n_boot, yw.shape[0]))
            per[k] = xw[ix, cols].mean(axis=1) - yw[iy, cols].mean(axis=1)
        total += per[drawn[:, slot], np.arange(n_boot)]
    diffs = total / S
    out["ci95"] = tuple(float(v) for v in np.percentile(diffs, [2.5, 97.5]))
    out["ci90"] = tuple(float(v) for v in np.percentile(diffs, [5.0, 95.0]))
    return out


def three_level_ci(groups, *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) over several starts: ``groups`` holds each start's per-problem rows (seeds ×
    problems); the mean is the mean of the starts' means, the 95% CI resamples starts, seeds and
    problems (:func:`bootstrap_over_starts` against nothing)."""
    d = bootstrap_over_starts([(g, [[0.0] * len(g[0])], None, None) for g in groups], n_boot=n_boot, seed=seed)
    return (d["effect"], *d["ci95"])


def two_level_ci(rows, *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of per-problem rows (seeds × problems): the 95% CI resamples seeds and
    problems (:func:`bootstrap_difference` against nothing)."""
    d = bootstrap_difference(rows, [[0.0] * len(rows[0])], n_boot=n_boot, seed=seed)
    return (d["effect"], *d["ci95"])


def _rows(a):
    import numpy as np

    arr = np.asarray(a, dtype=float)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or not np.isfinite(arr).all():
        raise ValueError(f"per-run values must be a non-empty (seeds,) or (seeds, problems) array of finite numbers, got shape {arr.shape}")
    return arr


# --------------------------------------------------------------------------- the verdict


def decide(claim: Claim, diff: dict) -> tuple[str, str]:
    """(verdict, why) for ``claim`` from :func:`bootstrap_difference`'s result; see the module docstring."""
    lo95, hi95 = diff["ci95"]
    lo90, hi90 = diff["ci90"]
    e = diff["effect"]
    m = claim.margin
    equivalent = EQUIVALENT.format(m=_units(m, claim.metric))
    if not math.isfinite(lo95):
        return NOT_SEPARABLE, "no interval (one seed and no per-problem results)"
    inside = math.isfinite(lo90) and -m < lo90 and hi90 < m  # no 90% interval: equivalence not tested
    if claim.direction == "equal":
        if inside:
            return equivalent, f"90% CI inside ±{_units(m, claim.metric)} (TOST, α = 0.05)"
        if (lo95 > 0 or hi95 < 0) and abs(e) >= claim.min_effect:
            return OPPOSITE, f"the arms differ: {claim.arm} {'above' if e > 0 else 'below'} {claim.against} by at least the minimum effect, 95% CI excluding 0"
        return NOT_SEPARABLE, f"90% CI reaches beyond ±{_units(m, claim.metric)} and the 95% CI " + ("holds 0" if lo95 <= 0 <= hi95 else "excludes 0 with an effect below the minimum")
    s = 1.0 if claim.direction == "higher" else -1.0
    lo, hi = sorted((s * lo95, s * hi95))
    if lo > 0 and s * e >= claim.min_effect:
        return REPRODUCED, "95% CI excludes 0 in the paper's direction, effect at least the minimum"
    if hi < 0 and -s * e >= claim.min_effect:
        return OPPOSITE, "95% CI excludes 0 against the paper's direction, effect at least the minimum"
    if inside:
        return equivalent, f"90% CI inside ±{_units(m, claim.metric)} (TOST, α = 0.05)"
    if lo > 0 or hi < 0:
        return NOT_SEPARABLE, f"95% CI excludes 0 ({'in' if lo > 0 else 'against'} the paper's direction) but the effect is below the minimum {_units(claim.min_effect, claim.metric)}"
    return NOT_SEPARABLE, "95% CI holds 0 and reaches beyond the equivalence margin"


def claims_equivalence(text: str) -> str | None:
    """The first word of ``text`` that claims equivalence ("recovers", "equal", "no cost", …), or None."""
    hit = EQUIVALENCE_WORDS.search(text)
    return hit.group(0) if hit else None


def is_track(metric: str) -> bool:
    """Whether a claim's metric is a tracked training metric (its own units) rather than a held-out fraction."""
    return metric.startswith("track:")


def scale(metric: str) -> float:
    """What a metric's values are multiplied by for display: 100 (points) for fractions, 1 for a tracked metric."""
    return 1.0 if is_track(metric) else 100.0


def _units(v: float, metric: str) -> str:
    """A value in the metric's units as text: points for accuracy, reward and pass@k (fractions)."""
    return f"{v:.3g} ({metric[6:]})" if is_track(metric) else f"{100 * v:.3g} points"


# --------------------------------------------------------------------------- per suite


def metric_rows(records, arm: str, task: str, metric: str) -> tuple[list[int], list, bool]:
    """(seeds, rows, per_problem) of one arm's done runs on ``task``: per-problem rows when every
    run recorded them for ``metric`` (:meth:`RunRecord.problem_values`), else one value per run."""
    runs = sorted((r for r in records if r.variant == arm and r.task == task and r.status == "done"), key=lambda r: r.seed)
    per = [r.problem_values(metric) for r in runs]
    if runs and all(p is not None for p in per) and len({len(p) for p in per}) == 1:
        return [r.seed for r in runs], per, True
    return [r.seed for r in runs], [[r.metric_value(metric)] for r in runs], False


def starts_of(records) -> list:
    """The warm-start seeds of the runs (``record.start``), in order of first appearance; [None] for runs of one start."""
    return list(dict.fromkeys(getattr(r, "start", None) for r in records)) or [None]


def _claim_rows(records, c: Claim, task: str) -> tuple | str:
    """``(xs, x, ys, y)`` for ``c`` on ``task`` (per-problem rows where both arms have them, else
    run means; a run without the metric dropped with its seed), or why there are none."""
    return _pair_rows(records, c.arm, c.against, task, c.metric)


def _pair_rows(records, arm: str, against: str, task: str, metric: str, against_metric: str | None = None) -> tuple | str:
    xs, x, px = metric_rows(records, arm, task, metric)
    ys, y, py = metric_rows(records, against, task, against_metric or metric)
    if not x or not y:
        return "no finished runs on one side"
    if not (px and py and len(x[0]) == len(y[0])):
        x, y = [[sum(r) / len(r)] for r in x], [[sum(r) / len(r)] for r in y]
    xs, x = _finite_rows(xs, x)
    ys, y = _finite_rows(ys, y)
    if not x or not y:
        return f"{metric} not recorded"
    return xs, x, ys, y


# --------------------------------------------------------------------------- assay sensitivity


def gain_over_control(records, arm: str, control: str | None, task: str, metric: str, *, n_boot: int = N_BOOT) -> dict:
    """Whether ``arm`` learns in ``records``: ``arm − control`` on ``metric`` (:func:`bootstrap_difference`,
    paired by seed) and ``learns`` — True when its 95% CI lies above 0, False when it does not, None
    when it cannot be told (no control, the metric a training metric the control never logs, no runs),
    with ``why`` saying which."""
    out = {"arm": arm, "control": control, "metric": metric, "task": task, "diff": None, "learns": None}
    if control is None:  # no no_rl arm: each run against its own step-0 evaluation, where the runs kept it per problem
        init = initial_metric(metric)
        rows = _pair_rows(records, arm, arm, task, metric, against_metric=init) if init else "no step-0 counterpart"
        if isinstance(rows, str) or len(rows[1][0]) != len(rows[3][0]) or len(rows[1][0]) < 2:
            return {**out, "why": f"the suite has no no-learning control ({NO_LEARNING_CONTROL})"
                    + (f" and its runs kept no step-0 evaluation per problem ({init})" if init else "")}
        control = out["control"] = STEP0
    elif arm == control:
        return {**out, "why": f"the reference is the control {control} itself"}
    elif is_track(metric):
        return {**out, "why": f"{control} does not train, so it logs no {metric}"}
    else:
        rows = _pair_rows(records, arm, control, task, metric)
        if isinstance(rows, str):
            return {**out, "why": f"{arm} against {control}: {rows}"}
    diff = bootstrap_difference(rows[1], rows[3], x_seeds=rows[0], y_seeds=rows[2], n_boot=n_boot)
    if not math.isfinite(diff["ci95"][0]):
        return {**out, "diff": diff, "why": f"{arm} against {control}: no interval (one seed and no per-problem results)"}
    learns = diff["ci95"][0] > 0
    return {**out, "diff": diff, "learns": learns,
            "why": f"{arm} − {control} on {metric}: {gain_text(diff, metric)}, 95% CI {'above' if learns else 'not above'} 0"}


def initial_metric(metric: str) -> str | None:
    """The step-0 counterpart of a held-out metric (``final_accuracy``, ``auc_accuracy`` → ``initial_accuracy``;
    reward alike): the starting model's value, what a run that does not learn keeps; None for pass@K and track: metrics."""
    kind, _, name = metric.partition("_")
    return f"initial_{name}" if kind in ("final", "auc") and name in ("accuracy", "reward") else None


def assay(records, c: Claim, task: str, control: str | None, *, n_boot: int = N_BOOT) -> dict:
    """The assay-sensitivity check of ``c`` in ``records`` (one start's runs, or one start's only):
    its reference arm (``against``) against the no-learning ``control`` on the claim's metric
    (:func:`gain_over_control`; the module docstring). Where that metric has no control value (a
    ``track:`` metric the control never logs, pass@K it lacks), the same check on final held-out
    accuracy: whether the reference learns at all (``no_control`` holds why the metric could not be
    checked). A claim against the control itself cannot be checked this way (its reference is what
    does not learn)."""
    if control is not None and c.arm == control:
        return {"arm": c.against, "control": control, "metric": c.metric, "task": task, "diff": None, "learns": None,
                "why": f"the claim compares with the control {control} itself"}
    check = gain_over_control(records, c.against, control, task, c.metric, n_boot=n_boot)
    if check["learns"] is not None or c.metric in METRICS or c.against == control:
        return check
    # a training metric the control never logs, or pass@K it lacks: whether the reference learns at all, on final held-out accuracy
    final = gain_over_control(records, c.against, control, task, "final_accuracy", n_boot=n_boot)
    if final["learns"] is None:
        return {**check, "why": f"{check['why']}; nor on final held-out accuracy: {final['why']}"}
    return {**final, "no_control": check["why"]}


def gain_text(diff: dict, metric: str) -> str:
    """``+17.6 [+7.6, +27.4] points``: a difference with its 95% CI, in the metric's units."""
    k = scale(metric)
    unit = f" ({metric[6:]})" if is_track(metric) else " points"
    return f"{_pts(diff['effect'], k)} [{_pts(diff['ci95'][0], k)}, {_pts(diff['ci95'][1], k)}]{unit}"


def require_assay(verdict: str, why: str, checks: list[tuple[str, dict]]) -> tuple[str, str, str]:
    """``(verdict, why, mark)`` of an equivalence verdict once its assay sensitivity is asked for:
    ``checks`` holds ``(where, check)`` (:func:`assay`) for every stratum that enters the verdict
    (``where``: ``"from start 2"``, or ``""`` for runs of one start). An equivalence with a check that
    fails is not separable, the reason naming where and the reference's gain (and, for a check made on
    final accuracy because the metric has no control value, saying so); one that some check
    cannot tell stays, marked :data:`ASSAY_UNCHECKED`; any other verdict is returned as it is."""
    if not verdict.startswith(EQUIVALENT.split("{")[0]) or not checks:
        return verdict, why, ""
    failed = [(w, ch) for w, ch in checks if ch["learns"] is False]
    if failed:
        said = "; ".join(f"{ch['why']}{' ' + w if w else ''}" + (f" (checked on final held-out accuracy, as the claim's metric has no control "
                                                                 f"value: {ch['no_control']})" if ch.get("no_control") else "")
                         for w, ch in failed)
        return NOT_SEPARABLE, (f"{why}, but without assay sensitivity: {said} — where the reference does not learn, arms that "
                               f"both fail to move read as equivalent, so the equivalence is not evidence"), ""
    unknown = [(w, ch) for w, ch in checks if ch["learns"] is None]
    if unknown:
        said = "; ".join(dict.fromkeys(ch["why"] for _, ch in unknown))
        return verdict, f"{why}; assay sensitivity not checked: {said}", ASSAY_UNCHECKED
    fallback = [ch for _, ch in checks if ch.get("no_control")]
    head = "assay sensitivity" + ("" if not fallback else " checked on final accuracy (the metric itself has no control value)"
                                  if len(fallback) == len(checks) else " (checked on final accuracy where the metric itself has no control value)")
    if len(checks) == 1:
        return verdict, f"{why}; {head}: {checks[0][1]['why']}", ""
    a = checks[0][1]
    if len({(ch["control"], ch["metric"]) for _, ch in checks}) > 1:  # checked on different metrics (or controls) in different strata
        said = ", ".join(f"{ch['arm']} − {ch['control']} on {ch['metric']} {gain_text(ch['diff'], ch['metric'])} {w}" for w, ch in checks)
        return verdict, f"{why}; {head} from every start that enters it: {said}", ""
    said = ", ".join(f"{gain_text(ch['diff'], ch['metric'])} {w}" for w, ch in checks)
    return verdict, f"{why}; {head} from every start that enters it: {a['arm']} − {a['control']} on {a['metric']} {said}", ""


def evaluate_claims(records, claims: tuple[Claim, ...], *, tasks: list, n_boot: int = N_BOOT, control: str | None = None) -> list[dict]:
    """Every claim's verdict per task, with the statistics it came from. Runs from several starts
    (``record.start``): the verdict over starts (:func:`bootstrap_over_starts`), with each start's
    own under ``per_start`` and ``differs`` when they are not all the same. An equivalence verdict
    needs assay sensitivity against ``control`` (the suite's ``no_rl`` arm, None when it has none;
    :func:`require_assay`); ``assay_mark`` holds :data:`ASSAY_UNCHECKED` where it could not be checked."""
    starts = starts_of(records)
    out = []
    for c in claims:
        for task in tasks:
            entry = {**c.to_dict(), "claim": c.name, "task": task}
            if len(starts) < 2:
                rows = _claim_rows(records, c, task)
                if isinstance(rows, str):
                    out.append({**entry, "verdict": NOT_SEPARABLE, "why": rows, "diff": None, "assay_mark": ""})
                    continue
                diff = bootstrap_difference(rows[1], rows[3], x_seeds=rows[0], y_seeds=rows[2], n_boot=n_boot)
                verdict, why = decide(c, diff)
                check = assay(records, c, task, control, n_boot=n_boot)
                verdict, why, mark = require_assay(verdict, why, [("", check)])
                out.append({**entry, "verdict": verdict, "why": why, "diff": diff, "assay": check, "assay_mark": mark})
                continue
            per_start, groups, checks = [], [], []
            for s in starts:
                mine = [r for r in records if getattr(r, "start", None) == s]
                sha = next((r.start_sha256 for r in mine if getattr(r, "start_sha256", None)), None)
                rows = _claim_rows(mine, c, task)
                if isinstance(rows, str):
                    per_start.append({"start": s, "sha256": sha, "verdict": NOT_SEPARABLE, "why": rows, "diff": None, "assay_mark": ""})
                    continue
                diff = bootstrap_difference(rows[1], rows[3], x_seeds=rows[0], y_seeds=rows[2], n_boot=n_boot)
                verdict, why = decide(c, diff)
                check = assay(mine, c, task, control, n_boot=n_boot)
                verdict, why, mark = require_assay(verdict, why, [("", check)])
                per_start.append({"start": s, "sha256": sha, "verdict": verdict, "why": why, "diff": diff, "assay": check, "assay_mark": mark})
                groups.append(rows)
                checks.append((f"from {start_label(s, sha)}", check))
            if len({len(g[1][0]) for g in groups} | {len(g[3][0]) for g in groups}) > 1:  # per problem in some starts only: run means
                groups = [(xs, [[sum(r) / len(r)] for r in x], ys, [[sum(r) / len(r)] for r in y]) for xs, x, ys, y in groups]
            differs = len({p["verdict"] for p in per_start}) > 1
            if not groups:
                out.append({**entry, "verdict": NOT_SEPARABLE, "why": per_start[0]["why"], "diff": None, "per_start": per_start, "differs": differs,
                            "assay_mark": ""})
                continue
            diff = bootstrap_over_starts([(x, y, xs, ys) for xs, x, ys, y in groups], n_boot=n_boot)
            verdict, why = decide(c, diff)
            if len(groups) < len(starts):
                why += f"; over the {len(groups)} of {len(starts)} starts with finished runs on both sides"
            verdict, why, mark = require_assay(verdict, why, checks)
            out.append({**entry, "verdict": verdict, "why": why, "diff": diff, "per_start": per_start, "differs": differs, "assay_mark": mark})
    return out


def learning_by_start(records, arms: list, control: str | None, *, tasks: list, n_boot: int = N_BOOT) -> list[dict]:
    """Per start (and task), whether anything learns from it: each of ``arms`` (the suite's arms, its
    controls aside) against the no-learning ``control`` on final held-out accuracy
    (:func:`gain_over_control`). The start learns when some arm's 95% CI lies above 0; the entry is
    the arm whose CI's low end is highest (the one that separates most, or comes closest), with the
    start's seed and hash. [] for runs of one start or without arms."""
    starts = starts_of(records)
    if len(starts) < 2 or not arms:
        return []
    out = []
    for s in starts:
        mine = [r for r in records if getattr(r, "start", None) == s]
        sha = next((r.start_sha256 for r in mine if getattr(r, "start_sha256", None)), None)
        for task in tasks:
            checks = [gain_over_control(mine, a, control, task, "final_accuracy", n_boot=n_boot) for a in arms]
            told = [g for g in checks if g["learns"] is not None]
            best = max(told, key=lambda g: g["diff"]["ci95"][0]) if told else checks[0]
            out.append({"start": s, "sha256": sha, **best})
    return out


def learning_lines(learning: list[dict]) -> list[str]:
    """Bullets saying, per start, whether anything learns from it (:func:`learning_by_start`); a start
    from which no arm is shown to learn is flagged: no equivalence holds from it."""
    if not learning:
        return []
    tasks = {g["task"] for g in learning}
    if all(g["learns"] is None for g in learning):
        return [f"- Whether each start learns is not checked: {learning[0]['why']}.", ""]
    lines = []
    for g in learning:
        where = start_label(g["start"], g.get("sha256")) + (f", {g['task']}" if len(tasks) > 1 else "")
        if g["learns"] is False:
            lines.append(f"- **{where} is not shown to learn**: no arm ends above {g['control']} (closest: {g['why']}); "
                         "no equivalence holds from it (assay sensitivity).")
        elif g["learns"]:
            lines.append(f"- {where} learns: {g['why']}.")
        else:
            lines.append(f"- {where}: whether it learns is not told ({g['why']}).")
    return lines + [""]


def start_label(start, sha256: str | None = None) -> str:
    """``start 1 (3f2a9c01)``: a start's warm-start seed and its hash's first 8 hex digits."""
    return f"start {start}" + (f" ({sha256[:8]})" if sha256 else "")


def _finite_rows(seeds: list, rows: list) -> tuple[list, list]:
    kept = [(s, r) for s, r in zip(seeds, rows) if all(math.isfinite(v) for v in r)]
    return [s for s, _ in kept], [r for _, r in kept]


def resolution(problems: int | None) -> str:
    """What one held-out problem is worth, as text."""
    if not problems:
        return "resolution unknown (the evaluation size was not recorded)"
    pts = 100 / problems
    return f"one problem = {pts:.3g} point{'' if pts == 1 else 's'} ({problems} held-out problems)"


def markdown_lines(entries: list[dict], *, eval_size: int | None = None, explain: bool = True, learning: list[dict] = ()) -> list[str]:
    """The ``## verdicts`` section: each claim's verdict beside the numbers it came from (``explain``:
    with the paragraph that defines the vocabulary); per start, the reasons that involve assay
    sensitivity and, with ``learning`` (:func:`learning_by_start`), whether each start learns."""
    if not entries:
        return []
    lines = ["## verdicts", ""]
    if explain:
        lines += ["Each claim of the suite file decided by code: the effect is mean(arm) − mean(against) over seeds; *reproduced* when the 95% CI "
             "excludes 0 in the paper's direction with the effect at least the minimum, *opposite* when it excludes 0 the other way "
             "(at least the minimum), *equivalent within ±m* when the 90% CI lies inside ±m (TOST, α = 0.05) and the reference arm beats the "
             f"no-learning control ({NO_LEARNING_CONTROL}, else each run's own step-0 evaluation) on the claim's metric (on final held-out accuracy "
             "where the metric has no control value: a track: metric, pass@k), 95% CI above 0, in the "
             f"same runs (from every start that enters it: assay sensitivity; marked {ASSAY_UNCHECKED} where nothing can tell), else "
             "*not separable at this budget*. "
             "Effects, minima and margins in points for held-out fractions, in the metric's own units for track: metrics. "
             f"Intervals: percentile bootstrap over {_levels(entries)}; {resolution(eval_size)}.", ""]
    else:
        lines += [f"Intervals over {_levels(entries)}; {resolution(eval_size)}.", ""]
    several = any(e.get("per_start") for e in entries)
    if several:
        n = max(len(e["per_start"]) for e in entries if e.get("per_start"))
        lines += [f"Over all {n} starts: the effect is the mean of the starts' effects, its interval resamples the starts, then the seeds of each "
                  "start drawn, then the problems (three levels); each start's own verdict follows in the next table.", ""]
    lines += ["| claim | task | arm − against | metric | effect [95% CI] | 90% CI | min effect | margin | resampled | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        k = cell_scale(e)
        eff, c90, lev = _diff_cells(e["diff"], k)
        lines.append(f"| {e['claim']} | {e['task']} | {e['arm']} − {e['against']} ({e['direction']}) | {e['metric']} | {eff} | {c90} | "
                     f"{threshold_cells(e)} | {lev} | {verdict_cell(e)} |")
    lines.append("")
    lines += [f"- {e['claim']} ({e['task']}): {e['statement']} — {verdict_text(e)}{' over all starts' if e.get('per_start') else ''}: {e['why']}."
              for e in entries]
    if several:
        lines += ["", "Per start (each start's runs alone, intervals over its problems and seeds):", "",
                  "| claim | task | start | effect [95% CI] | 90% CI | resampled | verdict |", "|---|---|---|---|---|---|---|"]
        for e in entries:
            k = cell_scale(e)
            for p in e.get("per_start") or ():
                eff, c90, lev = _diff_cells(p["diff"], k)
                lines.append(f"| {e['claim']} | {e['task']} | {start_label(p['start'], p.get('sha256'))} | {eff} | {c90} | {lev} | {verdict_cell(p)} |")
        lines.append("")
        lines += [flip_line(e) for e in entries if e.get("per_start")]
        said = [f"- {e['claim']} ({e['task']}), {start_label(p['start'], p.get('sha256'))}: {p['verdict']}: {p['why']}."
                for e in entries for p in e.get("per_start") or () if _assay_said(p)]
        lines += [""] + said if said else []
        if learning:
            lines += [""] + learning_head(learning) + learning_lines(learning)[:-1]
    return lines + [""]


def learning_head(learning: list[dict]) -> list[str]:
    """The sentence before :func:`learning_lines` (none when no control can tell)."""
    if all(g["learns"] is None for g in learning):
        return []
    return [f"Whether each start learns at all: each arm (controls aside) against {learning[0]['control']} on final held-out accuracy, "
            "that start's runs alone; a start learns when some arm's 95% CI lies above 0, and the arm named is the one that separates "
            "most (the highest low end).", ""]


def _assay_said(p: dict) -> bool:
    """Whether a per-start verdict's reason involves assay sensitivity (an equivalence, kept, marked or not separable for want of it)."""
    return "assay sensitivity" in p.get("why", "")


def verdict_text(e: dict) -> str:
    """A verdict as written: the verdict, and :data:`ASSAY_UNCHECKED` where its assay sensitivity could not be checked."""
    return e["verdict"] + (f" {e['assay_mark']}" if e.get("assay_mark") else "")


def verdict_cell(e: dict) -> str:
    """A verdict as a table cell: bold, with its mark outside the bold."""
    return f"**{e['verdict']}**" + (f" {e['assay_mark']}" if e.get("assay_mark") else "")


def flip_line(e: dict) -> str:
    """Whether a claim's verdict is the same from every start, as a bullet."""
    per = e["per_start"]
    if not e.get("differs"):
        return f"- {e['claim']} ({e['task']}): {verdict_cell(per[0])} from every start ({len(per)})."
    said = "; ".join(f"{start_label(p['start'], p.get('sha256'))} {verdict_text(p)}" for p in per)
    return f"- **VERDICT DIFFERS BETWEEN STARTS** — {e['claim']} ({e['task']}): {said}; over all starts {verdict_text(e)}."


def cell_scale(e: dict):
    """How a claim's effects are written: percentage points for accuracy, the margin's decimals for a tracked metric."""
    return scale(e["metric"]) if not is_track(e["metric"]) else _decimals(e["margin"])


def threshold_cells(e: dict) -> str:
    """A claim's table cells ``min effect | ±margin``, on the metric's scale."""
    return f"{scale(e['metric']) * e['min_effect']:.3g} | ±{scale(e['metric']) * e['margin']:.3g}"


def _diff_cells(d: dict | None, k) -> tuple[str, str, str]:
    """(effect [95% CI], 90% CI, what was resampled) of a difference, as table cells."""
    if d is None:
        return "—", "—", "—"
    eff = f"{_pts(d['effect'], k)} [{_pts(d['ci95'][0], k)}, {_pts(d['ci95'][1], k)}]"
    c90 = "—" if not math.isfinite(d["ci90"][0]) else f"[{_pts(d['ci90'][0], k)}, {_pts(d['ci90'][1], k)}]"
    lev = (f"{d['starts']} starts, {d['seeds'][0]}/{d['seeds'][1]} runs" if d.get("starts", 1) > 1 else f"{d['seeds'][0]}/{d['seeds'][1]} seeds")
    return eff, c90, lev + (f" × {d['problems']} problems" if d["problems"] > 1 else "")


def _levels(entries: list[dict]) -> str:
    if entries and all(is_track(e["metric"]) for e in entries):
        return "seeds (a training metric has no per-problem values)"
    levels = {e["diff"]["levels"] for e in entries if e["diff"]}
    if levels == {"starts, problems and seeds"}:
        return "starts, held-out problems and seeds (three levels over all starts, problems paired across arms; each start alone: problems and seeds)"
    if levels == {"problems and seeds"}:
        return "held-out problems and seeds (two-level, problems paired across arms)"
    if levels == {"seeds"}:
        return "seeds only (the runs recorded no per-problem results)"
    return "problems and seeds where the runs recorded per-problem results, else seeds only"


def _decimals(margin: float) -> int:
    """Decimals that resolve a tenth of the margin (a tracked metric's values as text)."""
    return max(0, 1 - math.floor(math.log10(margin)))


def _pts(v: float, k: float | int = 100.0) -> str:
    """Points (``k`` = 100.0) of a fraction, else the value itself with ``k`` (an int) decimals."""
    if not math.isfinite(v):
        return "—"
    return f"{k * v:+.1f}" if isinstance(k, float) else f"{v:+.{k}f}"
