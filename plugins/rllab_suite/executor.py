"""Running a suite's cells: a local process pool (default) or Ray, with one progress display.

Each cell runs :func:`rllab.training.trainer.run_experiment` into its own run directory; a directory that
holds ``config.toml`` but no ``final.json`` (an interrupted cell) is continued with
:func:`rllab.training.runs.resume_run` (one stopped after its final checkpoint is finished there). A cell that raises is recorded as failed (``error.txt`` in its run
directory, with the traceback) and the others go on. Worker output goes to ``RUN_DIR/log.txt``.

Ctrl-C (SIGINT to the suite process alone, as ``kill -INT``, or to its whole process group, as a
terminal sends it) stops the suite within seconds: the running cells are interrupted (each keeps its
last checkpoint and is continued by the next ``rllab suite``), workers that do not stop within
:data:`STOP_GRACE_S` are killed, and :class:`KeyboardInterrupt` goes on to the caller. A worker
takes the first SIGINT it gets as the interrupt and ignores the rest, so the parent's own signal
and the terminal's do not cut its cleanup short; one whose suite process is gone interrupts itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from pathlib import Path

from rllab import MissingExtraError, RllabError
from rllab.training import runlock

EXECUTORS = ("local", "ray")
STOP_GRACE_S = 5.0
"""Seconds an interrupted worker has to stop (its trainer closes its backend) before it is killed."""


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
    t0 = time.perf_counter()
    try:  # a cell another process is writing (an `rllab run --resume` of it) is left to it: not even its log is touched
        runlock.acquire(run_dir).release()
    except RllabError as e:
        return {"key": job["key"], "status": "failed", "error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.txt").unlink(missing_ok=True)
    with open(run_dir / "log.txt", "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            from rllab import Lab
            from rllab.config import load_config

            lab = Lab()
            if (run_dir / "config.toml").is_file() and not (run_dir / "final.json").is_file():
                from rllab.training.runs import resume_run

                summary = resume_run(run_dir, lab=lab, progress=False)
            else:
                from rllab.training.trainer import run_experiment

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
            self.bar = None


def _ignore(signum, frame) -> None:
    """A no-op handler (unlike ``SIG_IGN``, no program the worker starts inherits it)."""


def _interrupt_once(signum, frame) -> None:
    """A worker's SIGINT handler: the first one interrupts the cell, later ones are ignored.
    (SIGTERM keeps its default: the pool ends a worker with it when another died.)"""
    signal.signal(signal.SIGINT, _ignore)
    raise KeyboardInterrupt


def _watch_parent(parent: int) -> None:
    """Interrupt this worker when the suite process is gone (killed without stopping its workers),
    and end it :data:`STOP_GRACE_S` later: with no parent to send it work, it would wait for ever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(STOP_GRACE_S)
    os._exit(1)


def _init_worker(parent: int) -> None:
    signal.signal(signal.SIGINT, _interrupt_once)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="rllab-suite-parent-watch").start()


def stop_processes(procs, *, grace: float = STOP_GRACE_S) -> None:
    """Interrupt ``procs`` (``multiprocessing.Process``), give them ``grace`` seconds, then kill the
    rest; a second Ctrl-C while waiting kills them at once. None is left running on return."""
    procs = [p for p in procs if p.is_alive()]
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGINT)
    try:
        deadline = time.monotonic() + grace
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:  # the grace ran out, or a second Ctrl-C came
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5.0)


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
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(os.getpid(),))
    try:
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
    except BaseException:  # Ctrl-C (or a failure here): the workers' cells stop too, none is left running
        procs = list((getattr(pool, "_processes", None) or {}).values())  # the pool's workers (it has no public accessor)
        pool.shutdown(wait=False, cancel_futures=True)
        stop_processes(procs)
        raise
    pool.shutdown()
    return results


def run_ray(jobs: list[dict], *, workers: int | None, progress: Progress, describe, address: str | None = None) -> list[dict]:
    """Ray tasks, one CPU each (``ray.init(address=...)``; None starts a local instance)."""
    try:
        import ray
    except ImportError:
        from rllab import RllabError

        raise MissingExtraError("--executor ray needs Ray: pip install 'rllab[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        kwargs = {"address": address} if address else {"num_cpus": workers or cores(), "include_dashboard": False, "log_to_driver": False}
        ray.init(**kwargs)
    remote = ray.remote(num_cpus=1, max_retries=0)(run_cell)
    results, refs = [], {}
    try:
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
    except KeyboardInterrupt:  # the running tasks get a KeyboardInterrupt too (a cluster's would run on)
        for ref in refs:  # a finished one is left as it is
            ray.cancel(ref)
        raise
    finally:
        if started_here:
            ray.shutdown()
    return results
