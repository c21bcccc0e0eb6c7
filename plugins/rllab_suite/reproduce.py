"""``rllab provenance`` and ``rllab reproduce``: what produced a result, and whether it comes out
the same again.

``rllab provenance RUN`` prints a run's (or a suite result's) ``provenance.json``
(:mod:`rllab.records.provenance`); ``rllab provenance A B`` lists the fields in which two records differ;
``--export-start DIR`` copies the run's starting model to ``DIR/start-SHA`` (stored once per
hash) and prints the settings that pin it.

``rllab reproduce RESULT`` re-runs a run directory (or, with ``--cell NAME[/SEED]``, one cell of a
suite result) from its recorded config and pinned start (:func:`rllab.training.reproduce.reproduce_run`)
and says ``identical``, the first step and metric that differ, or which provenance fields differ
and what still held. Given a suite result without ``--cell`` it re-runs every cell
(:func:`reproduce_suite`) and, unless all are identical, compares the rerun's report with the
recorded one: each claim's verdict and the order of the variants, with their intervals.

A suite result records its own ``provenance.json``
(:func:`rllab_suite.suite.write_suite_provenance`): the environment once, each cell's
starting-model hash, and the starts by hash.
"""

from __future__ import annotations

import json
from pathlib import Path

from rllab.records import provenance
from rllab.errors import RllabError

from .spec import MANIFEST
from .starts import export_start


# --------------------------------------------------------------------------- suite results


def resolve_cell(result: Path, cell: str) -> Path:
    """The run directory of ``--cell NAME[/SEED]`` in a suite result: NAME is a variant (or a
    cell's run directory name), SEED its seed (default: the lowest)."""
    manifest_path = result / MANIFEST
    if not manifest_path.is_file():
        if (result / provenance.PROVENANCE_FILE).is_file() and "cells" in provenance.read(result):
            starts = ", ".join(provenance.read(result).get("starts") or ()) or "none recorded"
            raise RllabError(
                f"--cell {cell}: {result} is a suite report without its run directories (a committed result keeps the "
                f"report, its provenance.json and the starts' hashes: {starts}); run the suite again from its pinned start "
                f"(model.sha256=HASH with ${provenance.STARTS_ENV} naming where the start is kept, docs/reproducibility.md) "
                f"and compare with the report"
            )
        raise RllabError(f"--cell {cell}: {result} is not a suite result (no {MANIFEST})")
    manifest = json.loads(manifest_path.read_text())
    name, _, seed = cell.partition("/")
    matches = [c for c in manifest["cells"] if name in (c["variant"], c["run"])]
    if not matches:
        raise RllabError(f"--cell {cell}: no variant {name!r} in {result}; its variants: {', '.join(manifest['variants'])}")
    if seed:
        try:
            wanted = int(seed)
        except ValueError:
            raise RllabError(f"--cell {cell}: the seed after '/' must be a whole number, got {seed!r}") from None
        seeds = sorted({c["seed"] for c in matches})
        matches = [c for c in matches if c["seed"] == wanted]
        if not matches:
            raise RllabError(f"--cell {cell}: variant {name!r} has no seed {wanted} in {result}; its seeds: {', '.join(map(str, seeds))}")
    else:
        low = min(c["seed"] for c in matches)
        matches = [c for c in matches if c["seed"] == low]
    if len({c["task"] for c in matches}) > 1:
        raise RllabError(f"--cell {cell}: variant {name!r} ran on several tasks; name the cell by its run directory: "
                         f"{', '.join(c['run'] for c in matches)}")
    if len({c.get("start") for c in matches}) > 1:
        raise RllabError(f"--cell {cell}: variant {name!r} ran from several starts; name the cell by its run directory: "
                         f"{', '.join(c['run'] for c in matches)}")
    return result / "runs" / matches[0]["run"]


