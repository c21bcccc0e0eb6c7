"""What the TUI shows, computed without Textual: the registry, a grid and the suite file it makes,
a suite directory's cells and their progress, and the ``rllab suite`` process that fills it.

Everything here reads the files a suite writes (``suite.json``, ``RUN_DIR/metrics.jsonl``,
``final.json``, ``error.txt``, ``log.txt``), so a suite directory shows the same whether its runs
were started from the TUI, from ``rllab suite`` in another terminal, or finished long ago.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import attrs

from rllab import RllabError
from rllab.config import COMPONENT_SECTIONS, load_config, parse_value
from rllab.records.tomlio import dump_toml
from rllab_suite import MANIFEST, expand, parse_suite, read_run, suite_dir_for, summarize, write_all

DEFAULT_STEP_SECONDS = 0.05
"""Seconds per step when no run has been measured yet (the default job on 2 CPU cores)."""
SPARK = "▁▂▃▄▅▆▇█"
LOG_NAME = "tui-suite.log"
"""Where the ``rllab suite`` process started from the TUI writes, in the suite directory."""

SECTION_OF_KIND = {kind: section for section, (kind, _) in COMPONENT_SECTIONS.items()}
"""A component kind → the config section that names it (``advantage_estimator`` → ``advantage``)."""


# --------------------------------------------------------------------------- registry


def registry(lab) -> dict[str, list]:
    """Every loaded component, grouped by kind (kinds in the kernel's order, names sorted)."""
    out: dict[str, list] = {}
    for spec in lab.specs():
        out.setdefault(spec.kind, []).append(spec)
    return out


def describe(spec) -> str:
    """A component as Rich markup: summary, provider, knobs with default, range and help, doc."""
    from rich.markup import escape

    lines = [f"[b]{escape(spec.name)}[/b]  [dim]{spec.kind}[/dim]", escape(spec.summary or "(no summary)"), ""]
    lines.append(f"provider: {escape(spec.provider)}" + (f" ({escape(spec.distribution)})" if spec.distribution else ""))
    section = SECTION_OF_KIND.get(spec.kind)
    if section:
        lines.append(f"config:   {section} = \"{escape(spec.name)}\"")
    if spec.aliases:
        lines.append(f"aliases:  {', '.join(spec.aliases)}")
    if spec.requires:
        lines.append(f"requires: {', '.join(spec.requires)}")
    try:
        knobs = spec.knobs()
    except Exception as e:  # a config class the kernel cannot read: say so, keep browsing
        lines += ["", f"[red]knobs unreadable: {escape(f'{type(e).__name__}: {e}')}[/red]"]
        knobs = []
    lines += ["", f"[b]knobs[/b] ({len(knobs)})" if knobs else "[b]knobs[/b]: none"]
    for k in knobs:
        allowed = f"  {escape(str(k.allowed))}" if k.allowed else ""
        lines.append(f"  [b]{escape(k.name)}[/b] = {escape(repr(k.default))}  [dim]{escape(k.type)}{allowed}[/dim]")
        if k.help:
            lines.append(f"      {escape(k.help)}")
    if spec.doc:
        lines += ["", "[b]doc[/b]", escape(spec.doc)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the grid


@attrs.define
class Grid:
    """A suite being built: a base preset, the budget, seeds, tasks and axes (docs/suites.md)."""

    name: str = "my_suite"
    preset: str = "grpo"
    steps: int = 100
    seeds: list = attrs.field(factory=lambda: [0, 1, 2])
    tasks: list = attrs.field(factory=lambda: ["addition"])
    baseline: str | None = None
    overrides: dict = attrs.field(factory=dict)
    variants: dict = attrs.field(factory=dict)
    axes: dict = attrs.field(factory=dict)
    other: dict = attrs.field(factory=dict)
    """Suite keys the builder does not edit (``config``, ``description``), kept as they are."""

    @classmethod
    def from_dict(cls, data: dict) -> "Grid":
        data = dict(data)
        seeds = data.pop("seeds", [0])
        g = cls(
            name=data.pop("name", "my_suite"), preset=data.pop("preset", None) or "", steps=data.pop("steps", 100),
            seeds=list(range(seeds)) if isinstance(seeds, int) else list(seeds), tasks=list(data.pop("tasks", ["addition"])),
            baseline=data.pop("baseline", None), overrides=dict(data.pop("overrides", {}) or {}),
            variants=dict(data.pop("variants", {}) or {}), axes=dict(data.pop("axes", {}) or {}),
        )
        g.other = data
        return g

    @classmethod
    def from_file(cls, path: str | Path) -> "Grid":
        try:
            return cls.from_dict(tomllib.loads(Path(path).read_text()))
        except tomllib.TOMLDecodeError as e:
            raise RllabError(f"{path}: not valid TOML: {e}") from None

    def to_dict(self) -> dict:
        data: dict[str, Any] = {"name": self.name}
        if self.preset:
            data["preset"] = self.preset
        data.update(self.other)
        data.update({"steps": self.steps, "seeds": list(self.seeds), "tasks": list(self.tasks)})
        if self.baseline:
            data["baseline"] = self.baseline
        for key in ("overrides", "variants", "axes"):
            if getattr(self, key):
                data[key] = dict(getattr(self, key))
        return data

    def to_toml(self) -> str:
        return "# a suite file (docs/suites.md); run it with: rllab suite FILE\n" + dump_toml(self.to_dict())

    def base_pairs(self, environments=()) -> list[tuple[str, Any]]:
        """The overrides every cell shares: the suite's, the first task's, the budget. A first
        task that names one of ``environments`` (registered environment names) selects ``env``,
        as a suite does."""
        pairs = list(self.overrides.items())
        if self.tasks:
            t = self.tasks[0]
            name, knobs = (t, {}) if isinstance(t, str) else (t["name"], {k: v for k, v in t.items() if k != "name"})
            section = "env" if name in environments else "task"
            pairs += [(section, name)] + [(f"{section}.{k}", v) for k, v in knobs.items()]
        return pairs + [("train.steps", self.steps)]


def parse_axis(text: str) -> tuple[str, list]:
    """``key = v1, v2`` (or a TOML list) → (key, values); a component axis is ``section = a, b``."""
    if "=" not in text:
        raise ValueError("an axis is key = value, value, … (advantage = grpo, rloo  or  policy_loss.clip_high = 0.2, 0.28)")
    key, raw = (s.strip() for s in text.split("=", 1))
    if not key:
        raise ValueError("the axis needs a key before '='")
    raw = raw.strip()
    if raw.startswith("["):
        values = parse_value(raw)
        if not isinstance(values, list):
            raise ValueError(f"cannot read {raw!r} as a list")
    else:
        values = [parse_value(v.strip()) for v in raw.split(",") if v.strip()]
    if not values:
        raise ValueError(f"axis {key!r} needs at least one value")
    return key, values


def parse_pairs(text: str) -> dict:
    """Space-separated ``key=value`` overrides → a dict of dotted keys."""
    out = {}
    for item in text.split():
        if "=" not in item:
            raise ValueError(f"{item!r}: an override is key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = parse_value(v.strip())
    return out


def check_axis(lab, grid: Grid, key: str, values: list) -> list[str]:
    """Each value of an axis on the grid's base config, validated as ``rllab run`` would; the
    problems, one per failing value."""
    problems = []
    for v in values:
        try:
            load_config(None, [*grid.base_pairs(frozenset(lab.names("environment"))), (key, v)], lab=lab,
                        preset=grid.preset or None)
        except RllabError as e:
            problems.append(f"{key}={v}: {e}")
    return problems


def expand_grid(lab, grid: Grid):
    """The grid's cells (every config validated), or raise the suite's error."""
    return expand(parse_suite(grid.to_dict()), lab=lab)


def step_seconds(*dirs: Path, limit: int = 60) -> tuple[float, int]:
    """Median seconds per step (training and evaluation) over the runs found under ``dirs``, and
    how many runs it rests on; ``DEFAULT_STEP_SECONDS`` when none is found."""
    per_run = []
    for d in dirs:
        if not d or not Path(d).is_dir():
            continue
        for m in sorted(Path(d).glob("**/metrics.jsonl"))[:limit]:
            s = _run_seconds_per_step(m)
            if s is not None:
                per_run.append(s)
    if not per_run:
        return DEFAULT_STEP_SECONDS, 0
    return statistics.median(per_run), len(per_run)


def _run_seconds_per_step(path: Path) -> float | None:
    total, steps = 0.0, 0
    try:
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            total += row.get("time/step", 0.0) + row.get("time/eval", 0.0)
            steps = max(steps, int(row.get("step", 0)))
    except (OSError, ValueError):
        return None
    return total / steps if steps and total > 0 else None


def estimate_seconds(cells: int, steps: int, per_step: float, workers: int) -> float:
    """Wall time of ``cells`` runs of ``steps`` steps on ``workers`` parallel workers."""
    workers = max(1, workers)
    return math.ceil(cells / workers) * steps * per_step


def fmt_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def sparkline(values: list, width: int = 12) -> str:
    """``values`` as a text sparkline (the last ``width`` points, scaled to [0, 1] for rates)."""
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)][-width:]
    if not vals:
        return ""
    lo, hi = min(min(vals), 0.0), max(max(vals), 1.0)
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5))] for v in vals)


