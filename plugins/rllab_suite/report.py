"""Suite and run reports: statistics per variant, as a terminal table, Markdown, CSV, JSON, PNG.

A report is computed from run directories alone (``config.toml``, ``metrics.jsonl``,
``final.json``), so ``rllab suite report DIR`` and ``rllab compare RUN_DIR…`` regenerate it at any
time from what is on disk. A run's record is :mod:`rllab_suite.records`'s, the plots are
:mod:`rllab_suite.plots`'s.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from rllab_suite import controls as controls_, entropy_law, fits as fits_, stats, verdicts as verdicts_
from rllab_suite.labels import label_runs, shortest_distinguishing, task_labels  # noqa: F401  (re-exported)
from rllab_suite.plots import plot, plot_entropy_law, plot_fits, plot_pass_at, plot_track  # noqa: F401  (plot_track: re-exported)
from rllab_suite.records import LAST_FRACTION, RunRecord, read_run  # noqa: F401  (RunRecord, read_run: re-exported)

METRICS = (("accuracy", "eval/accuracy"), ("reward", "eval/reward"))
WINDOWS = 5
"""A tracked training metric's trajectory: a run's mean over each of this many equal spans of steps."""


# --------------------------------------------------------------------------- the numbers


def spans(records: list[RunRecord], track: tuple = ()) -> list[tuple[int, int]]:
    """:data:`WINDOWS` equal spans of training steps (first, last), over the longest run's logged steps."""
    top = max((s for r in records for m in track for s in r.train.get(m, ((), ()))[0]), default=0)
    if top < 1:
        return []
    n = min(WINDOWS, top)
    return [(round(i * top / n) + 1, round((i + 1) * top / n)) for i in range(n)]