def reproduce_suite(result: Path, *, lab, out: Path, start=None, progress: bool = False) -> dict:
    """Re-run every finished cell of a suite result into ``OUT/runs`` (each as ``rllab reproduce``
    does one run) and compare. Every cell identical: ``{"verdict": "identical", ...}``. Otherwise
    the report of the rerun (``OUT/summary.json``) against the recorded one: each claim's verdict,
    and per task the order of the variants by final accuracy, each with its interval.

    :returns: ``{"verdict": identical | different | provenance differs, "cells": {run: Outcome},
        "claims": [(claim, task, recorded, rerun)], "orders": [(task, recorded order, rerun order)],
        "held": bool}``; ``held``: every verdict and order the same."""
    import io

    from rich.console import Console

    from rllab.training.reproduce import DIFFERENT, IDENTICAL, PROVENANCE_DIFFERS, reproduce_run

    manifest = json.loads((result / MANIFEST).read_text())
    recorded_summary = result / "summary.json"
    if not recorded_summary.is_file():
        raise RllabError(f"{result} has no summary.json to compare with: regenerate it first with rllab suite report {result}")
    out.mkdir(parents=True, exist_ok=False)
    cells = {}
    for c in manifest["cells"]:
        run = result / "runs" / c["run"]
        if not (run / "final.json").is_file():
            continue  # a failed or unfinished cell has nothing to compare
        cells[c["run"]] = reproduce_run(run, lab=lab, run_dir=out / "runs" / c["run"], start=start, progress=progress)
    kept = {**manifest, "cells": [c for c in manifest["cells"] if c["run"] in cells]}
    (out / MANIFEST).write_text(json.dumps(kept, indent=2) + "\n")
    verdicts = {o.verdict for o in cells.values()}
    if verdicts == {IDENTICAL}:
        return {"verdict": IDENTICAL, "cells": cells, "claims": [], "orders": [], "held": True}
    from rllab_suite.suite import report_suite

    new = report_suite(out, console=Console(file=io.StringIO()))
    old = json.loads(recorded_summary.read_text())
    claims = []
    for v in old.get("verdicts", ()):
        again = next((w for w in new.get("verdicts", ()) if w.get("name") == v.get("name") and w.get("task") == v.get("task")), None)
        claims.append((v.get("name"), v.get("task"), v, again))
    orders = []
    for task in sorted({r["task"] for r in old.get("rows", ())}):
        def order(summary):
            rows = [r for r in summary.get("rows", ()) if r["task"] == task and isinstance(r.get("final_accuracy"), dict)]
            return [(r["variant"], r["final_accuracy"]) for r in sorted(rows, key=lambda r: -r["final_accuracy"]["mean"])]
        orders.append((task, order(old), order(new)))
    held = all(b is not None and a.get("verdict") == b.get("verdict") for _, _, a, b in claims) and all(
        [v for v, _ in a] == [v for v, _ in b] for _, a, b in orders)
    verdict = DIFFERENT if DIFFERENT in verdicts else PROVENANCE_DIFFERS
    return {"verdict": verdict, "cells": cells, "claims": claims, "orders": orders, "held": held}


def _interval(stat: dict | None) -> str:
    if not stat:
        return "—"
    return f"{stat['mean']:.1%} [{stat.get('low', float('nan')):.1%}, {stat.get('high', float('nan')):.1%}]"


def print_suite_outcome(console, got: dict) -> int:
    """The lines ``rllab reproduce SUITE_DIR`` prints; its exit code (0 every cell identical; 2 the
    provenance differs and every verdict and order held; 1 otherwise)."""
    from rich.markup import escape

    from rllab.training.reproduce import DIFFERENT, IDENTICAL

    for run, o in got["cells"].items():
        what = {IDENTICAL: "identical", DIFFERENT: f"different: {o.first.describe() if o.first else ''}"}.get(
            o.verdict, f"provenance differs ({', '.join(f[0] for f in o.fields[:4])}{', …' if len(o.fields) > 4 else ''})")
        console.print(escape(f"  {run}: {what}"), highlight=False, soft_wrap=True)
    if got["verdict"] == IDENTICAL:
        console.print(f"[green]identical[/]: all {len(got['cells'])} cells, value for value", highlight=False)
        return 0
    console.print("not identical: compared at the level of the report (verdicts, and the order of the variants by final accuracy):", highlight=False)
    for name, task, a, b in got["claims"]:
        after = b.get("verdict") if b else "absent"
        mark = "same" if b is not None and a.get("verdict") == after else "CHANGED"
        console.print(escape(f"  claim {name} on {task}: {a.get('verdict')} → {after} ({mark}); effect {a.get('diff', {}).get('effect')} → "
                             f"{(b or {}).get('diff', {}).get('effect')}"), highlight=False, soft_wrap=True)
    for task, a, b in got["orders"]:
        mark = "same" if [v for v, _ in a] == [v for v, _ in b] else "CHANGED"
        console.print(escape(f"  order on {task} ({mark}): " + " > ".join(f"{v} {_interval(s)}" for v, s in a) + "  →  "
                             + " > ".join(f"{v} {_interval(s)}" for v, s in b)), highlight=False, soft_wrap=True)
    if got["verdict"] == DIFFERENT:
        console.print("[red]different[/]: a cell's values differ although its provenance matches", highlight=False)
        return 1
    return 2 if got["held"] else 1