def workers_default() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- a suite directory


@attrs.define
class CellView:
    """One cell of a suite as its run directory shows it, read incrementally."""

    variant: str
    task: str
    seed: int
    run_dir: Path
    total: int = 0
    status: str = "queued"
    """``queued`` (no run directory yet), ``running``, ``stopped`` (started, not running now),
    ``done`` or ``failed``."""
    step: int = 0
    reward: float = math.nan
    accuracy: float = math.nan
    accuracies: list = attrs.field(factory=list)
    rewards: list = attrs.field(factory=list)
    seconds: list = attrs.field(factory=list)
    last: dict = attrs.field(factory=dict)
    """The last metrics row of a training step."""
    error: str = ""
    _offset: int = 0

    @property
    def name(self) -> str:
        return f"{self.variant} · {self.task} · s{self.seed}"

    def refresh(self, running: bool) -> None:
        d = self.run_dir
        metrics = d / "metrics.jsonl"
        if metrics.is_file():
            with metrics.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
            self._offset += end
            for line in chunk[:end].decode(errors="replace").splitlines():
                try:
                    row = json.loads(line) if line.strip() else {}
                except ValueError:
                    continue
                if "eval/accuracy" in row:
                    self.accuracy = row["eval/accuracy"]
                    self.accuracies.append(row["eval/accuracy"])
                if "rollout/reward" in row:
                    self.step = max(self.step, int(row.get("step", 0)))
                    self.reward = row["rollout/reward"]
                    self.rewards.append(row["rollout/reward"])
                    self.last = row
                    if "time/step" in row:
                        self.seconds.append(row["time/step"])
        if not self.total and (d / "config.toml").is_file():
            try:
                self.total = int(tomllib.loads((d / "config.toml").read_text()).get("train", {}).get("steps", 0))
            except (OSError, tomllib.TOMLDecodeError, ValueError):
                pass
        if (d / "final.json").is_file():
            self.status, self.error = "done", ""
        elif (d / "error.txt").is_file():
            self.status = "failed"
            lines = (d / "error.txt").read_text(errors="replace").strip().splitlines()
            self.error = lines[-1] if lines else "failed"
        elif d.is_dir():
            self.status = "running" if running else "stopped"
        else:
            self.status = "queued"

    def reset(self) -> None:
        """Forget what was read (the run directory was replaced)."""
        self._offset, self.step, self.accuracies, self.rewards, self.seconds, self.last = 0, 0, [], [], [], {}
        self.reward = self.accuracy = math.nan

    def log_tail(self, lines: int = 200) -> list[str]:
        for name in ("error.txt", "log.txt"):
            p = self.run_dir / name
            if p.is_file() and (name == "log.txt" or self.status == "failed"):
                return p.read_text(errors="replace").splitlines()[-lines:]
        return []


