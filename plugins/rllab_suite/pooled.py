"""Claims decided over several suites' committed runs: every committed run of a job folded in once.

Several suites can run the same cells: a control suite reruns the reference arm of another, two
suites at different settings share a reference that does not depend on the setting (the
synchronous run of two staleness levels). A *pool* names the suites and the claims to decide over
all of them (``benchmarks/suites/pooled/NAME.toml``)::

    suites = ["staleness_k4", "staleness_k4_bounds", "staleness"]

    [claims.tis_recovers_sync_auc]          # the keys of a suite's [claims] (rllab_suite.verdicts)
    statement = "TIS recovers the synchronous run's learning curve (AUC)"
    arm = "tis"
    against = "sync"
    metric = "auc_accuracy"
    direction = "equal"
    min_effect = 0.03
    margin = 0.02

Each claim is decided from the committed ``runs.csv`` / ``problems.csv`` of the suites named (and
their ``provenance.json``), never from new runs:

- **A job** is what a cell computes apart from its seed: its suite's base (preset or config), the
  overrides in effect (the suite's, its task's and its variant's, later ones winning; the start's own
  seeds and hash and the seed and the suite's name left out), its steps and its control, and the
  starting model it ran from (its sha256, from ``runs.csv`` or ``provenance.json``). Two suites'
  cells of the same job are the same experiment.
- **A run is folded in once.** Runs of one job with the same seed are one seed: a run listed by
  several suites (the same recorded config hash, or the same values) counts once, and runs of one
  job and seed that differ (a rerun that did not reproduce value for value) are averaged into that
  seed, never counted as further seeds.
- **A comparison** (a stratum) is a pair of jobs, the arm's and the reference's, that some suite
  ran side by side from the same start. A suite that ran only one of the two arms lends its runs to
  the comparisons of that job; runs of a job no comparison holds are not folded in (the block says so).
- **The pooled effect** is the mean over comparisons of ``mean(arm) − mean(against)``. Its interval
  resamples the starts (when the comparisons come from several), then within each start the seeds
  (one draw shared by every comparison of the start: its runs share a seed's prompts, and a
  reference job compared twice is resampled alike in both), then the held-out problems (one draw
  shared by all, paired across arms). The comparisons themselves are fixed settings, not resampled:
  the pooled verdict speaks for these settings, and each comparison's own verdict stands beside it
  (a verdict that differs between comparisons says so).

The verdict is decided as a suite's (:func:`rllab_suite.verdicts.decide`), from the same vocabulary.
An equivalence needs assay sensitivity as a suite's does: each comparison's reference job beats the
no-learning control (``no_rl``) from the same start, in the suites whose runs of that job the pool
holds, else its own runs' step-0 evaluations (:func:`comparison_assay`; on final held-out accuracy
where the claim's metric has no control value), and the pooled equivalence needs it in every
comparison.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import attrs

from rllab_suite import verdicts as verdicts_

POOL_KEYS = {"suites", "claims", "description"}
JOB_EXCLUDE = ("train.seed", "name", "output_dir", "provenance", "model.sha256", "model.tiny.seed", "model.warm_start.seed")
"""Overrides that do not set what a job computes apart from its seed and start (the start is its own part of the job)."""


class PoolError(ValueError):
    """A pool file that cannot be decided (an unknown suite, a claim whose arms no suite compares)."""


@attrs.frozen(kw_only=True)
class Pool:
    name: str
    suites: tuple[str, ...]
    claims: tuple


@attrs.frozen(kw_only=True)
class Folded:
    """One run as a pool reads it: where it was listed, its job, and its values."""

    suite: str
    variant: str
    task: str
    seed: int
    job: tuple
    start_sha256: str | None
    identity: str
    """The recorded config hash of the cell (``provenance.json``), else the suite, variant and seed."""
    run: Any
    """The :class:`rllab_suite.findings.CsvRun` read from ``runs.csv``."""


def read_pool(path: Path, known_suites) -> Pool:
    """A pool file; every key checked, every suite named must be a committed suite."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise PoolError(f"pool {path}: cannot be read ({e})") from None
    unknown = sorted(set(data) - POOL_KEYS)
    if unknown:
        raise PoolError(f"pool {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(POOL_KEYS))}")
    suites = data.get("suites")
    if not isinstance(suites, list) or len(suites) < 1 or not all(isinstance(s, str) for s in suites):
        raise PoolError(f"pool {path}: suites must be a list of suite names (benchmarks/suites/NAME.toml), got {suites!r}")
    if len(set(suites)) != len(suites):
        raise PoolError(f"pool {path}: suites names {', '.join(s for s in suites if suites.count(s) > 1)} more than once")
    missing = [s for s in suites if s not in known_suites]
    if missing:
        raise PoolError(f"pool {path}: suite(s) {', '.join(missing)} have no committed suite file and results")
    arms = sorted({v for s in suites for v in known_suites[s]})
    claims = verdicts_.parse_claims(data.get("claims"), arms, f"pool {path}")
    if not claims:
        raise PoolError(f"pool {path}: states no [claims.NAME]: nothing to decide")
    return Pool(name=path.stem, suites=tuple(suites), claims=claims)