# --------------------------------------------------------------------------- printing


def _lines(record: dict) -> list[tuple[str, str]]:
    hashes = record.get("hashes") or {}
    flat = provenance.flatten({k: v for k, v in record.items() if k not in ("hashes", "libraries", "cells", "starts")})
    rows = [(k, provenance.format_value(v, 1000)) for k, v in flat.items()]
    rows += [(f"libraries.{name}", version) for name, version in (record.get("libraries") or {}).items()]
    if hashes:
        rows.append(("hashes.config", str(hashes.get("config"))))
        for d in hashes.get("data", ()):
            rows.append((f"hashes.data {d['path']}", d["sha256"]))
        for p in hashes.get("plugins", ()):
            rows.append((f"hashes.plugin {p['name']}", str(p.get("sha256", "(not a file)"))))
        start = hashes.get("start") or {}
        if start:
            rows.append((f"hashes.start ({start.get('kind')}) {start.get('path')}", str(start.get("sha256"))))
        for d in hashes.get("inputs", ()):  # other inputs a component read by content (opd's local teacher)
            rows.append((f"hashes.input {d.get('setting')} {d.get('path')}", str(d.get("sha256"))))
    for sha, runs in (record.get("starts") or {}).items():
        rows.append((f"starts.{sha}", f"{len(runs)} cell(s)"))
    return rows


def print_record(console, record: dict) -> None:
    from rich.markup import escape

    width = max((len(k) for k, _ in _lines(record)), default=0)
    for key, value in _lines(record):
        console.print(escape(f"{key.ljust(width)}  {value}"), highlight=False, soft_wrap=True)


def print_differences(console, fields: list, a: str, b: str) -> None:
    from rich.markup import escape

    if not fields:
        console.print(f"{escape(a)} and {escape(b)}: the provenance is the same (code, libraries, machine, threads, config, data, start, seeds)", highlight=False)
        return
    console.print(f"{escape(a)} and {escape(b)} differ in {len(fields)} provenance field(s):", highlight=False)
    for field, va, vb in fields:
        console.print(escape(f"  {field}: {provenance.format_value(va)} → {provenance.format_value(vb)}  ({provenance.explain(field)})"),
                      highlight=False, soft_wrap=True)


def compare_notes(run_dirs: list[Path]) -> list[str]:
    """For ``rllab compare``: how each run's provenance differs from the first's in what the
    config does not say (code, libraries, machine, threads, data contents, start); runs without a
    record are named."""
    notes, records = [], []
    for d in run_dirs:
        try:
            records.append((d, provenance.read(d)))
        except RllabError:
            notes.append(f"{d}: no provenance.json (recorded before runs wrote one)")
    if len(records) < 2:
        return notes
    (first_dir, first), rest = records[0], records[1:]
    for d, rec in rest:
        fields = [f for f in provenance.differences(first, rec) if f[0] != "hashes.config" and not f[0].startswith("seeds.")]
        if fields:
            what = "; ".join(f"{k}: {provenance.format_value(a, 30)} → {provenance.format_value(b, 30)}" for k, a, b in fields[:6])
            more = f" (and {len(fields) - 6} more: rllab provenance {first_dir} {d})" if len(fields) > 6 else ""
            notes.append(f"{d} ran differently from {first_dir}: {what}{more}")
    if not notes:
        notes.append(f"every run's provenance matches outside its config and seed (code, libraries, machine, threads, data, start)")
    return notes


# --------------------------------------------------------------------------- commands