def summarize(records: list[RunRecord], *, baseline: str | None = None, variants: list[str] | None = None, track: tuple = (),
              controls: tuple = (), compute: str | None = None, claims: tuple = ()) -> dict:
    """Per (task, variant): final and AUC accuracy and reward, mean with a 95% bootstrap CI over
    seeds; per variant over tasks: IQM of final accuracy and P(improvement) over ``baseline``;
    per tracked training metric, its mean over the last steps and over each span of the run; each
    arm against the ``controls`` (:mod:`rllab_suite.controls`); with ``compute`` (``tokens`` or
    ``seconds``), the curves fitted to it (:mod:`rllab_suite.fits`, a few seconds of refits); when
    ``track`` holds both ``actor/entropy`` and ``rollout/accuracy``, each arm's entropy against the
    baseline's and the entropy–performance law fitted to them (:mod:`rllab_suite.entropy_law`); each of
    ``claims`` (:class:`rllab_suite.verdicts.Claim`) decided per task (:mod:`rllab_suite.verdicts`)."""
    variants = variants or list(dict.fromkeys(r.variant for r in records))
    tasks = list(dict.fromkeys(r.task for r in records))
    windows = spans(records, track)
    rows = []
    for task in tasks:
        for v in variants:
            rs = [r for r in records if r.task == task and r.variant == v]
            done = [r for r in rs if r.status == "done"]
            row = {"task": task, "variant": v, "runs": len(done), "failed": sum(r.status == "failed" for r in rs), "pending": sum(r.status in ("running", "missing") for r in rs)}
            for metric, _ in METRICS:
                for kind in ("final", "auc"):
                    row[f"{kind}_{metric}"] = arm_stat(done, kind, metric)
            row["initial_accuracy"] = stats.mean_ci([r.accuracy[0] for r in done if r.accuracy])[0]
            row["pass_at"] = _pass_at(done)
            row["no_signal"] = sum(1 for r in rs if r.train_reward_max == 0.0)
            row["track"] = {}
            for m in track:
                m_, lo, hi = last_ci(done, m)
                row["track"][m] = {
                    "last": {"mean": m_, "low": lo, "high": hi},
                    "spans": [dict(zip(("mean", "low", "high"), stats.mean_ci([r.span(m, a, b) for r in done])), first=a, last=b) for a, b in windows],
                }
            rows.append(row)
    overall = []
    for v in variants:
        groups = [[r.final("accuracy") for r in records if r.variant == v and r.task == t and r.status == "done"] for t in tasks]
        entry = {"variant": v, "runs": sum(len(g) for g in groups), "iqm_final_accuracy": None, "p_improvement": None}
        iq = stats.iqm_ci(groups)
        if iq is not None:
            entry["iqm_final_accuracy"] = {"mean": iq[0], "low": iq[1], "high": iq[2]}
        if baseline and v != baseline:
            pairs = [
                ([r.final("accuracy") for r in records if r.variant == v and r.task == t and r.status == "done"],
                 [r.final("accuracy") for r in records if r.variant == baseline and r.task == t and r.status == "done"])
                for t in tasks
            ]
            poi = stats.prob_improvement(pairs)
            if poi is not None:
                entry["p_improvement"] = {"mean": poi[0], "low": poi[1], "high": poi[2]}
        overall.append(entry)
    failed = [{"variant": r.variant, "task": r.task, "seed": r.seed, "run_dir": r.run_dir, "error": r.error, **({} if r.start is None else {"start": r.start})}
              for r in records if r.status == "failed"]
    seeds = [row["runs"] for row in rows if row["runs"]]
    sizes = sorted({r.eval_n for r in records if r.eval_n})
    control = verdicts_.NO_LEARNING_CONTROL if verdicts_.NO_LEARNING_CONTROL in controls else None
    return {
        "verdicts": verdicts_.evaluate_claims(records, tuple(claims), tasks=tasks, control=control), "eval_size": sizes[0] if len(sizes) == 1 else None,
        "learning": verdicts_.learning_by_start(records, [v for v in variants if v not in controls], control, tasks=tasks),
        "controls": list(controls), "vs_controls": controls_.against_controls(records, variants=variants, tasks=tasks, controls=tuple(controls)),
        "fits": fits_.fit_all(records, tasks=tasks, arms=variants, kind=compute, baseline=baseline) if compute else None,
        "entropy_law": entropy_law.fit_all(records, tasks=tasks, arms=variants, baseline=baseline)
        if {entropy_law.ENTROPY, entropy_law.REWARD} <= set(track) else None,
        "min_seeds": min(seeds) if seeds else 0, "min_reliable_seeds": stats.MIN_RELIABLE_SEEDS,
        "baseline": baseline, "variants": variants, "tasks": tasks, "rows": rows, "overall": overall, "failed": failed,
        "confidence": stats.CONFIDENCE, "min_iqm_runs": stats.MIN_IQM_RUNS, "min_poi_seeds": stats.MIN_POI_SEEDS,
        "track": list(track), "track_missing": [m for m in track if not any(m in r.train for r in records)], "last_fraction": LAST_FRACTION,
        "starts": per_start(records, tasks=tasks, variants=variants),
    }


def arm_stat(done: list[RunRecord], kind: str, metric: str) -> dict:
    """An arm's ``final``/``auc`` accuracy or reward: mean with its 95% CI over seeds, over held-out
    problems and seeds where every run recorded them (two-level), and over starts too when the runs
    come from several starts (three levels: :func:`rllab_suite.verdicts.three_level_ci`)."""
    per = [r.problem_values(f"{kind}_{metric}") for r in done]
    has_per = bool(per) and all(p is not None for p in per) and len({len(p) for p in per}) == 1
    starts = verdicts_.starts_of(done)
    if len(starts) > 1:
        rows = [(r.start, p if has_per else [getattr(r, kind)(metric)]) for r, p in zip(done, per)]
        groups = [[row for s_, row in rows if s_ == s and all(math.isfinite(v) for v in row)] for s in starts]
        groups = [g for g in groups if g]
        if groups:
            m, lo, hi = verdicts_.three_level_ci(groups)
            return {"mean": m, "low": lo, "high": hi, "levels": "starts, problems and seeds" if has_per else "starts and seeds"}
    if has_per and (len(per) > 1 or len(per[0]) > 1):
        m, lo, hi = verdicts_.two_level_ci(per)  # over held-out problems and seeds
        return {"mean": m, "low": lo, "high": hi, "levels": "problems and seeds"}
    m, lo, hi = stats.mean_ci([getattr(r, kind)(metric) for r in done])
    return {"mean": m, "low": lo, "high": hi, "levels": "seeds"}