def job_of(suite, variant: str, task: str) -> tuple:
    """What a cell of ``suite`` computes apart from its seed and start (see the module docstring)."""
    v = next(x for x in suite.variants if x.name == variant)
    if len(suite.tasks) == 1:
        name, knobs = suite.tasks[0]
    else:
        i = next((i for i, lab in enumerate(suite.task_labels) if (lab or suite.tasks[i][0]) == task), None)
        if i is None:
            raise PoolError(f"suite {suite.name!r}: runs.csv names task {task!r}, which the suite file does not")
        name, knobs = suite.tasks[i]
    pairs = list(suite.overrides) + ([("task", name)] if name else []) + list(knobs) + list(v.overrides)
    eff = {k: repr(val) for k, val in pairs if k not in JOB_EXCLUDE}
    steps = 0 if v.control == "no_rl" else suite.steps
    base = ("preset", v.preset) if v.preset else ("config", v.config) if v.config else \
        ("preset", suite.base_preset) if suite.base_preset else ("config", suite.base_config)
    return (base, steps, v.control, tuple(sorted(eff.items())))


def gather(root: Path, pool: Pool, arms: set[str]) -> tuple[list[Folded], list[str]]:
    """Every committed run of ``arms`` in the pool's suites, with its job; and the suites that ran none."""
    from rllab_suite.committed import read_runs_csv
    from rllab_suite.spec import parse_suite

    suites_dir = Path(root) / "benchmarks" / "suites"
    out, idle = [], []
    for name in pool.suites:
        suite = parse_suite(suites_dir / f"{name}.toml")
        res = suites_dir / "results" / name
        cells = json.loads((res / "provenance.json").read_text()).get("cells") or [] if (res / "provenance.json").is_file() else []
        prov = {(c.get("variant"), c.get("task"), int(c.get("seed", -1)), c.get("start_seed")): c for c in cells}
        pinned = dict(suite.overrides).get("model.sha256")
        mine = [r for r in read_runs_csv(res / "runs.csv") if r.variant in arms and r.status == "done"]
        if not mine:
            idle.append(name)
        for r in mine:
            cell = prov.get((r.variant, r.task, r.seed, r.start)) or {}
            recorded = cell.get("start") if isinstance(cell.get("start"), str) else None
            sha = r.start_sha256 or recorded or pinned
            identity = cell.get("config") or f"{name}/{r.variant}/{r.task}/{r.seed}/{r.start}"
            out.append(Folded(suite=name, variant=r.variant, task=r.task, seed=r.seed, job=job_of(suite, r.variant, r.task),
                              start_sha256=sha, identity=identity, run=r))
    return out, idle


def _values(f: Folded, metric: str) -> list[float]:
    p = f.run.problem_values(metric)
    return list(p) if p is not None else [f.run.metric_value(metric)]


