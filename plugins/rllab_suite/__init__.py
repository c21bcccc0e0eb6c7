"""``rllab suite``: compare algorithms fairly — variants × tasks × seeds, with statistics.

Commands (added through ``register_commands``)::

    rllab suite SUITE.toml|DIR [--executor local|ray] [--workers N] [--dir DIR] [--replace]
    rllab suite report DIR                 regenerate a suite's tables and plots
    rllab compare RUN_DIR… [--out DIR]     the same report for loose runs
    rllab record RUN_DIR_or_config --steps K --out FILE [key=value …]
    rllab replay FILE VARIANT… | --variants SUITE.toml
    rllab findings build [--check]         docs/findings.md's numbers and verdicts, rebuilt from committed results
    rllab provenance RESULT [OTHER] [--export-start DIR]   what produced a result; how two differ
    rllab reproduce RESULT [--cell NAME[/SEED]]            re-run it and compare value for value

A suite expands into cells (:mod:`rllab_suite.spec`), validates every cell's config before any
runs, runs the missing cells on a local process pool or Ray (:mod:`rllab_suite.executor`), checks
which variants are the same computation by replaying them on one recorded batch
(:mod:`rllab_suite.replay`), and reports mean and 95% bootstrap CIs over seeds, IQM and the
probability of improvement over a baseline (:mod:`rllab_suite.stats`, :mod:`rllab_suite.report`),
each arm against the suite's control arms (:mod:`rllab_suite.controls`: a random reward, no RL)
and curves fitted to compute (:mod:`rllab_suite.fits`).

The plugin also listens to every run's ``on_step_end``: a run whose rollouts score 0 in every
group for its first steps — every advantage 0 — or whose steps keep no sample to train on is
announced once on stderr, naming the cause (reward errors, episodes overflowing their token
budget, completions cut at their token cap, or a warm start that leaves nothing to learn from)
instead of producing a silent flat line; so is, once, a step where most samples failed their
reward or overflowed.

Public API, for front ends such as ``rllab tui`` (importable from ``rllab_suite`` itself; its
modules are loaded on first use, so loading the plugin stays cheap)::

    parse_suite(file_or_dict) -> Suite         a suite file, checked
    expand(suite, lab=...) -> list[Cell]       its cells (variant × task × seed), configs validated
    suite_dir_for(suite, directory) -> Path    where a suite's runs live (``suites/NAME`` or DIR)
    MANIFEST                                   the suite directory's manifest file name
    read_run(run_dir, variant=, task=, seed=, track=)  one run's record (curves, final numbers, tracked metrics)
    summarize(records, baseline=, variants=, track=)   statistics over seeds (CIs, IQM, P(improvement), tracked metrics)
    write_all(records, out_dir, title=, ...)   report.md, summary.csv/json, runs.csv, plots
    notes(summary, identical)                  the report's notes (identical variants, …)
    REPORT_COLUMNS                             the summary table's (label, row -> text) columns
    format_percent(stat), format_probability(stat)   a statistic as the report prints it
    mean_ci(values) -> (mean, low, high)       the mean over seeds and its 95% percentile-bootstrap CI
    prob_improvement([(x, y), …]) -> (p, low, high)  P(X > Y) with its stratified bootstrap CI

Everything else in the package is internal.

See docs/suites.md.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import rllab

__all__ = [
    "MANIFEST",
    "REPORT_COLUMNS",
    "expand",
    "format_percent",
    "format_probability",
    "mean_ci",
    "notes",
    "parse_suite",
    "prob_improvement",
    "read_run",
    "whole_number",
    "suite_dir_for",
    "summarize",
    "write_all",
]
_PUBLIC = {
    "expand": ("spec", "expand"), "parse_suite": ("spec", "parse_suite"),
    "MANIFEST": ("suite", "MANIFEST"), "suite_dir_for": ("suite", "suite_dir_for"),
    "read_run": ("report", "read_run"), "summarize": ("report", "summarize"), "write_all": ("report", "write_all"),
    "notes": ("report", "notes"), "REPORT_COLUMNS": ("report", "COLUMNS"),
    "format_percent": ("report", "format_percent"), "format_probability": ("report", "format_probability"),
    "mean_ci": ("stats", "mean_ci"), "prob_improvement": ("stats", "prob_improvement"),
}  # fmt: skip


def __getattr__(name: str):
    """The public API's names, from their modules on first use (see the module docstring)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'rllab_suite' has no attribute {name!r}")
    import importlib

    module, attr = _PUBLIC[name]
    return getattr(importlib.import_module(f"rllab_suite.{module}"), attr)


