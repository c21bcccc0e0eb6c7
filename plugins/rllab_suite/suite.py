"""Running a suite: validate every cell, build the warm starts once, run what is missing, check
which variants are the same computation, and write the report."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from rllab import RllabError
from rllab.records import provenance
from rllab.training import runlock
from rllab_suite import executor, verdicts  # replay (torch) and report (scipy) are imported where used
from rllab_suite.spec import MANIFEST, Cell, Suite, SuiteError, _slug, config_key, expand, parse_suite

SUITE_ADVICE = ("For another suite give another --dir; otherwise wait for that suite to end, or {stop}, and continue it "
                "with: rllab suite {dir}")
"""What a second ``rllab suite`` on a suite directory in use is told."""
RECORD_STEPS = 2
"""Batches recorded for the identical-variant check."""


def suite_dir_for(suite: Suite, directory: str | Path | None) -> Path:
    """``directory``; else the suite directory whose kept copy ``suite.toml`` this is; else ``suites/NAME``."""
    if directory:
        return Path(directory)
    if suite.path is not None and suite.path.name == "suite.toml" and (suite.path.parent / MANIFEST).is_file():
        return suite.path.parent
    return Path("suites") / suite.name


def check_directory(suite: Suite, out: Path, *, replace: bool = False) -> dict:
    """The manifest ``out`` already holds (``{}`` for none); another suite's is refused unless
    ``replace``, and then forgotten (its notes and recordings do not carry into this suite's report)."""
    from rllab.training.rundir import run_markers

    if out.exists() and not out.is_dir():
        raise SuiteError(f"--dir {out} is a file: a suite directory holds the suite's runs, suite.json and report; give a directory")
    found = run_markers(out) if out.is_dir() else []
    if found:
        raise SuiteError(
            f"{out} is a run directory ({', '.join(found)}): the suite's runs, suite.json and report would mix with that "
            f"run's files. Give another --dir (default: suites/{suite.name})"
        )
    path = out / MANIFEST
    if not path.is_file():
        return {}
    previous = json.loads(path.read_text())
    own_copy = suite.path is not None and suite.path.resolve() == (out / "suite.toml").resolve()
    if previous.get("name") == suite.name or own_copy:
        return previous
    if not replace:
        raise SuiteError(
            f"{out} holds suite {previous.get('name')!r}, not {suite.name!r}: running here would overwrite its suite.json, "
            f"suite.toml and report. Give another --dir (default: suites/{suite.name}), or --replace to make {out} "
            f"suite {suite.name!r}'s (the other suite's finished runs with the same config are reused)"
        )
    (out / "identical.json").unlink(missing_ok=True)
    shutil.rmtree(out / "replay", ignore_errors=True)
    return {}


def prebuild_models(cells: list[Cell], *, lab, console=None, starts_dir: Path | None = None) -> dict[int, str]:
    """Build each distinct warm-started tiny model once, before the workers start. A pinned start
    (``model.sha256``) found exported (``$RLLAB_STARTS``) is not built; one that is built is checked
    against its pin here, before any cell runs. Returns ``{warm-start seed: sha256}`` of the cells'
    starts (a suite with ``starts``); each built start is exported to ``starts_dir`` once per hash."""
    from rllab.models.forward import transformers_progress_bars_off

    with transformers_progress_bars_off():
        return _prebuild_models(cells, lab=lab, console=console, starts_dir=starts_dir)


def _prebuild_models(cells: list[Cell], *, lab, console=None, starts_dir: Path | None = None) -> dict[int, str]:
    from rllab import Component
    from rllab.models import tiny as tinymodel
    from rllab.config import COMPONENT_SECTIONS, load_config
    from rllab_suite.starts import export_start

    seen: dict[str, Path] = {}
    exported: dict[str, Path | None] = {}
    hashes: dict[int, str] = {}
    for c in cells:
        m = c.config["model"]
        if m.get("path"):
            continue
        pin = m.get("sha256")
        if pin and pin not in exported:
            exported[pin] = provenance.find_start(pin)
        if pin and exported[pin] is not None:  # shipped: the run begins from it, nothing to build
            if c.start is not None:
                hashes[c.start] = provenance.model_sha256(exported[pin])
            continue
        source = "env" if "env" in c.config else "task"
        key = json.dumps([m.get("tiny"), m.get("warm_start"), source, c.config[source], c.config.get("rollout", {}).get("system_prompt")], sort_keys=True, default=str)
        if key not in seen:
            cfg = load_config(c.config, lab=lab)
            ref = cfg.component(source)
            task = Component(spec=lab.spec(COMPONENT_SECTIONS[source][0], ref.name), config=ref.config)()
            if console is not None:
                which = "" if c.start is None else f", start {c.start} (warm-start seed {c.start})"
                console.print(f"[dim]warm start for task {c.task}{which} (cached after the first build)…[/]", highlight=False)
            seen[key] = tinymodel.get_or_build(tinymodel.TinyModelConfig(**cfg.model.tiny), task, ref.to_dict(), tinymodel.WarmStartConfig(**cfg.model.warm_start),
                                               progress=False, system_prompt=cfg.rollout.system_prompt)
        if c.start is None and not pin:
            continue
        where = f"starts: seed {c.start}, sha256" if c.start is not None else "model.sha256"
        sha = provenance.check_start(seen[key], pin, setting=where)  # a pin that does not hold is refused before any cell runs
        if c.start is None:
            continue
        hashes[c.start] = sha
        if starts_dir is not None:
            dest, copied = export_start(seen[key], sha, starts_dir)
            if copied and console is not None:
                console.print(f"start {c.start}: sha256 {sha} exported to {dest}", highlight=False)
    return hashes


def replays(lab, config: dict) -> bool:
    """Whether the resolved config's algorithm declares the trait replayable (``rllab replay`` runs its step)."""
    name = config.get("algorithm", {}).get("name")
    return name is not None and bool(lab.spec("algorithm", name).trait("replayable"))


def identical_variants(cells: list[Cell], *, lab, out_dir: Path, console=None) -> list[dict]:
    """Per task, record one batch from the first cell's config and replay every replayable variant's
    config (seed of that cell) on it; the pairs with the same gradients, as report notes."""
    from rllab_suite import replay

    found = []
    tasks = list(dict.fromkeys(c.task for c in cells))
    for task in tasks:
        first_seed = min(c.seed for c in cells if c.task == task)
        first_start = next(c.start for c in cells if c.task == task)  # with several starts, the check runs from the first
        failed = {c.variant for c in cells if (out_dir / "runs" / c.slug / "error.txt").is_file()}
        group = [c for c in cells if c.task == task and c.seed == first_seed and c.start == first_start and replays(lab, c.config) and c.variant not in failed]
        if len(group) < 2:
            continue
        rec_path = out_dir / "replay" / f"{_slug(task)}-{config_key(group[0].config)[:12]}.pt"  # a changed config records afresh
        # the pairs of a group already replayed on this recording are read back, not replayed again
        group_key = config_key({"variants": [[c.variant, config_key(c.config)] for c in group]})
        saved_path = rec_path.with_suffix(".json")
        saved = json.loads(saved_path.read_text()) if rec_path.is_file() and saved_path.is_file() else {}
        if saved.get("group") == group_key:
            pairs, step = saved["pairs"], saved["step"]
        else:
            if console is not None:
                console.print(f"[dim]checking for identical variants on task {task}: replaying {len(group)} variants on one recorded batch…[/]", highlight=False)
            data = replay.record(group[0].config, steps=RECORD_STEPS, out=rec_path, lab=lab) if not rec_path.is_file() else replay.load_record(rec_path)
            results = replay.replay_configs(data, [(c.variant, c.config) for c in group], lab=lab)
            pairs, step = replay.compare(results), data["step"]
            saved = {"group": group_key, "step": step, "pairs": pairs, "metrics": {r.name: r.metrics for r in results}}
            saved_path.write_text(json.dumps(saved, indent=2, default=str) + "\n")
        if pairs and all(p["inconclusive"] for p in pairs):
            found.append({"task": task, "identical": False, "message": (
                f"identical-variant check inconclusive on task {task}: the recorded batch scored alike in every group, "
                "so every variant's gradient is 0"
            )})
        for m in replay.identical_messages(pairs, step=step):
            m["task"] = task
            head = next(h for h in ("IDENTICAL ", "SAME UPDATE ON THE RECORDED BATCH ") if m["message"].startswith(h))
            m["message"] = m["message"].replace(head, f"{head}(task {task}) ", 1)
            found.append(m)
    return found


def shrink(suite: Suite, *, steps: int | None = None, seeds: int | None = None) -> Suite:
    """A smaller copy of ``suite``, to try it: every cell trains ``steps`` steps, on the first ``seeds``
    of its seeds. It is named ``NAME-try`` (its default directory, ``suites/NAME-try``, is its own:
    its cells are not the suite's)."""
    import attrs

    if steps is None and seeds is None:
        return suite
    if seeds is not None and seeds > len(suite.seeds):
        raise SuiteError(f"--seeds {seeds}: suite {suite.name!r} has {len(suite.seeds)} seed(s) ({', '.join(map(str, suite.seeds))})")
    return attrs.evolve(suite, name=f"{suite.name}-try", steps=suite.steps if steps is None else steps,
                        seeds=suite.seeds if seeds is None else suite.seeds[:seeds])


def plan(suite: Suite, directory=None, *, lab=None) -> tuple[list[Cell], Path, set[str]]:
    """The suite's cells (validated), its directory and the slugs of the cells already done there."""
    cells = expand(suite, lab=lab)
    out = suite_dir_for(suite, directory)
    done = {c.slug for c in cells if (out / "runs" / c.slug / "final.json").is_file()}
    return cells, out, done


def write_suite_provenance(out: Path, manifest: dict) -> Path:
    """``OUT/provenance.json`` for a suite result: the environment that ran it, and each cell's
    starting model and data (read from the cells' own records; a cell without one is listed as
    such), with the distinct starts by hash."""
    cells, starts = [], {}
    for c in manifest["cells"]:
        run = out / "runs" / c["run"]
        entry = {k: c[k] for k in ("variant", "task", "seed", "run")}
        try:
            rec = provenance.read(run)
        except RllabError:  # a cell run before runs kept one
            entry["provenance"] = None
            cells.append(entry)
            continue
        hashes = rec.get("hashes") or {}
        start = (hashes.get("start") or {}).get("sha256")
        entry.update(start=start, config=hashes.get("config"), data=[d["sha256"] for d in hashes.get("data", ())],
                     threads=((rec.get("machine") or {}).get("torch") or {}).get("threads"))  # a worker's own, not the suite process's
        if hashes.get("inputs"):  # the other inputs its components read by content (opd's local teacher)
            entry["inputs"] = {d.get("setting"): d.get("sha256") for d in hashes["inputs"]}
        cells.append(entry)
        if start:
            starts.setdefault(start, []).append(c["run"])
        if c.get("start") is not None:
            entry["start_seed"] = c["start"]
    seeds = start_hashes(manifest, cells)
    record = {"format": provenance.FORMAT, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **provenance.environment(),
              "starts": starts, **({"start_seeds": seeds} if manifest.get("starts") else {}), "cells": cells}
    return provenance.write(out, record)


def start_hashes(manifest: dict, cells: list[dict]) -> dict[str, list[str]]:
    """Per warm-start seed of a suite with ``starts``, the hashes its cells began from (one, unless
    a start was rebuilt differently, e.g. on another machine, between runs of the suite)."""
    out: dict[str, list[str]] = {str(s["seed"]): [] for s in manifest.get("starts", ())}
    for e in cells:
        if e.get("start_seed") is not None and e.get("start") and e["start"] not in out.setdefault(str(e["start_seed"]), []):
            out[str(e["start_seed"])].append(e["start"])
    return out


def pin_line(suite: Suite, hashes: dict[int, str]) -> str | None:
    """The ``starts = [...]`` line that pins a suite's unpinned starts to the hashes they were built with."""
    if not suite.starts or all(s.sha256 for s in suite.starts) or not all(s.sha256 or s.seed in hashes for s in suite.starts):
        return None
    items = ", ".join(f'{{ seed = {s.seed}, sha256 = "{s.sha256 or hashes[s.seed]}" }}' for s in suite.starts)
    return f"starts = [{items}]"


def run_suite(source, *, directory=None, executor_name: str = "local", workers: int | None = None, address: str | None = None, replace: bool = False,
              lab=None, console=None, progress: bool = True, check_identical: bool = True, steps: int | None = None,
              seeds: int | None = None) -> dict:
    """Expand, validate, run the missing cells and report. Returns the summary. ``steps``, ``seeds``:
    run a smaller copy of the suite (:func:`shrink`)."""
    from rich.console import Console

    from rllab import Lab

    if executor_name not in executor.EXECUTORS:
        raise RllabError(f"unknown executor {executor_name!r}; known: {', '.join(executor.EXECUTORS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise RllabError(f"workers must be a whole number of at least 1 (runs at a time), got {workers!r}; leave it out for one per core")
    if address is not None and executor_name != "ray":
        raise RllabError(f"--address {address} is a Ray cluster address: it needs --executor ray")
    if address is not None and workers is not None:
        raise RllabError(f"--workers {workers} does not apply with --address: the Ray cluster's CPUs decide how many runs go at a time")
    console = console or Console()
    lab = lab or Lab()
    suite = shrink(parse_suite(source), steps=steps, seeds=seeds)
    with _starts_searched(suite.starts_dir):
        return _run_suite(suite, directory=directory, executor_name=executor_name, workers=workers, address=address, replace=replace, lab=lab,
                          console=console, progress=progress, check_identical=check_identical)


class _starts_searched:
    """``$RLLAB_STARTS`` with ``directory`` first, while a suite runs (its workers inherit it): a
    pinned start exported there is where the cells begin."""

    def __init__(self, directory: Path | None):
        self.directory = directory

    def __enter__(self):
        self.before = os.environ.get(provenance.STARTS_ENV)
        if self.directory is not None:
            os.environ[provenance.STARTS_ENV] = os.pathsep.join([str(self.directory), *([self.before] if self.before else [])])

    def __exit__(self, *exc):
        if self.directory is None:
            return
        if self.before is None:
            os.environ.pop(provenance.STARTS_ENV, None)
        else:
            os.environ[provenance.STARTS_ENV] = self.before


def _run_suite(suite: Suite, *, directory, executor_name: str, workers, address, replace: bool, lab, console, progress: bool,
               check_identical: bool) -> dict:
    cells = expand(suite, lab=lab)  # every cell validated before anything runs
    out = suite_dir_for(suite, directory)
    if out.exists() and not out.is_dir():
        check_directory(suite, out)  # refuses the file, naming it
    # one process at a time runs a suite directory: two would run the same cells and rewrite suite.json
    created = not out.exists()
    lock = runlock.acquire(out, advice=SUITE_ADVICE)
    try:
        previous = check_directory(suite, out, replace=replace)
        (out / "runs").mkdir(parents=True, exist_ok=True)
        manifest = {"name": suite.name, "baseline": suite.baseline, "variants": suite.variant_names, "track": list(suite.track),
                    "controls": suite.controls, "compute": suite.compute, "claims": [c.to_dict() for c in suite.claims],
                    **({"starts": [s.to_dict() for s in suite.starts]} if suite.starts else {}),
                    "cells": [c.to_dict() for c in cells]}
        if suite.path is not None and suite.path.resolve() != (out / "suite.toml").resolve():
            shutil.copyfile(suite.path, out / "suite.toml")
            manifest["source_dir"] = str(suite.path.resolve().parent)  # where the copy's relative config paths point
        elif previous.get("source_dir"):
            manifest["source_dir"] = previous["source_dir"]
        manifest["load_average"] = previous.get("load_average", [])
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        todo = [c for c in cells if not (out / "runs" / c.slug / "final.json").is_file()]
        console.print(
            f"suite [bold]{suite.name}[/]: {len(suite.variants)} variants × {len(suite.tasks)} tasks × "
            + (f"{len(suite.starts)} starts × " if suite.starts else "") + f"{len(suite.seeds)} seeds = "
            f"{len(cells)} cells, {len(cells) - len(todo)} already done, {len(todo)} to run → {out}",
            highlight=False,
        )
        if todo:
            load_start = os.getloadavg()
            console.print(f"load average (1, 5, 15 min) at the start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} on {executor.cores()} cores", highlight=False)
            hashes = prebuild_models(todo, lab=lab, console=console, starts_dir=suite.starts_dir)
            line = pin_line(suite, hashes)
            if line:
                console.print(f"to start every rerun from these same weights, pin them in {suite.path or 'the suite file'}"
                              + (f" (with starts_dir, where they were exported)" if suite.starts_dir else "") + f":\n  {line}", highlight=False)
            n, threads = executor.plan_workers(workers, len(todo))
            if executor_name == "ray":
                console.print(f"executor ray ({address or 'a local instance'}), torch threads per run {threads}", highlight=False)
            else:
                console.print(f"executor local: {n} worker process(es) on {executor.cores()} core(s), torch threads per run {threads}", highlight=False)
            jobs = [{"key": c.key, "config": c.config, "run_dir": str((out / "runs" / c.slug).resolve()), "threads": threads, "what": f"{c.variant} on {c.task} seed {c.seed}"} for c in todo]
            bar = executor.Progress(len(jobs), console=console, enabled=progress)
            try:
                if executor_name == "ray":
                    executor.run_ray(jobs, workers=workers, progress=bar, describe=lambda j: j["what"], address=address)
                else:
                    executor.run_local(jobs, workers=n, progress=bar, describe=lambda j: j["what"])
            except KeyboardInterrupt:
                bar.close()
                console.print(f"[yellow]suite {suite.name} interrupted[/]: {_interrupted(todo, out)}", highlight=False)
                raise
            finally:
                bar.close()
            load_end = os.getloadavg()
            console.print(f"load average (1, 5, 15 min) at the end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}", highlight=False)
            manifest["load_average"].append({"cells": len(todo), "cores": executor.cores(), "start": list(load_start), "end": list(load_end)})
            (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        write_suite_provenance(out, manifest)  # the environment, and each cell's starting model by hash
        identical = []
        if check_identical:
            identical_path = out / "identical.json"
            try:
                arms = [c for c in cells if c.variant not in suite.controls]  # a control replays as its base: not a finding
                identical = identical_variants(arms, lab=lab, out_dir=out, console=console)
                identical_path.write_text(json.dumps(identical, indent=2, default=str) + "\n")
            except Exception as e:  # the check informs the report; it never sinks the suite's results
                console.print(f"[yellow]identical-variant check skipped: {type(e).__name__}: {e}[/]", highlight=False)
                identical = [{"identical": False, "message": f"identical-variant check skipped: {type(e).__name__}: {e}"}]
        return report_suite(out, console=console)
    finally:
        lock.release()
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # refused before it wrote anything


def _interrupted(todo: list[Cell], out: Path) -> str:
    """What an interrupt left of the cells that were to run, and how to continue."""
    from rllab.parallel.checkpoint import latest

    runs = [out / "runs" / c.slug for c in todo]
    finished = sum((r / "final.json").is_file() for r in runs)
    kept = sum(not (r / "final.json").is_file() and latest(r) is not None for r in runs)
    rest = len(runs) - finished - kept
    parts = [f"{finished} of {len(runs)} cells finished"] + [f"{kept} stopped at their last checkpoint"] * bool(kept)
    parts += [f"{rest} had no checkpoint yet (they start from the beginning)"] * bool(rest)
    return f"{', '.join(parts)}. Continue the suite with: rllab suite {out}"


def report_suite(directory, *, console=None) -> dict:
    """Recompute a suite directory's report from its manifest and run directories."""
    out = Path(directory)
    path = out / MANIFEST
    if not path.is_file():
        raise SuiteError(f"{out} is not a suite directory (no {MANIFEST}); run one with: rllab suite SUITE.toml --dir {out}")
    manifest = json.loads(path.read_text())
    from rllab_suite import report  # scipy: once the directory is known to be a suite's

    track = tuple(manifest.get("track", ()))
    records = [
        report.read_run(out / "runs" / c["run"], variant=c["variant"], task=c["task"], seed=c["seed"], track=track, start=c.get("start"))
        for c in manifest["cells"]
    ]
    identical = json.loads((out / "identical.json").read_text()) if (out / "identical.json").is_file() else []
    loads = [
        {"message": f"load average (1, 5, 15 min) while {la['cells']} cells ran on {la['cores']} cores: "
                    f"start {' '.join(f'{x:.2f}' for x in la['start'])}, end {' '.join(f'{x:.2f}' for x in la['end'])}"}
        for la in manifest.get("load_average", [])
    ]
    return report.write_all(records, out, title=f"suite {manifest['name']}", baseline=manifest.get("baseline"), variants=manifest["variants"], identical=identical + loads, console=console, track=track,
                            controls=tuple(manifest.get("controls", ())), compute=manifest.get("compute", "tokens"),
                            claims=tuple(verdicts.Claim(**c) for c in manifest.get("claims", ())))


def _refuse_repeated_runs(dirs: list[Path]) -> None:
    """One run directory named twice (or under two spellings: ``runs/a``, ``./runs/a/``, a link)
    would count as two seeds."""
    seen: dict[Path, Path] = {}
    for d in dirs:
        first = seen.setdefault(d.resolve(), d)
        if first is not d:
            spelled = f" (as {first} and as {d})" if str(first) != str(d) else ""
            raise RllabError(f"run directory {first} is given twice{spelled}: a comparison counts each run once")


def _check_out(out: Path) -> None:
    """``--out`` takes a directory of its own: a run's or a suite's would have its files (a run's
    ``curves.png``, a suite's ``report.md`` and ``summary.csv``) replaced by the comparison's."""
    from rllab.training.rundir import run_markers

    if out.exists() and not out.is_dir():
        raise RllabError(f"--out {out} is a file: the report is a directory (report.md, CSV, JSON, plots); choose another --out")
    if (out / MANIFEST).is_file():
        raise RllabError(
            f"--out {out} is a suite directory: the comparison would replace its report.md, CSV and plots "
            f"(rllab suite report {out} regenerates the suite's own); choose another --out"
        )
    found = run_markers(out) if out.is_dir() else []
    if found:
        raise RllabError(
            f"--out {out} is a run directory ({', '.join(found)}): the comparison would replace its curves.png and add "
            "its report beside the run's files; choose another --out"
        )


def _refuse_repeated_seeds(records: list) -> None:
    """Two run directories of one experiment (the same settings, task and seed: a copy, or a rerun)
    would be pooled as two seeds."""
    seen: dict[tuple, str] = {}
    for r in records:
        first = seen.setdefault((r.variant, r.task, r.seed), r.run_dir)
        if first != r.run_dir:
            raise RllabError(
                f"{first} and {r.run_dir} are the same experiment with the same seed ({r.variant} on {r.task}, train.seed = {r.seed}): "
                "a comparison counts each seed once; leave one of them out"
            )


def compare_runs(run_dirs: list, *, out: Path, baseline: str | None = None, console=None) -> dict:
    """The same report for loose run directories, grouped by the config keys on which they differ:
    the task's knobs make separate tasks (one table each), every other key separate variants; only
    the seed, the name and the output directory are pooled over."""
    dirs = [Path(d) for d in run_dirs]
    missing = [str(d) for d in dirs if not (d / "config.toml").is_file()]
    if missing:
        suites = [d for d in missing if (Path(d) / MANIFEST).is_file()]
        hint = f"; {', '.join(suites)} is a suite directory: its report comes from rllab suite report DIR" if suites else ""
        reports = [d for d in missing if (Path(d) / "report.md").is_file() and d not in suites]
        hint += f"; {', '.join(reports)} holds a comparison's report (rllab compare writes one there): leave it out" if reports else ""
        raise RllabError(f"not run directories (no config.toml): {', '.join(missing)}{hint}")
    _refuse_repeated_runs(dirs)
    _check_out(Path(out))
    from rllab_suite import report  # scipy: once the runs and --out are known to be right

    labels = report.label_runs(dirs)
    if baseline is not None and baseline not in labels:
        raise RllabError(f"--baseline {baseline!r} is not one of the groups: {', '.join(dict.fromkeys(labels))}")
    tasks = report.task_labels(dirs)
    records = [report.read_run(d, variant=lab_, task=task) for d, lab_, task in zip(dirs, labels, tasks)]
    _refuse_repeated_seeds(records)
    return report.write_all(records, out, title="compare", baseline=baseline, console=console)