def seed_rows(folded: list[Folded], metric: str) -> tuple[dict, dict]:
    """``({seed: row}, counts)`` of one job: each seed's per-problem row (or its run's value), the
    runs of one seed averaged after dropping those listed twice (the same config hash or the same
    values); counts: runs listed, distinct runs, seeds with more than one distinct run."""
    by_seed: dict[int, list] = {}
    for f in folded:
        vals = _values(f, metric)
        if not all(math.isfinite(v) for v in vals):
            continue
        kept = by_seed.setdefault(f.seed, [])
        if any(f.identity == g.identity or vals == gv for g, gv in kept):
            continue
        kept.append((f, vals))
    rows = {}
    for s, kept in by_seed.items():
        lens = {len(v) for _, v in kept}
        if len(lens) > 1:  # some runs without per-problem values: their means
            kept = [(f, [sum(v) / len(v)]) for f, v in kept]
        n = len(kept[0][1])
        rows[s] = [sum(v[i] for _, v in kept) / len(kept) for i in range(n)]
    counts = {"listed": len(folded), "distinct": sum(len(k) for k in by_seed.values()), "replicated": sum(len(k) > 1 for k in by_seed.values())}
    return rows, counts


def strata(folded: list[Folded], claim) -> list[dict]:
    """The comparisons of ``claim``: per (task, start), each pair of jobs (arm, against) some suite ran side by side."""
    pairs: dict[tuple, dict] = {}
    for f in folded:
        if f.variant != claim.arm:
            continue
        mates = [g for g in folded if g.suite == f.suite and g.variant == claim.against and g.task == f.task and g.start_sha256 == f.start_sha256]
        for g in mates:
            key = (f.task, f.start_sha256, f.job, g.job)
            pairs.setdefault(key, {"task": f.task, "start": f.start_sha256, "arm_job": f.job, "against_job": g.job, "suites": []})
            if f.suite not in pairs[key]["suites"]:
                pairs[key]["suites"].append(f.suite)
    out = []
    for (task, start, aj, gj), st in pairs.items():
        arm = [f for f in folded if f.variant == claim.arm and f.task == task and f.start_sha256 == start and f.job == aj]
        ref = [f for f in folded if f.variant == claim.against and f.task == task and f.start_sha256 == start and f.job == gj]
        out.append({**st, "arm_runs": arm, "against_runs": ref})
    return out


def comparison_assay(group: dict, controls: list[Folded] | None, claim, *, n_boot: int = verdicts_.N_BOOT, seed: int = 0) -> dict:
    """The assay-sensitivity check of one comparison (:func:`rllab_suite.verdicts.assay`): its reference
    job's runs against the no-learning control (``no_rl``: the start evaluated alike, not trained) run
    from the same start by the suites whose runs of the reference job it holds (a job is the same
    config, so their evaluations are alike), else against those runs' own step-0 evaluations
    (``initial_*`` in problems.csv); ``controls``: every folded ``no_rl`` run of the pool. Where the
    claim's metric has no control value (a ``track:`` metric, pass@K the control lacks), the same
    check on final held-out accuracy (:func:`rllab_suite.verdicts.assay`)."""
    c = verdicts_.NO_LEARNING_CONTROL
    if claim.arm == c or claim.against == c:
        return {"arm": claim.against, "control": c, "metric": claim.metric, "task": group["task"], "diff": None, "learns": None,
                "why": f"the claim compares with the control {c} itself"}
    check = _comparison_gain(group, controls, claim, claim.metric, dict(group["y"]), n_boot=n_boot, seed=seed)
    if check["learns"] is not None or claim.metric in verdicts_.METRICS:
        return check
    ref, _ = seed_rows(group["against_runs"], "final_accuracy")
    final = (_comparison_gain(group, controls, claim, "final_accuracy", ref, n_boot=n_boot, seed=seed) if ref else
             {"learns": None, "why": f"{claim.against}: final_accuracy not recorded"})
    if final["learns"] is None:
        return {**check, "why": f"{check['why']}; nor on final held-out accuracy: {final['why']}"}
    return {**final, "no_control": check["why"]}