def last_ci(done: list[RunRecord], metric: str) -> tuple[float, float, float]:
    """A tracked metric's mean over each run's last steps: mean with its 95% CI over seeds, and over
    starts too (the starts resampled, then their seeds) when the runs come from several starts."""
    starts = verdicts_.starts_of(done)
    if len(starts) > 1:
        groups = [[[v] for r in done if r.start == s and math.isfinite(v := r.last(metric))] for s in starts]
        groups = [g for g in groups if g]
        if groups:
            return verdicts_.three_level_ci(groups)
    return stats.mean_ci([r.last(metric) for r in done])


def per_start(records: list[RunRecord], *, tasks: list, variants: list) -> list[dict]:
    """For runs from several starts: per start (its warm-start seed and hash), per task and arm, the
    runs, the initial accuracy and the final and AUC accuracy (mean, 95% CI over that start's problems
    and seeds); [] for runs of one start."""
    starts = verdicts_.starts_of(records)
    if len(starts) < 2:
        return []
    out = []
    for s in starts:
        mine = [r for r in records if r.start == s]
        rows = []
        for task in tasks:
            for v in variants:
                done = [r for r in mine if r.task == task and r.variant == v and r.status == "done"]
                rows.append({"task": task, "variant": v, "runs": len(done),
                             "initial_accuracy": stats.mean_ci([r.accuracy[0] for r in done if r.accuracy])[0],
                             "final_accuracy": arm_stat(done, "final", "accuracy") if done else None,
                             "auc_accuracy": arm_stat(done, "auc", "accuracy") if done else None})
        out.append({"start": s, "sha256": next((r.start_sha256 for r in mine if r.start_sha256), None), "rows": rows})
    return out


def starts_lines(summary: dict) -> list[str]:
    """The per-start table of a report (runs from several starts)."""
    starts = summary.get("starts") or []
    if not starts:
        return []
    lines = ["## per start", "",
             f"The same arms from each of the {len(starts)} starting models alone (warm-start seed, its sha256's first 16 hex digits): "
             "mean over that start's seeds, 95% CI over its problems and seeds. The tables above pool the starts (their intervals "
             "resample starts as well).", "",
             "| start | sha256 | task | variant | runs | initial acc % | final acc % [95% CI] | AUC acc % [95% CI] |", "|---|---|---|---|---|---|---|---|"]
    for st_ in starts:
        for r in st_["rows"]:
            init = "—" if not math.isfinite(r["initial_accuracy"]) else f"{100 * r['initial_accuracy']:.1f}"
            lines.append(f"| {st_['start']} | {(st_['sha256'] or '—')[:16]} | {r['task']} | {r['variant']} | {r['runs']} | {init} | "
                         f"{format_percent(r['final_accuracy'])} | {format_percent(r['auc_accuracy'])} |")
    learning = summary.get("learning") or []
    if learning:
        lines += [""] + verdicts_.learning_head(learning) + verdicts_.learning_lines(learning)[:-1]
    return lines + [""]


def _pass_at(done: list[RunRecord]) -> dict:
    """Sampled evaluation before RL (the first eval) and after (the last): {"before"/"after": {k: mean
    over seeds}}, "after_ci": {k: (low, high)} of the latter, and "gain": {k: (mean, low, high)} of each seed's after − before with its 95%
    bootstrap CI over seeds, where both were sampled."""
    out = {}
    for when, pick in (("before", 0), ("after", -1)):
        curves = [r.pass_at[r.steps[pick]] for r in done if r.steps and r.steps[pick] in r.pass_at]
        ks = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if ks:
            out[when] = {k: sum(c[k] for c in curves) / len(curves) for k in ks}
            if when == "after":
                out["after_ci"] = {k: stats.mean_ci([c[k] for c in curves])[1:] for k in ks}
    pairs = [(r.pass_at[r.steps[0]], r.pass_at[r.steps[-1]]) for r in done
             if len(r.steps) > 1 and r.steps[0] in r.pass_at and r.steps[-1] in r.pass_at]
    ks = sorted(set.intersection(*(set(b) & set(a) for b, a in pairs))) if pairs else []
    if ks:
        out["gain"] = {k: stats.mean_ci([a[k] - b[k] for b, a in pairs]) for k in ks}
        counts = [(r.problems.get(r.steps[0], {}), r.problems.get(r.steps[-1], {})) for r in done if len(r.steps) > 1]
        if counts and len(counts) == len(pairs) and all("sampled_correct" in b and "sampled_correct" in a for b, a in counts):
            out["gain"] = {k: _problem_gain(counts, k) or out["gain"][k] for k in ks}  # paired per problem, over problems and seeds
            out["gain_levels"] = "problems and seeds"
    return out