def cmd_provenance(args) -> int:
    from rich.console import Console
    import sys

    console = Console(width=None if sys.stdout.isatty() else 200)
    a = provenance.read(Path(args.result))
    if args.other is not None:
        fields = provenance.differences(a, provenance.read(Path(args.other)))
        if args.json:
            print(json.dumps([{"field": f, "a": x, "b": y} for f, x, y in fields], indent=2, default=str))
        else:
            print_differences(console, fields, args.result, args.other)
        return 0 if not fields else 1
    if args.export_start:
        if Path(args.export_start).exists() and not Path(args.export_start).is_dir():
            raise RllabError(f"--export-start {args.export_start}: a file is there; give a directory (the start goes to DIR/start-<hash>)")
        start = ((a.get("hashes") or {}).get("start")) or {}
        if not start.get("path") and isinstance(a.get("starts"), dict) and a["starts"]:  # a suite result: one start per hash
            cells = "; ".join(f"{sha[:16]}…: rllab provenance {Path(args.result) / 'runs' / (names or ['CELL'])[0]} --export-start "
                              f"{args.export_start}" for sha, names in a["starts"].items())
            raise RllabError(f"{args.result} is a suite result of {len(a['starts'])} start(s); export each from one of its cells: {cells}")
        if not start.get("path") or not start.get("sha256"):
            raise RllabError(f"{args.result}: its provenance names no starting model")
        src = Path(start["path"])
        if not src.is_dir():
            raise RllabError(f"{args.result}: its starting model {src} is not on this machine any more; export it where the run ran")
        provenance.check_start(src, start["sha256"], setting=f"the start of {args.result}")
        dest, copied = export_start(src, start["sha256"], Path(args.export_start))
        if not copied:
            console.print(f"{dest} already holds this start (sha256 {start['sha256']})", highlight=False)
        else:
            console.print(f"exported the start (sha256 {start['sha256']}) to {dest}", highlight=False)
        if start.get("kind") == "warm_start":
            console.print(f"rerun from it: rllab reproduce {args.result} --start {dest}", highlight=False)
        console.print(f"train from it: model.path={dest} model.sha256={start['sha256']}", highlight=False)
        return 0
    if args.json:
        print(json.dumps(a, indent=2, default=str))
    else:
        print_record(console, a)
    return 0


def cmd_reproduce(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    import sys

    from rllab.training.reproduce import DIFFERENT, IDENTICAL, reproduce_run

    console = Console(width=None if sys.stdout.isatty() else 200)
    result = Path(args.result)
    if not args.cell and (result / MANIFEST).is_file():
        import tempfile

        out_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="rllab-reproduce-suite-")) / result.name
        console.print(f"reproducing every cell of {escape(str(result))} into {escape(str(out_dir))} …", highlight=False)
        got = reproduce_suite(result, lab=args.lab, out=out_dir, start=args.start, progress=not args.quiet)
        return print_suite_outcome(console, got)
    run = resolve_cell(result, args.cell) if args.cell else result
    console.print(f"reproducing {escape(str(run))} …", highlight=False)
    out = reproduce_run(run, lab=args.lab, run_dir=args.run_dir, start=args.start, progress=not args.quiet)
    console.print(f"rerun in {escape(str(out.run_dir))}", highlight=False)
    if out.verdict == IDENTICAL:
        console.print(f"[green]identical[/]: {out.compared} logged values match, value for value (timings and memory not compared)", highlight=False)
    elif out.verdict == DIFFERENT:
        console.print(f"[red]different[/] (provenance matches): first at {escape(out.first.describe())}", highlight=False)
    else:
        console.print(f"[yellow]not comparable for identity[/]: the rerun's provenance differs from the recorded one in {len(out.fields)} field(s):",
                      highlight=False)
        for field, va, vb in out.fields:
            console.print(escape(f"  {field}: {provenance.format_value(va)} → {provenance.format_value(vb)}  ({provenance.explain(field)})"),
                          highlight=False, soft_wrap=True)
        if out.start_eval is None:
            console.print("the starting model, config, data or seeds differ: nothing is expected to hold value for value", highlight=False)
        else:
            console.print(("the untrained start's evaluation (step 0) still matches value for value" if out.start_eval
                           else "[red]the untrained start's evaluation (step 0) differs[/]"), highlight=False)
        console.print(escape("later steps: " + (f"first difference at {out.first.describe()}" if out.first else
                                                "every compared value matched, but identity is not claimed across these differences")), highlight=False)
    return out.exit_code