def _comparison_gain(group: dict, controls: list[Folded] | None, claim, metric: str, ref: dict, *, n_boot: int, seed: int) -> dict:
    """:func:`comparison_assay` on ``metric``, the reference job's rows ``ref`` ({seed: row})."""
    c = verdicts_.NO_LEARNING_CONTROL
    out = {"arm": claim.against, "control": c, "metric": metric, "task": group["task"], "diff": None, "learns": None}
    if verdicts_.is_track(metric):
        return {**out, "why": f"{c} does not train, so it logs no {metric}"}
    suites = list(dict.fromkeys(f.suite for f in group["against_runs"]))
    mine = [f for f in controls or () if f.suite in suites and f.task == group["task"] and f.start_sha256 == group["start"]]
    if mine:
        ctrl, _ = seed_rows(mine, metric)
        if not ctrl:
            return {**out, "why": f"{claim.against} against {c}: {metric} not recorded"}
    else:  # no no_rl run: the reference runs' own step-0 evaluations, where they kept them per problem
        init = verdicts_.initial_metric(metric)
        ctrl = seed_rows(group["against_runs"], init)[0] if init else {}
        if not ctrl or {len(r) for r in (*ctrl.values(), *ref.values())} != {len(next(iter(ref.values())))} or len(next(iter(ref.values()))) < 2:
            return {**out, "why": f"no suite that ran its {claim.against} runs ({', '.join(suites)}) has a no-learning control ({c})"
                    + (f", and they kept no step-0 evaluation per problem ({init})" if init else "")}
        c = out["control"] = verdicts_.STEP0
    if {len(r) for r in (*ctrl.values(), *ref.values())} != {len(next(iter(ref.values())))}:
        ctrl = {s: [sum(r) / len(r)] for s, r in ctrl.items()}
        ref = {s: [sum(r) / len(r)] for s, r in ref.items()}
    xs, ys = sorted(ref), sorted(ctrl)
    diff = verdicts_.bootstrap_difference([ref[s] for s in xs], [ctrl[s] for s in ys], x_seeds=xs, y_seeds=ys, n_boot=n_boot, seed=seed)
    if not math.isfinite(diff["ci95"][0]):
        return {**out, "diff": diff, "why": f"{claim.against} against {c}: no interval"}
    learns = diff["ci95"][0] > 0
    return {**out, "diff": diff, "learns": learns, "why": f"{claim.against} − {c} on {metric}: "
            f"{verdicts_.gain_text(diff, metric)}, 95% CI {'above' if learns else 'not above'} 0"}