def _problem_gain(counts: list, k: int) -> tuple | None:
    """pass@k after − before, each problem against itself in the same run, with the two-level
    bootstrap CI over held-out problems and seeds (:func:`rllab_suite.verdicts.bootstrap_difference`)."""
    from rllab.rollout.evalmetrics import pass_at_k

    rows = []
    for b, a in counts:
        if not (1 <= k <= min(b["samples"], a["samples"])) or len(b["sampled_correct"]) != len(a["sampled_correct"]):
            return None
        rows.append([pass_at_k(a["samples"], ca, k) - pass_at_k(b["samples"], cb, k) for cb, ca in zip(b["sampled_correct"], a["sampled_correct"])])
    if len({len(r) for r in rows}) != 1:
        return None
    d = verdicts_.bootstrap_difference(rows, [[0.0] * len(rows[0])] * len(rows), x_seeds=range(len(rows)), y_seeds=range(len(rows)))
    return (d["effect"], *d["ci95"])


def crossover(gain: dict) -> tuple[int | None, int | None]:
    """``(k_mean, k_sure)`` from a pass@k gain (k -> (mean, low, high) of after − before): the smallest
    k from which the mean gain stays below 0 for every larger k (the base has caught up and passed),
    and the smallest from which its CI's upper end does; None where there is none."""
    ks = sorted(gain)

    def first_from(below) -> int | None:
        tail = None
        for k in reversed(ks):
            if not below(gain[k]):
                break
            tail = k
        return tail

    return first_from(lambda g: g[0] < 0), first_from(lambda g: math.isfinite(g[2]) and g[2] < 0)


# --------------------------------------------------------------------------- rendering


def _format_stat(d: dict | None, render) -> str:
    if not d or d["mean"] is None or not math.isfinite(d["mean"]):
        return "—"
    s = render(d["mean"])
    if math.isfinite(d.get("low", math.nan)):
        s += f" [{render(d['low'])}, {render(d['high'])}]"
    return s


def format_percent(d: dict | None) -> str:
    """A statistic ``{"mean", "low", "high"}`` of a fraction as ``"62.5 [55.0, 70.0]"`` (percent, 95% CI); "—" when absent."""
    return _format_stat(d, lambda x: f"{100 * x:.1f}")


def format_value(d: dict | None) -> str:
    """A statistic ``{"mean", "low", "high"}`` in the metric's own units, 3 significant digits: ``"3.55 [3.41, 3.70]"``; "—" when absent."""
    return _format_stat(d, lambda x: f"{x:.3g}")


def track_header(summary: dict) -> list[str]:
    """The tracked-metrics table's columns: variant, metric, the last steps, then one per span."""
    spans_ = next((r["track"][m]["spans"] for r in summary["rows"] for m in r.get("track", {})), [])
    return ["variant", "metric", f"last {round(100 * summary['last_fraction'])}% of steps"] + [f"steps {s['first']}–{s['last']}" for s in spans_]


def track_rows(summary: dict, task: str) -> list[list[str]]:
    return [
        [r["variant"], m, format_value(t["last"])] + [format_value(s) for s in t["spans"]]
        for m in summary.get("track", [])
        for r in summary["rows"] if r["task"] == task and (t := r["track"].get(m))
    ]


def format_probability(d: dict | None) -> str:
    """A probability with its 95% CI as ``"0.71 [0.55, 0.86]"``; "—" when absent."""
    if not d:
        return "—"
    return f"{d['mean']:.2f} [{d['low']:.2f}, {d['high']:.2f}]"


COLUMNS = (
    ("variant", lambda r: r["variant"]),
    ("runs", lambda r: str(r["runs"]) + (f" ({r['failed']} failed)" if r["failed"] else "") + (f" ({r['pending']} pending)" if r["pending"] else "")),
    ("initial acc %", lambda r: "—" if not math.isfinite(r["initial_accuracy"]) else f"{100 * r['initial_accuracy']:.1f}"),
    ("final acc % [95% CI]", lambda r: format_percent(r["final_accuracy"])),
    ("AUC acc % [95% CI]", lambda r: format_percent(r["auc_accuracy"])),
    ("final reward % [95% CI]", lambda r: format_percent(r["final_reward"])),
    ("AUC reward % [95% CI]", lambda r: format_percent(r["auc_reward"])),
)