ZERO_REWARD_STEPS = 5
"""Warn once a run's first this-many steps all scored 0 in every group."""
MOST = 0.5
"""A step where more than this share of the samples failed (reward errors, overflow) is announced, once per run."""


class NoLearningSignalWarning(UserWarning):
    """Every rollout of a run's first steps scored 0: there is nothing to learn from.

    The listener prints its one line on stderr; the warning itself is ignored unless asked for
    (``warnings.simplefilter("error", NoLearningSignalWarning)``, ``pytest.warns``), so the user
    reads it once and without Python's warning format."""


warnings.filterwarnings("ignore", category=NoLearningSignalWarning, append=True)  # a filter set by the user comes first

_ACTIVE: dict[Path, dict] = {}


def _say(text: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, width=None if sys.stderr.isatty() else 200).print(f"[bold red]warning:[/] {escape(text)}", highlight=False)


def _warn(text: str) -> None:
    _say(text)
    warnings.warn(text, NoLearningSignalWarning, stacklevel=2)


def _steps_seen(s: dict) -> str:
    """The steps a warning speaks of: the run's first ones, or those since it was resumed."""
    first, last = s.get("start", 0) + 1, s.get("start", 0) + s["steps"]
    if first == 1:
        return "the first step" if s["steps"] == 1 else f"the first {s['steps']} steps"
    return f"step {first} (the first since the resume)" if first == last else f"steps {first}–{last} (since the resume)"


def _nothing(s: dict, who: str) -> str:
    """The no-learning warning: what was empty, and why."""
    if s["zero"] == s["steps"]:
        what = (f"every rollout of {_steps_seen(s)} scored 0 on {who}, so there is nothing to learn from "
                "(every group's advantage is 0)")
        return f"{what}; {_cause(s)}"
    what = f"no step of {_steps_seen(s)} kept a sample to train on (rollout/kept_frac 0) on {who}, so nothing was learnt"
    if s["error_frac"] > 0:
        return f"{what}; {_cause(s)}"
    return f"{what}; rollout.dynamic_sampling drops every group whose rewards are all equal, and every group's were."


def _cause(s: dict) -> str:
    """Why every reward was 0: the reward errors or overflows seen, else the warm start."""
    n = max(1, s["steps"])
    if s["error_frac"] > 0:
        return (
            f"{s['error_frac'] / n:.0%} of the samples failed their reward (rollout.reward_errors = {s['policy']!r}, counted in "
            "rollout/reward_errors): fix the reward function or environment; rollout.reward_errors = \"raise\" stops at the "
            "first failure with its message."
        )
    if s["overflow_frac"] > 0:
        return (
            f"{s['overflow_frac'] / n:.0%} of the episodes overflowed their token budget (finish reason 'overflow'): "
            f"{_overflow_fix(s)}."
        )
    if s["stopped"] / n < 1 - MOST:
        budget = f", rollout.max_episode_tokens = {s['budget']!r}" if s["kind"] == "environment" else ""
        return (
            f"{1 - s['stopped'] / n:.0%} of the completions were cut at their token cap before they ended (rollout.max_new_tokens = "
            f"{s['max_new_tokens']!r}{budget}; rollout/stop_frac {s['stopped'] / n:.2f}). Raise the cap if the answers need "
            f"more tokens; a model that never ends its answers needs a (longer) warm start (model.warm_start.steps)."
        )
    return (
        "the warm start leaves the model no reward to start from. Use an easier task config or a longer warm start "
        "(model.warm_start.target_accuracy / model.warm_start.steps)."
    )


def _overflow_fix(s: dict) -> str:
    """What to change when episodes overflow: the budget the run set, or the model's context."""
    if s["budget"] is None:
        return ("the episodes outgrow the model's context (rollout.max_episode_tokens is unset): use a model with a longer "
                "context (the tiny model: model.tiny.max_position_embeddings), shorten the observations, or end episodes "
                "sooner with rollout.max_turns")
    return f"raise rollout.max_episode_tokens (now {s['budget']!r}) or shorten the observations"