def decide_pool(folded: list[Folded], claim, *, n_boot: int = verdicts_.N_BOOT, seed: int = 0, controls: list[Folded] | None = None) -> dict:
    """The claim's verdict over every comparison the runs hold, with each comparison's own (see the
    module docstring). An equivalence needs assay sensitivity (:func:`rllab_suite.verdicts.require_assay`):
    per comparison, its reference against the ``no_rl`` runs of ``controls`` from the same start and
    suites (:func:`comparison_assay`); over every comparison, in each comparison that enters it."""
    entry = {**claim.to_dict(), "claim": claim.name}
    groups = []
    for st in strata(folded, claim):
        x, xc = seed_rows(st["arm_runs"], claim.metric)
        y, yc = seed_rows(st["against_runs"], claim.metric)
        if not x or not y:
            continue
        groups.append({**st, "x": x, "y": y, "x_counts": xc, "y_counts": yc})
    if not groups:
        return {**entry, "verdict": verdicts_.NOT_SEPARABLE, "why": f"no suite ran {claim.arm} and {claim.against} side by side", "diff": None, "strata": []}
    tasks = sorted({g["task"] for g in groups})
    if len(tasks) > 1:
        raise PoolError(f"claim {claim.name!r}: the comparisons are on different tasks ({', '.join(tasks)}); "
                        "a pooled interval draws one set of held-out problems for all of them: pool one task")
    P = {len(r) for g in groups for r in (*g["x"].values(), *g["y"].values())}
    means_only = len(P) > 1
    if means_only:  # some runs lack per-problem values, or evaluated other numbers of problems: compare run means
        for g in groups:
            g["x"] = {s: [sum(r) / len(r)] for s, r in g["x"].items()}
            g["y"] = {s: [sum(r) / len(r)] for s, r in g["y"].items()}
    P = len(next(iter(groups[0]["x"].values())))
    for g, label in zip(groups, comparison_labels(groups)):  # each comparison alone
        xs, ys = sorted(g["x"]), sorted(g["y"])
        g["diff"] = verdicts_.bootstrap_difference([g["x"][s] for s in xs], [g["y"][s] for s in ys], x_seeds=xs, y_seeds=ys, n_boot=n_boot, seed=seed)
        g["verdict"], g["why"] = verdicts_.decide(claim, g["diff"])
        g["assay"] = comparison_assay(g, controls, claim, n_boot=n_boot, seed=seed)
        g["verdict"], g["why"], g["assay_mark"] = verdicts_.require_assay(g["verdict"], g["why"], [("", g["assay"])])
        g["label"] = label
    diff = pooled_difference(groups, n_boot=n_boot, seed=seed)
    diff["seeds"] = (len({(g["start"], g["arm_job"], s) for g in groups for s in g["x"]}),  # a job compared twice counts once
                     len({(g["start"], g["against_job"], s) for g in groups for s in g["y"]}))
    verdict, why = verdicts_.decide(claim, diff)
    if means_only:
        why += "; compared on run means (not every run recorded the same held-out problems)"
    verdict, why, mark = verdicts_.require_assay(verdict, why, [(f"in *{g['label']}*", g["assay"]) for g in groups])
    return {**entry, "task": groups[0]["task"], "verdict": verdict, "why": why, "diff": diff, "strata": groups,
            "differs": len({g["verdict"] for g in groups}) > 1, "assay_mark": mark}


def pooled_difference(groups: list[dict], *, n_boot: int = verdicts_.N_BOOT, seed: int = 0) -> dict:
    """The mean over comparisons of ``mean(arm) − mean(against)``, with 95% and 90% percentile
    intervals from resampling starts, then seeds within a start (one draw for all its comparisons),
    then problems (one draw for all). ``groups``: dicts with ``start`` and ``x``, ``y`` ({seed: row})."""
    import numpy as np

    P = len(next(iter(groups[0]["x"].values())))
    effect = float(np.mean([np.mean(list(g["x"].values())) - np.mean(list(g["y"].values())) for g in groups]))
    starts = list(dict.fromkeys(g["start"] for g in groups))
    runs = (sum(len(g["x"]) for g in groups), sum(len(g["y"]) for g in groups))
    out = {"effect": effect, "problems": P, "seeds": runs, "strata": len(groups), "starts": len(starts),
           "levels": ("starts, " if len(starts) > 1 else "") + ("problems and seeds" if P > 1 else "seeds"),
           "ci95": (math.nan, math.nan), "ci90": (math.nan, math.nan)}
    if P < 2 and all(len(g["x"]) < 2 or len(g["y"]) < 2 for g in groups):
        return out
    rng = np.random.default_rng(seed)
    W = rng.multinomial(P, np.full(P, 1.0 / P), size=n_boot) / P if P > 1 else np.ones((n_boot, 1))
    cols = np.arange(n_boot)[:, None]
    per_start = []  # for each start: (n_boot,) sum of its comparisons' differences, and how many it has
    for s in starts:
        mine = [g for g in groups if g["start"] == s]
        seeds = sorted({k for g in mine for k in (*g["x"], *g["y"])})
        draw = rng.integers(0, len(seeds), size=(n_boot, len(seeds)))
        total = np.zeros(n_boot)
        for g in mine:
            total += _side(g["x"], seeds, draw, W, cols, rng) - _side(g["y"], seeds, draw, W, cols, rng)
        per_start.append((total, len(mine)))
    if len(starts) > 1:
        pick = rng.integers(0, len(starts), size=(n_boot, len(starts)))
        sums = np.stack([t for t, _ in per_start])[pick, np.arange(n_boot)[:, None]].sum(axis=1)
        counts = np.array([n for _, n in per_start])[pick].sum(axis=1)
        diffs = sums / counts
    else:
        diffs = per_start[0][0] / per_start[0][1]
    out["ci95"] = tuple(float(v) for v in np.percentile(diffs, [2.5, 97.5]))
    out["ci90"] = tuple(float(v) for v in np.percentile(diffs, [5.0, 95.0]))
    return out