def notes(summary: dict, identical: list | None = None) -> list[str]:
    out = []
    for f in summary["failed"]:
        out.append(f"FAILED {f['variant']} on {f['task']} seed {f['seed']}: {f['error']} ({f['run_dir']})")
    for r in summary["rows"]:
        if r["no_signal"]:
            out.append(
                f"NO SIGNAL {r['variant']} on {r['task']}: {r['no_signal']} run(s) scored 0 reward on every training group — "
                "the warm start leaves nothing to learn from; the flat line is not a result"
            )
    for m in summary.get("track_missing", []):
        out.append(f"NOT LOGGED tracked metric {m!r}: no run's metrics.jsonl has it (a typo, or a metric this algorithm does not log)")
    law_needs = {entropy_law.ENTROPY, entropy_law.REWARD}
    if len(law_needs & set(summary.get("track", []))) == 1:
        missing = (law_needs - set(summary["track"])).pop()
        out.append(f"NO ENTROPY LAW: the entropy–performance law needs both {entropy_law.ENTROPY!r} and {entropy_law.REWARD!r} "
                   f"tracked; add {missing!r} to the suite's track")
    for item in identical or []:
        out.append(item["message"])
    if 0 < summary.get("min_seeds", 0) < summary.get("min_reliable_seeds", 0):
        out.append(
            f"UNRELIABLE CIs: some arm has only {summary['min_seeds']} seed(s) on a task (fewer than {summary['min_reliable_seeds']}); "
            "a percentile bootstrap over so few seeds under-covers — read every interval here as optimistic, and add seeds"
        )
    size = summary.get("eval_size")
    if size and 100 / size >= 1:
        out.append(f"COARSE EVALUATION: {verdicts_.resolution(size)}; a difference of one problem is {100 / size:.3g} points, so effects "
                   f"of that size cannot be resolved however many seeds run — evaluate more problems (train.eval_size), or say why not")
    if summary.get("starts"):
        out.append(f"STARTS: every arm ran from {len(summary['starts'])} starting models; the verdicts and the arm tables are given per start "
                   "and over all starts, while P(improvement), the controls table, the fitted curves and pass@k pool the runs of every start as seeds")
    if not any(o["iqm_final_accuracy"] for o in summary["overall"]):
        out.append(f"IQM needs at least {summary['min_iqm_runs']} runs per variant; not reported.")
    if summary["baseline"] and not any(o["p_improvement"] for o in summary["overall"]):
        out.append(f"P(improvement) needs at least {summary['min_poi_seeds']} seeds per task on both sides; not reported.")
    return out


