"""Running a suite's cells: a local process pool (default) or Ray, with one progress display.

Each cell runs :func:`rllab.trainer.run_experiment` into its own run directory; a directory that
holds ``config.toml`` but no ``final.json`` (an interrupted cell) is continued with
:func:`rllab.runs.resume_run` (one stopped after its final checkpoint is finished there). A cell that raises is recorded as failed (``error.txt`` in its run
directory, with the traceback) and the others go on. Worker output goes to ``RUN_DIR/log.txt``.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from pathlib import Path

EXECUTORS = ("local", "ray")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def plan_workers(requested: int | None, n_cells: int) -> tuple[int, int]:
    """(workers, torch threads per worker): one run per core by default, the cores shared out."""
    c = cores()
    workers = max(1, min(requested or c, n_cells or 1))
    return workers, max(1, c // workers)


def run_cell(job: dict) -> dict:
    """Run (or continue) one cell; never raises: returns ``{"status": "done"|"failed", ...}``."""
    import torch

    torch.set_num_threads(job.get("threads", 1))
    run_dir = Path(job["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.txt").unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(run_dir / "log.txt", "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            from rllab import Lab
            from rllab.config import load_config

            lab = Lab()
            if (run_dir / "config.toml").is_file() and not (run_dir / "final.json").is_file():
                from rllab.runs import resume_run

                summary = resume_run(run_dir, lab=lab, progress=False)
            else:
                from rllab.trainer import run_experiment

                cfg = load_config(job["config"], lab=lab)
                summary = run_experiment(cfg, lab=lab, run_dir=run_dir, progress=False)
            return {"key": job["key"], "status": "done", "summary": summary, "seconds": time.perf_counter() - t0}
        except BaseException as e:  # a crashed cell is a result, not the suite's end
            if isinstance(e, KeyboardInterrupt):
                raise
            tb = traceback.format_exc()
            (run_dir / "error.txt").write_text(f"{tb}\n{type(e).__name__}: {e}\n")
            return {"key": job["key"], "status": "failed", "error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}


class Progress:
    """One rich display for the whole suite: cells done / running / failed and an ETA."""

    def __init__(self, total: int, *, console, enabled: bool = True, label: str = "suite"):
        self.total, self.done, self.failed, self.running = total, 0, 0, 0
        self.console = console
        self.bar = None
        if enabled and total:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(
                TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), TextColumn("{task.description}"), console=console,
            )
            self.bar.start()
            self.task = self.bar.add_task(self._text(), total=total)

    def _text(self) -> str:
        s = f"running {self.running}"
        if self.failed:
            s += f"  [red]failed {self.failed}[/]"
        return s

    def started(self, n: int = 1) -> None:
        self.running += n
        self._update(0)

    def finished(self, result: dict, what: str) -> None:
        self.running -= 1
        if result["status"] == "failed":
            self.failed += 1
            self.console.print(f"[red]failed[/] {what}: {result['error']}", highlight=False)
        self.done += 1
        self._update(1)

    def _update(self, advance: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=advance, description=self._text())

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_local(jobs: list[dict], *, workers: int, progress: Progress, describe) -> list[dict]:
    """A process pool (spawned workers: torch and fork do not mix)."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    results = []
    if workers == 1:
        for job in jobs:
            progress.started()
            r = run_cell(job)
            progress.finished(r, describe(job))
            results.append(r)
        return results
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        pending = {}
        queue = list(jobs)
        while queue or pending:
            while queue and len(pending) < workers:
                job = queue.pop(0)
                pending[pool.submit(run_cell, job)] = job
                progress.started()
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                job = pending.pop(fut)
                try:
                    r = fut.result()
                except Exception as e:  # the worker process itself died
                    r = {"key": job["key"], "status": "failed", "error": f"worker died: {type(e).__name__}: {e}"}
                    Path(job["run_dir"]).mkdir(parents=True, exist_ok=True)
                    (Path(job["run_dir"]) / "error.txt").write_text(r["error"] + "\n")
                progress.finished(r, describe(job))
                results.append(r)
    return results


def run_ray(jobs: list[dict], *, workers: int | None, progress: Progress, describe, address: str | None = None) -> list[dict]:
    """Ray tasks, one CPU each (``ray.init(address=...)``; None starts a local instance)."""
    try:
        import ray
    except ImportError:
        from rllab import RllabError

        raise RllabError("--executor ray needs Ray: pip install 'rllab[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        kwargs = {"address": address} if address else {"num_cpus": workers or cores(), "include_dashboard": False, "log_to_driver": False}
        ray.init(**kwargs)
    remote = ray.remote(num_cpus=1, max_retries=0)(run_cell)
    results = []
    try:
        refs = {}
        for job in jobs:
            refs[remote.remote(job)] = job
            progress.started()
        waiting = list(refs)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            for ref in ready:
                job = refs[ref]
                try:
                    r = ray.get(ref)
                except Exception as e:
                    r = {"key": job["key"], "status": "failed", "error": f"ray task failed: {type(e).__name__}: {e}"}
                    (Path(job["run_dir"]) / "error.txt").write_text(r["error"] + "\n")
                progress.finished(r, describe(job))
                results.append(r)
    finally:
        if started_here:
            ray.shutdown()
    return results