def _side(rows: dict, seeds: list, draw, W, cols, rng):
    """One arm's resampled means: the start's shared seed draw where the arm ran every one of the
    start's seeds, else a draw of its own seeds."""
    import numpy as np

    mine = sorted(rows)
    X = np.asarray([rows[s] for s in mine], dtype=float) @ W.T  # (its seeds, n_boot)
    if mine == seeds:
        idx = draw
    else:
        idx = rng.integers(0, len(mine), size=(draw.shape[0], len(mine)))
    return X[idx, cols].mean(axis=1)


def comparison_labels(groups: list[dict]) -> list[str]:
    """Each comparison named by the overrides of its arm's job that not every comparison shares (and its start, when several)."""
    common = set.intersection(*(set(g["arm_job"][3]) for g in groups)) if groups else set()
    starts = {g["start"] for g in groups}
    out = []
    for g in groups:
        own = [f"{k} = {v}" for k, v in g["arm_job"][3] if (k, v) not in common]
        label = ", ".join(own) or "the arms' shared overrides"
        if len(starts) > 1:
            label += f", start {(g['start'] or '?')[:8]}"
        out.append(label)
    return out


def _resampled(d: dict | None, fixed: bool) -> str:
    if d is None:
        return "—"
    lev = f"{d['seeds'][0]}/{d['seeds'][1]} {'runs' if fixed else 'seeds'}" + (f" × {d['problems']} problems" if d["problems"] > 1 else "")
    if fixed:
        lev = f"{d['strata']} comparisons (fixed), " + (f"{d['starts']} starts, " if d.get("starts", 1) > 1 else "") + lev
    return lev