def render_terminal(summary: dict, console, *, title: str = "", identical: list | None = None) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    for task in summary["tasks"]:
        t = Table(box=box.SIMPLE_HEAVY, title=f"{title} — task {task}" if title else f"task {task}")
        for name, _ in COLUMNS:
            t.add_column(name, overflow="fold", justify="left" if name == "variant" else "right")
        for r in summary["rows"]:
            if r["task"] == task:
                t.add_row(*[escape(fn(r)) for _, fn in COLUMNS])
        console.print(t)
        if summary.get("track"):
            t = Table(box=box.SIMPLE_HEAVY, title=f"training metrics — task {task}: mean over seeds [95% CI] of each run's mean")
            for col in track_header(summary):
                t.add_column(col, justify="left" if col in ("variant", "metric") else "right")
            for row in track_rows(summary, task):
                t.add_row(*map(escape, row))
            console.print(t)
    t = Table(box=box.SIMPLE_HEAVY, title="over tasks: final accuracy")
    for col in ("variant", "runs", "IQM % [95% CI]", f"P(> {summary['baseline']}) [95% CI]" if summary["baseline"] else "P(improvement)"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for o in summary["overall"]:
        t.add_row(escape(o["variant"]), str(o["runs"]), escape(format_percent(o["iqm_final_accuracy"])), "baseline" if o["variant"] == summary["baseline"] else escape(format_probability(o["p_improvement"])))
    console.print(t)
    for block in (controls_.markdown_lines(summary.get("vs_controls", []), tuple(summary.get("controls", ()))),
                  *(fits_.markdown_lines(summary["fits"], task) for task in summary["tasks"] if summary.get("fits"))):
        _print_markdown_block(block, console)
    for n in notes(summary, identical):
        style = "red" if n.startswith(("FAILED", "NO SIGNAL", "UNRELIABLE")) else "yellow" if n.startswith("IDENTICAL") else "dim"
        console.print(f"[{style}]{escape(n)}[/]", highlight=False)


def _print_markdown_block(lines: list[str], console) -> None:
    """A block of :func:`markdown`'s lines (a heading, a sentence, a table, bullets) as a rich table and text."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|") and not line.startswith("|---")]
    if not rows:
        return
    t = Table(box=box.SIMPLE_HEAVY, title=lines[0].lstrip("# ").replace("`", ""))
    for i, col in enumerate(rows[0]):
        t.add_column(escape(col), justify="left" if i == 0 else "right")
    for row in rows[1:]:
        t.add_row(*map(escape, row))
    console.print(t)
    for line in lines:
        if line.startswith("- "):
            console.print(escape(line), highlight=False)


def markdown(summary: dict, *, title: str = "", identical: list | None = None, images: tuple = ()) -> str:
    lines = [f"# {title}" if title else "# comparison", ""]
    levels = {r[f"{k}_{m}"].get("levels") for r in summary["rows"] for k in ("final", "auc") for m, _ in METRICS}
    two = "problems and seeds" in levels
    three = any(str(lv).startswith("starts") for lv in levels)
    lines.append(
        f"Mean over seeds with a {int(100 * summary['confidence'])}% percentile-bootstrap CI "
        + (f"over starts, held-out problems and seeds (the runs of {len(summary.get('starts') or [])} starting models pooled: each resample "
           "draws starts, then seeds within them, then problems; per start below); " if three else
           "over held-out problems and seeds (two-level: runs that recorded per-problem results resample both); " if two else "over seeds (scipy.stats.bootstrap); ")
        + "AUC is the mean height of the held-out curve over the run (trapezoid rule, normalised by steps). "
        f"Resolution: {verdicts_.resolution(summary.get('eval_size'))}."
    )
    lines.append("")
    lines += verdicts_.markdown_lines(summary.get("verdicts", []), eval_size=summary.get("eval_size"))
    if 0 < summary.get("min_seeds", 0) < summary.get("min_reliable_seeds", 0):
        lines += [f"**Unreliable intervals: as few as {summary['min_seeds']} seed(s) per arm (fewer than {summary['min_reliable_seeds']}).**", ""]
    for task in summary["tasks"]:
        lines += [f"## task `{task}`", "", "| " + " | ".join(n for n, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for r in summary["rows"]:
            if r["task"] == task:
                lines.append("| " + " | ".join(fn(r) for _, fn in COLUMNS) + " |")
        lines.append("")
        if summary.get("track"):
            head = track_header(summary)
            lines += [
                f"## training metrics, task `{task}`", "",
                f"Each run's mean of the metric over its last {round(100 * summary['last_fraction'])}% of steps and over each span "
                "of steps; mean over seeds with a 95% percentile-bootstrap CI.", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            ]
            lines += ["| " + " | ".join(row) + " |" for row in track_rows(summary, task)] + [""]
        lines += pass_at_lines(summary, task)
        if summary.get("fits"):
            lines += fits_.markdown_lines(summary["fits"], task)
        lines += entropy_law.markdown_lines(summary.get("entropy_law"), task)
    lines += starts_lines(summary)
    base = summary["baseline"]
    lines += ["## over tasks (final accuracy)", "", f"| variant | runs | IQM % [95% CI] | P(> {base or 'baseline'}) [95% CI] |", "|---|---|---|---|"]
    for o in summary["overall"]:
        lines.append(f"| {o['variant']} | {o['runs']} | {format_percent(o['iqm_final_accuracy'])} | {'baseline' if o['variant'] == base else format_probability(o['p_improvement'])} |")
    lines.append("")
    lines += controls_.markdown_lines(summary.get("vs_controls", []), tuple(summary.get("controls", ())))
    ns = notes(summary, identical)
    if ns:
        lines += ["## notes", ""] + [f"- {n}" for n in ns] + [""]
    for img in images:
        lines += [f"![{Path(img).stem}]({Path(img).name})", ""]
    return "\n".join(lines)


def pass_at_lines(summary: dict, task: str) -> list[str]:
    """pass@k before RL (the first evaluation) and after (the last), mean over seeds, for the arms that
    sampled (``train.eval_samples``); then each arm's gain after − before with its CI over seeds, and
    where the base model catches up (the crossover of arXiv 2504.13837)."""
    rows = [r for r in summary["rows"] if r["task"] == task and r.get("pass_at")]
    ks = sorted({k for r in rows for w in ("before", "after") for k in r["pass_at"].get(w, {})})
    if not rows:
        return []
    lines = [f"## pass@k, task `{task}`", "", "Unbiased pass@k (1 − C(n−c, k)/C(n, k)) on the held-out set, mean over seeds: before RL → after.", "",
             "| variant | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for r in rows:
        b, a = r["pass_at"].get("before", {}), r["pass_at"].get("after", {})
        lines.append(f"| {r['variant']} | " + " | ".join(f"{100 * b[k]:.1f} → {100 * a[k]:.1f}" if k in a and k in b else "—" for k in ks) + " |")
    gains = [r for r in rows if r["pass_at"].get("gain") and any(g[0] != 0 for g in r["pass_at"]["gain"].values())]
    if gains:
        levels = "held-out problems and seeds (each problem paired with itself)" if any(r["pass_at"].get("gain_levels") for r in gains) else "seeds"
        lines += ["", f"Gain after − before in points, each seed against its own first evaluation, mean over seeds with a 95% bootstrap CI over {levels}; "
                  f"{verdicts_.resolution(summary.get('eval_size'))}; "
                  "the crossover is the k from which the base model stays above the arm (the mean gain below 0 for every larger k; *sure* where the CI's upper end is).", "",
                  "| variant | " + " | ".join(f"pass@{k}" for k in ks) + " | crossover |", "|---|" + "---|" * (len(ks) + 1)]
        for r in gains:
            g = r["pass_at"]["gain"]
            k_mean, k_sure = crossover(g)
            cross = "none up to k = %d" % max(g) if k_mean is None else f"k ≥ {k_mean}" + (f" (sure from k = {k_sure})" if k_sure is not None else " (CI spans 0)")
            lines.append(f"| {r['variant']} | " + " | ".join(
                (f"{100 * g[k][0]:+.1f} [{100 * g[k][1]:+.1f}, {100 * g[k][2]:+.1f}]" if math.isfinite(g[k][1]) else f"{100 * g[k][0]:+.1f}") if k in g else "—"
                for k in ks) + f" | {cross} |")
    return lines + [""]


def write_csv(summary: dict, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        head = ["task", "variant", "runs", "failed", "initial_accuracy"]
        for metric, _ in METRICS:
            for kind in ("final", "auc"):
                head += [f"{kind}_{metric}_mean", f"{kind}_{metric}_low", f"{kind}_{metric}_high"]
        track = summary.get("track", [])
        for m in track:
            head += [f"last {m} mean", f"last {m} low", f"last {m} high"]
        fits = summary.get("fits") or {}
        if fits:  # the saturating curve fitted to compute, per arm (rllab_suite.fits)
            head += ["fit_status", "fit_R0", "fit_A", "fit_A_low", "fit_A_high", "fit_B", f"fit_C_mid_{fits['kind']}",
                     "fit_C_mid_low", "fit_C_mid_high"]
        w.writerow(head)
        for r in summary["rows"]:
            row = [r["task"], r["variant"], r["runs"], r["failed"], r["initial_accuracy"]]
            for metric, _ in METRICS:
                for kind in ("final", "auc"):
                    d = r[f"{kind}_{metric}"]
                    row += [d["mean"], d["low"], d["high"]]
            for m in track:
                d = r["track"][m]["last"]
                row += [d["mean"], d["low"], d["high"]]
            if fits:
                f = fits.get("tasks", {}).get(r["task"], {}).get("arms", {}).get(r["variant"], {})
                a, c = f.get("A_ci") or {}, f.get("C_mid_ci") or {}
                row += [f.get("status", "not fitted"), f.get("R0", ""), f.get("A", ""), a.get("low", ""), a.get("high", ""),
                        f.get("B", ""), f.get("C_mid", ""), c.get("low", ""), c.get("high", "")]
            w.writerow(row)


PROBLEMS_FILE = "problems.csv"
"""Per run and metric, its value on each held-out problem (where the runs recorded them): what a
claim's two-level interval needs, small enough to commit beside ``runs.csv``."""


def problem_metrics(r: RunRecord) -> list[str]:
    """The metrics a run has per-problem values for: final/AUC accuracy and reward, those of its
    step-0 evaluation (``initial_*``: what a suite without a ``no_rl`` arm checks learning against),
    and pass@k of its last sampled evaluation."""
    names = [f"{k}_{m}" for k in ("final", "auc", "initial") for m, _ in METRICS]
    last = r.problems.get(r.steps[-1], {}) if r.steps else {}
    if "samples" in last:
        from rllab.rollout.evalmetrics import report_ks

        names += [f"pass@{k}" for k in [1, *report_ks(last["samples"])]]
    return [n for n in names if r.problem_values(n) is not None]


def write_problems(records: list[RunRecord], path: Path) -> None:
    """``problems.csv``: variant, task, seed, metric, and the metric's per-problem values in the
    held-out order (space-separated); not written when no run recorded per-problem results."""
    rows = [(r, m) for r in records if r.status == "done" for m in problem_metrics(r)]
    if not rows:
        if path.is_file():
            path.unlink()  # a stale file would pair these runs with another suite's problems
        return
    several = any(r.start is not None for r, _ in rows)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "task", "seed", "metric", "values"] + ["start"] * several)
        for r, m in rows:
            w.writerow([r.variant, r.task, r.seed, m, " ".join(f"{v:.6g}" for v in r.problem_values(m))] + [r.start] * several)