@rllab.hookimpl
def on_run_start(run_dir, config, start_step, total_steps, progress):
    from rllab.config import COMPONENT_SECTIONS

    _ACTIVE[Path(run_dir)] = {
        "steps": 0, "zero": 0, "warned": False, "noted": set(), "error_frac": 0.0, "overflow_frac": 0.0,
        "kind": COMPONENT_SECTIONS[config.source][0], "task": config.component(config.source).name,
        "total": total_steps - start_step, "policy": config.rollout.reward_errors,
        "budget": getattr(config.rollout, "max_episode_tokens", None), "max_new_tokens": config.rollout.max_new_tokens,
        "stopped": 0.0, "empty": 0, "start": start_step,
    }


@rllab.hookimpl
def on_step_end(step, metrics, run_dir):
    s = _ACTIVE.get(Path(run_dir))
    if s is None or "rollout/reward" not in metrics:
        return
    s["steps"] += 1
    s["zero"] += metrics["rollout/reward"] == 0.0 and metrics.get("rollout/score", 0.0) == 0.0
    s["stopped"] += float(metrics.get("rollout/stop_frac", 1.0))
    empty = metrics.get("rollout/kept_frac", 1.0) == 0.0
    s["empty"] += empty
    who = f"{s['kind']} {s['task']!r}"
    for key, what in (("error_frac", "samples failed their reward"), ("overflow_frac", "episodes overflowed their token budget")):
        frac = float(metrics.get(f"rollout/{key}", 0.0))
        s[key] += frac
        dropped_all = key == "error_frac" and frac > 0 and empty and s["policy"] == "skip"
        if (frac > MOST or dropped_all) and key not in s["noted"]:  # every sample failing stops the run (rllab.rollout.episode_stats)
            s["noted"].add(key)
            fix = (f"fix the reward function (rollout.reward_errors = {s['policy']!r} hides the failures; \"raise\" stops at the "
                   "first one with its message)") if key == "error_frac" else \
                _overflow_fix(s)
            lost = (" — rollout.reward_errors = 'skip' drops a failed sample's whole group, so the step trained on nothing"
                    if dropped_all else "")
            _say(f"{run_dir}: at step {step}, {frac:.0%} of the {what} on {who}{lost}; the run goes on, but {fix}. "
                 "Said once per run.")
    if not s["warned"] and s["steps"] >= min(ZERO_REWARD_STEPS, s["total"]) and s["steps"] in (s["zero"], s["empty"]):
        s["warned"] = True
        _warn(f"{run_dir}: {_nothing(s, who)}")


@rllab.hookimpl
def on_run_end(run_dir, metrics, history):
    s = _ACTIVE.pop(Path(run_dir), None)
    if s and s["steps"] and s["steps"] in (s["zero"], s["empty"]) and not s["warned"]:  # said once: at the step, else here
        who = f"{s['kind']} {s['task']!r}"
        _warn(f"{run_dir}: {_nothing(s, who)} Its flat curve is no result.")


@rllab.hookimpl
def on_run_error(run_dir, step, error):
    _ACTIVE.pop(Path(run_dir), None)


# --------------------------------------------------------------------------- commands


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def _need_scipy() -> None:
    import importlib.util

    if importlib.util.find_spec("scipy") is None:  # looked up, not imported: an error before the statistics stays quick
        raise rllab.MissingExtraError("the suite statistics need scipy: pip install 'rllab[suite]'")


def cmd_suite(args) -> int:
    if not args.dry_run:  # listing the cells needs no statistics
        _need_scipy()
    from rllab_suite.suite import report_suite, run_suite

    console = _console()
    if args.target == "report" and (args.dry_run or args.steps is not None or args.seeds is not None):
        raise rllab.RllabError("--dry-run, --steps and --seeds apply to running a suite, not to 'rllab suite report'")
    if args.target == "report":
        if not args.dir:
            raise rllab.RllabError("usage: rllab suite report DIR")
        _check_report_dir(Path(args.dir))
        if Path(args.dir).is_dir():  # a suite running there writes its own report when it ends
            from rllab.training import runlock

            with runlock.acquire(Path(args.dir), advice="Its report is written when it ends; or {stop} and then run: rllab suite report {dir}"):
                report_suite(args.dir, console=console)
        else:
            report_suite(args.dir, console=console)  # says what is missing
        console.print(f"report written to {Path(args.dir) / 'report.md'}", highlight=False)
        return 0
    if args.dir_positional:
        raise rllab.RllabError(f"unexpected argument {args.dir_positional!r}; the suite directory is given with --dir")
    target = Path(args.target)
    if target.is_dir():  # a suite directory: run (resume) the suite it keeps
        if not (target / "suite.toml").is_file():
            raise rllab.RllabError(
                f"{target} is a directory without a suite.toml; rllab suite takes a suite file (rllab suite SUITE.toml --dir {target}) "
                "or a suite directory that keeps one"
            )
        args.dir = args.dir or str(target)
        target = target / "suite.toml"
    if args.dry_run:
        return _dry_run(target, args, console)
    summary = run_suite(target, directory=args.dir, replace=args.replace, executor_name=args.executor, workers=args.workers, address=args.address,
                        lab=args.lab, console=console, progress=not args.quiet, check_identical=not args.no_identical_check,
                        steps=args.steps, seeds=args.seeds)
    return 1 if summary["failed"] else 0