def markdown_lines(name: str, pool: Pool, entries: list[dict], *, idle: list[str] = (), eval_size: int | None = None) -> list[str]:
    """A pool's block: the headline verdict (its first claim), what was folded in, each claim over
    every comparison and each comparison's own verdict."""
    from rllab_suite.verdicts import _diff_cells, cell_scale, resolution, threshold_cells, verdict_cell, verdict_text

    lines = []
    head = entries[0]
    k0 = cell_scale(head)
    if head["diff"] is not None:
        eff, c90, _ = _diff_cells(head["diff"], k0)
        lines += [f"**Over every committed run of the job** ({head['diff']['strata']} comparisons from "
                  f"{len({s for g in head['strata'] for s in (*(f.suite for f in g['arm_runs']), *(f.suite for f in g['against_runs']))})} suites): "
                  f"{head['statement']} — {verdict_cell(head)}: {head['arm']} − {head['against']}, {head['metric']}, {eff} (90% CI {c90}).", ""]
    lines += [f"Pooled by `benchmarks/suites/pooled/{name}.toml` over the committed `runs.csv` and `problems.csv` of "
              + ", ".join(f"`{s}`" for s in pool.suites) + ". A comparison is a pair of jobs (a job: a cell's config apart from its seed, "
              "from one starting model) that some suite ran side by side; a suite that ran one of the two lends its runs to that job; "
              "a run listed by several suites counts once, and runs of one job and seed that differ are averaged into that seed. "
              f"Effect: the mean over comparisons of mean(arm) − mean(against); intervals resample the seeds (one draw per start, shared by "
              f"its comparisons), the held-out problems (one draw, paired across arms) and, with several, the starts; the comparisons are "
              f"fixed settings, not resampled; {resolution(eval_size)}.", ""]
    if idle:
        lines += [f"Not folded in: {', '.join(f'`{s}`' for s in idle)} ran none of these arms.", ""]
    shown = set()
    for e in entries:
        pair = (e["arm"], e["against"])
        if pair in shown or not e["strata"]:
            continue
        shown.add(pair)
        labels = comparison_labels(e["strata"])
        lines += [f"| {e['arm']} − {e['against']}: comparison | run side by side in | {e['arm']} runs listed → distinct (from) | "
                  f"{e['against']} runs listed → distinct (from) | seeds |", "|---|---|---|---|---|"]
        for label, g in zip(labels, e["strata"]):
            def side(runs, counts):
                where = ", ".join(dict.fromkeys(f.suite for f in runs))
                rep = f"; {counts['replicated']} seeds rerun with other values, averaged" if counts["replicated"] else ""
                return f"{counts['listed']} → {counts['distinct']} ({where}{rep})"
            lines.append(f"| {label} | {', '.join(g['suites'])} | {side(g['arm_runs'], g['x_counts'])} | {side(g['against_runs'], g['y_counts'])} | "
                         f"{len(set(g['x']) & set(g['y']))} |")
        shared = [labels[i] for i, g in enumerate(e["strata"]) if sum(h["against_job"] == g["against_job"] and h["start"] == g["start"]
                                                                         for h in e["strata"]) > 1]
        if shared:
            lines += ["", f"The {e['against']} runs of " + "; ".join(f"*{s}*" for s in shared) + " are the same job: they enter each of these "
                      "comparisons, resampled alike."]
        lines.append("")
    lines += ["| claim | arm − against | metric | effect [95% CI] | 90% CI | min effect | margin | resampled | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        k = cell_scale(e)
        eff, c90, _ = _diff_cells(e["diff"], k)
        lines.append(f"| {e['claim']} | {e['arm']} − {e['against']} ({e['direction']}) | {e['metric']} | {eff} | {c90} | "
                     f"{threshold_cells(e)} | {_resampled(e['diff'], True)} | {verdict_cell(e)} |")
    lines.append("")
    lines += [f"- {e['claim']}: {e['statement']} — {verdict_text(e)} over every comparison: {e['why']}." for e in entries]
    lines += ["", "Each comparison alone (intervals over its problems and seeds):", "",
              "| claim | comparison | effect [95% CI] | 90% CI | resampled | verdict |", "|---|---|---|---|---|---|"]
    for e in entries:
        k = cell_scale(e)
        for label, g in zip(comparison_labels(e["strata"]), e["strata"]):
            eff, c90, _ = _diff_cells(g["diff"], k)
            lines.append(f"| {e['claim']} | {label} | {eff} | {c90} | {_resampled(g['diff'], False)} | {verdict_cell(g)} |")
    lines.append("")
    said = [f"- {e['claim']}, *{label}*: {g['verdict']}: {g['why']}." for e in entries
            for label, g in zip(comparison_labels(e["strata"]), e["strata"]) if "assay sensitivity" in g.get("why", "")]
    lines += said + [""] if said else []
    for e in entries:
        labels = comparison_labels(e["strata"])
        if e.get("differs"):
            said = "; ".join(f"*{lab}* {verdict_text(g)}" for lab, g in zip(labels, e["strata"]))
            lines.append(f"- **VERDICT DIFFERS BETWEEN COMPARISONS** — {e['claim']}: {said}; over every comparison {verdict_text(e)}.")
        elif e["strata"]:
            lines.append(f"- {e['claim']}: {verdict_cell(e['strata'][0])} in every comparison ({len(e['strata'])}).")
    return lines + [""]