def write_all(records: list[RunRecord], out_dir: Path, *, title: str, baseline: str | None, variants: list[str] | None = None, identical: list | None = None, console=None,
              track: tuple = (), controls: tuple = (), compute: str = "tokens", claims: tuple = ()) -> dict:
    """Compute the summary and write ``report.md``, ``summary.csv``, ``summary.json``, ``runs.csv``,
    ``problems.csv`` (where runs recorded per-problem results)
    and the plots (``track.png`` too, for tracked training metrics; ``fits.png``, the curves fitted
    to ``compute``; ``entropy_law.png``, with the entropy–performance law; ``pass_at_k.png`` when runs sampled their evaluation) into ``out_dir``; print
    the table on ``console`` if given."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, baseline=baseline, variants=variants, track=track, controls=controls, compute=compute, claims=claims)
    images = plot(records, summary, out_dir, title) if any(r.status == "done" for r in records) else []
    if images and any(t["arms"] for t in summary["fits"]["tasks"].values()):
        images.append(plot_fits(records, summary, out_dir, title))
    if images and summary.get("entropy_law") and any(summary["entropy_law"]["tasks"].values()):
        images.append(plot_entropy_law(records, summary, out_dir, title))
    if images and any(r.get("pass_at") for r in summary["rows"]):
        images.append(plot_pass_at(summary, out_dir, title))
    (out_dir / "summary.json").write_text(json.dumps({**summary, "notes": notes(summary, identical), "identical": [i for i in identical or [] if "identical" in i]}, indent=2, default=str) + "\n")
    write_csv(summary, out_dir / "summary.csv")
    with (out_dir / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        several = any(r.start is not None for r in records)  # a suite with starts: which start each run began from
        w.writerow(["variant", "task", "seed", "status", "final_accuracy", "auc_accuracy", "final_reward", "auc_reward", "run_dir", "error"] + [f"last {m}" for m in track]
                   + ["start", "start_sha256"] * several)
        for r in records:
            w.writerow([r.variant, r.task, r.seed, r.status, r.final("accuracy"), r.auc("accuracy"), r.final("reward"), r.auc("reward"), r.run_dir, r.error] + [r.last(m) for m in track]
                       + [r.start, r.start_sha256 or ""] * several)
    write_problems(records, out_dir / PROBLEMS_FILE)
    (out_dir / "report.md").write_text(markdown(summary, title=title, identical=identical, images=images))
    if console is not None:
        render_terminal(summary, console, title=title, identical=identical)
    return summary