def _dry_run(target: Path, args, console) -> int:
    """``rllab suite FILE --dry-run``: every cell validated and listed (variant, task, seed, steps,
    whether its run is done), and where the runs would go; nothing runs or is written."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from rllab_suite.spec import parse_suite
    from rllab_suite.suite import check_directory, plan, shrink

    suite = shrink(parse_suite(target), steps=args.steps, seeds=args.seeds)
    cells, out, done = plan(suite, args.dir, lab=args.lab)
    if not getattr(args, "replace", False):  # what the run would refuse, the dry run refuses too (--replace changes nothing yet)
        check_directory(suite, out)
    starts = f"{len(suite.starts)} starts × " if suite.starts else ""
    t = Table(box=box.SIMPLE_HEAVY, title=escape(f"suite {suite.name}: {len(suite.variants)} variants × {len(suite.tasks)} tasks × "
                                                   f"{starts}{len(suite.seeds)} seeds = {len(cells)} runs → {out}"))
    for col in ("variant", "task", *(("start",) if suite.starts else ()), "seed", "steps", "run", "status"):
        t.add_column(col, overflow="fold")
    for c in cells:
        t.add_row(escape(c.variant), escape(c.task), *((str(c.start),) if suite.starts else ()), str(c.seed), str(c.config["train"]["steps"]),
                  escape(c.slug), "done" if c.slug in done else "to run")
    console.print(t)
    how = " ".join(f"--{k} {v}" for k, v in (("steps", args.steps), ("seeds", args.seeds)) if v is not None)
    console.print(escape(f"dry run: nothing ran; {len(cells) - len(done)} of {len(cells)} runs to go "
                         f"(run them: rllab suite {target}{' ' + how if how else ''})"), highlight=False)
    return 0


def _check_report_dir(given: Path) -> None:
    """``rllab suite report`` takes a suite directory; a suite file is answered with its directory."""
    if given.is_file() and given.suffix == ".toml":
        from rllab_suite.spec import parse_suite
        from rllab_suite.suite import suite_dir_for

        try:
            out = suite_dir_for(parse_suite(given), None)
            where = f"; its runs go to {out} unless run with --dir: rllab suite report {out}"
        except rllab.RllabError:
            where = ""
        raise rllab.RllabError(
            f"rllab suite report takes a suite directory (where a suite's runs and suite.json are), not the suite file {given}{where}; "
            f"to run the suite: rllab suite {given}"
        )


def cmd_compare(args) -> int:
    _need_scipy()
    from rllab_suite.suite import compare_runs

    console = _console()
    out = Path(args.out) if args.out else default_compare_dir([Path(r) for r in args.runs])
    compare_runs(args.runs, out=out, baseline=args.baseline, console=console)
    from rich.markup import escape

    from rllab_suite.reproduce import compare_notes

    for note in compare_notes([Path(r) for r in args.runs]):  # what the configs do not say: versions, machine, data, start
        console.print(escape(f"provenance: {note}"), highlight=False, soft_wrap=True)
    console.print(f"report written to {out / 'report.md'}", highlight=False)
    return 0


def default_compare_dir(runs: list[Path]) -> Path:
    """Where ``rllab compare`` writes without ``--out``: ``compare/`` in the directory that holds the
    runs (their nearest common one), not the working directory."""
    import os

    parents = [r.resolve().parent for r in runs]
    try:
        common = Path(os.path.commonpath(parents))
    except ValueError:  # different drives
        common = parents[0]
    return common / "compare"


def _provenance_entry(args) -> int:
    from rllab_suite.reproduce import cmd_provenance

    return cmd_provenance(args)


def _reproduce_entry(args) -> int:
    from rllab_suite.reproduce import cmd_reproduce

    return cmd_reproduce(args)


def _findings_entry(args) -> int:
    from rllab_suite.findings import cmd_findings

    return cmd_findings(args)


def cmd_record(args) -> int:
    from rllab_suite import replay
    from rllab_suite.checks import check_record_args

    source = None
    overrides = []
    for item in args.items:
        if "=" in item:
            overrides.append(item)
        elif source is None:
            source = item
        else:
            raise rllab.RllabError(f"rllab record takes one run directory or config file; also got {item!r}")
    check_record_args(source, out=Path(args.out), preset=args.preset, overrides=overrides)
    data = replay.record(source, steps=args.steps, out=Path(args.out), overrides=overrides, preset=args.preset, lab=args.lab, progress=not args.quiet)
    rows = sum(b["batch"]["input_ids"].shape[0] for b in data["batches"])
    _console().print(f"recorded {len(data['batches'])} batch(es), {rows} rows, from step {data['step']} → {args.out}", highlight=False)
    return 0


def cmd_replay(args) -> int:
    import copy

    from rllab.config import load_config, parse_overrides
    from rllab_suite import replay
    from rllab_suite.checks import check_replay_overrides, open_record

    pending = []
    repeated = sorted({v for v in args.variants if args.variants.count(v) > 1})
    if repeated:
        raise rllab.RllabError(f"variant {repeated[0]!r} is given twice: each variant is replayed once (compare different ones)")
    for item in args.variants:
        pairs = parse_overrides([p for p in item.split(",") if p.strip()])
        check_replay_overrides(item, pairs, args.lab)
        pending.append((item, pairs))
    data = open_record(Path(args.file))
    configs = []
    for item, pairs in pending:
        try:
            cfg = load_config(copy.deepcopy(data["config"]), pairs, lab=args.lab)
        except rllab.RllabError as e:
            raise rllab.RllabError(f"variant {item!r}: {e}") from None
        configs.append((item, cfg.to_dict()))
    if args.suite:
        from rllab_suite.spec import expand, parse_suite

        cells = expand(parse_suite(args.suite), lab=args.lab)
        task = data["config"]["task"]["name"]
        same = [c for c in cells if c.config["task"] == data["config"]["task"]]  # the recording's task config, else its name
        named = [c for c in cells if c.config["task"]["name"] == task]
        cells = same or [c for c in named if c.task == named[0].task]
        if not cells:
            raise rllab.RllabError(f"{args.suite} has no cell on the recording's task {task!r}")
        seed = min(c.seed for c in cells)
        configs += [(c.variant, c.config) for c in cells if c.seed == seed]
    if not configs:
        configs = [("recorded", data["config"])]
    results = replay.replay_configs(data, configs, lab=args.lab)
    replay.render(results, replay.compare(results), _console(), step=data["step"])
    return 0


@rllab.hookimpl
def register_commands(subparsers):
    from rllab_suite.executor import EXECUTORS

    p = subparsers.add_parser("suite", help="run a suite of variants × tasks × seeds and compare them with statistics; 'suite report DIR' regenerates a report")
    p.add_argument("target", metavar="SUITE.toml|DIR|report", help="the suite file, a suite directory (runs the suite.toml it keeps), or 'report'")
    p.add_argument("dir_positional", nargs="?", metavar="DIR", help="with 'report': the suite directory")
    p.add_argument("--executor", choices=EXECUTORS, default="local", help="local process pool (default) or Ray")
    p.add_argument("--workers", type=whole_number(1), default=None, help="runs at a time, at least 1 (default: one per core)")
    p.add_argument("--address", default=None, help="Ray cluster address for --executor ray (default: start a local instance)")
    p.add_argument("--dir", default=None, help="the suite directory (default: suites/NAME, or the directory of a kept DIR/suite.toml)")
    p.add_argument("--replace", action="store_true", help="let the suite take over a --dir that holds another suite (refused otherwise)")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress display")
    p.add_argument("--no-identical-check", action="store_true", help="skip replaying the variants on a recorded batch")
    p.add_argument("--dry-run", action="store_true", help="validate and list the cells (and which are done) without running anything")
    p.add_argument("--steps", type=whole_number(1), default=None, metavar="N", help="to try the suite: N training steps per run (a suite NAME-try of its own)")
    p.add_argument("--seeds", type=whole_number(1), default=None, metavar="K", help="to try the suite: its first K seeds only (a suite NAME-try of its own)")
    p.set_defaults(func=_suite_entry)

    p = subparsers.add_parser("compare", help="compare loose run directories (grouped by their differing settings) with statistics")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None, help="where report.md, CSV, JSON and plots go (default: compare/ beside the runs, e.g. runs/compare)")
    p.add_argument("--baseline", default=None, help="the group P(improvement) is measured against (a label as printed)")
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser("provenance", help="what produced a run or suite result (versions, CPU, threads, hashes of config, data, start); two: how they differ")
    p.add_argument("result", metavar="RUN_DIR|SUITE_DIR")
    p.add_argument("other", nargs="?", metavar="OTHER", help="a second result: list the fields in which the two differ (exit 1 if any)")
    p.add_argument("--json", action="store_true", help="print the record (or the differences) as JSON")
    p.add_argument("--export-start", metavar="DIR", help="copy the run's starting model to DIR/start-SHA and print the settings that pin it")
    p.set_defaults(func=_provenance_entry)

    p = subparsers.add_parser("reproduce", help="re-run a run (a suite cell, or every cell of a suite) from its recorded config and pinned start; 'identical' or the first difference")
    p.add_argument("result", metavar="RUN_DIR|SUITE_DIR")
    p.add_argument("--cell", metavar="NAME[/SEED]", help="in a suite result: the variant (or cell run directory) and seed to re-run (default seed: the lowest)")
    p.add_argument("--run-dir", default=None, help="where the rerun writes (default: a new temporary directory)")
    p.add_argument("--start", default=None, metavar="DIR", help="an exported starting model (rllab provenance RUN --export-start), checked against the recorded hash")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_reproduce_entry)

    p = subparsers.add_parser("record", help="save rollout batches and the checkpoint they came from, for rllab replay")
    p.add_argument("items", nargs="*", metavar="RUN_DIR_or_config|key=value", help="a run directory or config file (optional), then overrides")
    p.add_argument("--steps", type=whole_number(1), default=1, help="batches to record, at least 1 (no training between them)")
    p.add_argument("--out", required=True, help="the recording file")
    p.add_argument("--preset", default=None, help="start from a preset when no file is given")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_record)

    p = subparsers.add_parser("replay", help="run several losses/estimators/corrections on exactly the recorded batches and compare their gradients")
    p.add_argument("file")
    p.add_argument("variants", nargs="*", metavar="VARIANT", help="overrides of one variant, comma-separated (policy_loss=cispo,algorithm.minibatches=4)")
    p.add_argument("--variants", dest="suite", default=None, metavar="SUITE.toml", help="replay a suite's variants")
    p.set_defaults(func=cmd_replay)

    p = subparsers.add_parser("findings", help="rebuild docs/findings.md's numbers and verdicts from committed suite results; --check fails when it drifted")
    p.add_argument("action", choices=["build"])
    p.add_argument("--check", action="store_true", help="rebuild in memory and exit 1 if the page differs or quotes numbers no committed file backs")
    p.add_argument("--doc", default="docs/findings.md", help="the findings page (default docs/findings.md)")
    p.add_argument("--root", default=None, help="the repository holding benchmarks/suites (default: found above the page)")
    p.set_defaults(func=_findings_entry)


def whole_number(least: int = 1, *, of: str = ""):
    """An argparse type: a whole number ≥ ``least`` (``--workers 0`` is refused, not read as
    "auto"); ``of`` names what is counted (``"seeds"``) in the error."""
    import argparse

    counted = f" of {of}" if of else ""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number{counted}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{n}: the number{counted} must be at least {least}")
        return n

    return parse



def _suite_entry(args) -> int:
    if args.target == "report":
        _check_report_options(args)
    args.dir = args.dir if args.target != "report" else (args.dir_positional or args.dir)
    if args.target == "report":
        args.dir_positional = None
    return cmd_suite(args)


def _check_report_options(args) -> None:
    """``rllab suite report`` only rewrites a report from a suite directory's runs: options of a
    suite run, or two directories, would be ignored."""
    running = {"--executor": args.executor != "local", "--workers": args.workers is not None, "--address": args.address is not None,
               "--replace": args.replace, "--no-identical-check": args.no_identical_check}  # fmt: skip
    given = [flag for flag, on in running.items() if on]
    if given:
        raise rllab.RllabError(
            f"{', '.join(given)}: options of running a suite; rllab suite report runs nothing, it rewrites the report of a "
            f"suite directory from its runs. Drop them (they belong to rllab suite SUITE.toml|DIR)"
        )
    if args.dir_positional and args.dir and Path(args.dir) != Path(args.dir_positional):
        raise rllab.RllabError(f"rllab suite report takes one suite directory; got {args.dir_positional} and --dir {args.dir}")