class SuiteDir:
    """A suite directory and the suite file that fills it (either may be given)."""

    def __init__(self, lab, *, file: str | Path | None = None, directory: str | Path | None = None):
        self.lab = lab
        self.file = Path(file) if file else None
        if self.file is None and directory and (Path(directory) / "suite.toml").is_file():
            self.file = Path(directory) / "suite.toml"
        if self.file is not None:
            suite = parse_suite(self.file)
            self.directory = suite_dir_for(suite, directory)
        elif directory and (Path(directory) / MANIFEST).is_file():
            self.directory = Path(directory)
        else:
            raise RllabError(f"{directory}: not a suite directory (no suite.toml or {MANIFEST}); open a suite file instead")
        self.cells: list[CellView] = []
        self.load()

    def load(self) -> None:
        """(Re)read the cells: from the suite file (validated), else from the directory's manifest."""
        old = {c.run_dir: c for c in self.cells}
        if self.file is not None:
            suite = parse_suite(self.file)
            self.name, self.baseline, self.variants = suite.name, suite.baseline, suite.variant_names
            self.controls, self.compute = tuple(suite.controls), suite.compute
            cells = [(c.variant, c.task, c.seed, c.slug, c.config["train"]["steps"]) for c in expand(suite, lab=self.lab)]
        else:
            m = json.loads((self.directory / MANIFEST).read_text())
            self.name, self.baseline, self.variants = m["name"], m.get("baseline"), m["variants"]
            self.controls, self.compute = tuple(m.get("controls", ())), m.get("compute", "tokens")
            cells = [(c["variant"], c["task"], c["seed"], c["run"], 0) for c in m["cells"]]
        self.cells = []
        for variant, task, seed, slug, total in cells:
            run_dir = self.directory / "runs" / slug
            self.cells.append(old.get(run_dir) or CellView(variant=variant, task=task, seed=seed, run_dir=run_dir, total=total))
        self.refresh(False)

    def refresh(self, running: bool) -> bool:
        """Read what changed; True when a cell finished or failed since the last call."""
        before = [c.status for c in self.cells]
        for c in self.cells:
            c.refresh(running)
        after = [c.status for c in self.cells]
        return [s in ("done", "failed") for s in before] != [s in ("done", "failed") for s in after]

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("queued", "running", "stopped", "done", "failed")}
        for c in self.cells:
            out[c.status] += 1
        return out

    def progress(self, workers: int) -> tuple[float, float]:
        """(fraction of the suite's steps done, seconds left at the measured pace)."""
        total = sum(c.total or 1 for c in self.cells)
        done = sum((c.total or 1) if c.status in ("done", "failed") else min(c.step, c.total or c.step) for c in self.cells)
        measured = [s for c in self.cells for s in c.seconds[-20:]]
        per_step = statistics.median(measured) if measured else step_seconds(self.directory)[0]
        left = total - done
        return (done / total if total else 1.0), left * per_step / max(1, min(workers, sum(c.status not in ("done", "failed") for c in self.cells) or 1))

    def records(self) -> list:
        return [read_run(c.run_dir, variant=c.variant, task=c.task, seed=c.seed) for c in self.cells]

    def identical(self) -> list:
        p = self.directory / "identical.json"
        return json.loads(p.read_text()) if p.is_file() else []

    def summary(self) -> dict:
        """rllab_suite's statistics of the cells as they stand."""
        return summarize(self.records(), baseline=self.baseline, variants=self.variants, controls=self.controls)

    def export(self) -> dict:
        """rllab_suite's report writer: report.md, summary.csv/json, runs.csv, curves.png, final.png."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return write_all(self.records(), self.directory, title=f"suite {self.name}", baseline=self.baseline,
                                variants=self.variants, identical=self.identical(), controls=self.controls, compute=self.compute)

    def add_seeds(self, n: int = 1) -> list[int]:
        """Append ``n`` seeds to the suite file (the next run of the suite runs just those)."""
        if self.file is None:
            raise RllabError(f"{self.directory} has no suite.toml to add seeds to")
        grid = Grid.from_file(self.file)
        nxt = max(grid.seeds, default=-1) + 1
        grid.seeds = [*grid.seeds, *range(nxt, nxt + n)]
        self.file.write_text(grid.to_toml())
        self.load()
        return grid.seeds


class Runner:
    """The ``rllab suite FILE --dir DIR -q`` process that fills a suite directory.

    It runs in its own process group so that stopping it (SIGINT, then SIGKILL) stops its
    workers too; what it was running stays resumable: ``rllab suite`` continues it next time.
    """

    def __init__(self, suite: SuiteDir, *, workers: int | None = None, plugins: list[str] = (), identical_check: bool = True):
        self.suite, self.workers, self.plugins, self.identical_check = suite, workers, list(plugins), identical_check
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def command(self) -> list[str]:
        if self.suite.file is None:
            raise RllabError(f"{self.suite.directory} has no suite.toml: it cannot be run from here")
        cmd = [sys.executable, "-m", "rllab.cli", "suite", str(self.suite.file), "--dir", str(self.suite.directory), "-q"]
        if self.workers:
            cmd += ["--workers", str(self.workers)]
        if not self.identical_check:
            cmd.append("--no-identical-check")
        for p in self.plugins:
            cmd += ["--plugin", p]
        return cmd

    def start(self) -> None:
        if self.running:
            return
        cmd = self.command()
        self.suite.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.suite.directory / LOG_NAME, "a")
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.started_at = time.monotonic()

    def stop(self, timeout: float = 10.0) -> None:
        if not self.running:
            return
        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def log_tail(self, lines: int = 30) -> list[str]:
        p = self.suite.directory / LOG_NAME
        return p.read_text(errors="replace").splitlines()[-lines:] if p.is_file() else []
