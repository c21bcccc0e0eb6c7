"""Ctrl-C during ``rllab suite``: the suite stops within seconds with exit code 130, no worker is
left running, every interrupted cell keeps its last checkpoint, the console says how to continue,
and continuing finishes the suite.

Before: a SIGINT to the suite process alone (``kill -INT PID``) interrupted the parent while its
pool's workers, which got no signal, trained on; leaving the pool waited for their cells to end.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllab.records.tomlio import dump_toml
from rllab_suite import executor
from tests.tiny import TINY


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _stubborn(ready) -> None:
    """A process that ignores SIGINT (as a worker stuck in a long native call would, for a while)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def _sleeper(ready) -> None:
    # a process inherits an ignored SIGINT (a background job of a non-interactive shell) and the
    # spawning thread's signal mask; the suite's workers install their own handler (executor._init_worker)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # nor blocked, by a mask the spawning thread had
    try:
        ready.set()
        time.sleep(60)
    except KeyboardInterrupt:
        pass


def test_stop_processes_interrupts_then_kills_what_does_not_stop():
    ctx = mp.get_context("spawn")
    events = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_sleeper, args=(events[0],)), ctx.Process(target=_stubborn, args=(events[1],))]
    for p in procs:
        p.start()
    for e in events:
        assert e.wait(30)
    t0 = time.monotonic()
    executor.stop_processes(procs, grace=6.0)  # room for a loaded machine (load 10 on 2 cores) to let the sleeper exit on its own
    assert time.monotonic() - t0 < 12.0
    assert not any(p.is_alive() for p in procs)
    assert procs[0].exitcode == 0  # stopped by the interrupt
    assert procs[1].exitcode == -signal.SIGKILL  # killed once the grace ran out


def _group(pgid: int) -> list[str]:
    """The live processes of process group ``pgid``: ``pid command`` each."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, …
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(f"{d.name} {(d / 'cmdline').read_text().replace(chr(0), ' ')[:120]}")
        except (OSError, ValueError):
            continue
    return found


def _suite_file(tmp_path: Path) -> Path:
    """Two cells of 60 steps, a checkpoint after every step."""
    f = tmp_path / "suite.toml"
    f.write_text(dump_toml({
        "name": "ctrlc", "preset": "grpo", "steps": 60, "seeds": 1, "tasks": ["addition"],
        "overrides": {**TINY, "train.checkpoint_every": 1, "train.eval_every": 0},
        "variants": {"grpo": {}, "rloo": {"advantage": "rloo"}},
    }))
    return f


def _start_suite(tmp_path: Path, out: Path, log: Path) -> subprocess.Popen:
    """``rllab suite`` with two workers, in a process group of its own (as a shell runs a command)."""
    cmd = [sys.executable, "-m", "rllab", "suite", str(_suite_file(tmp_path)), "--dir", str(out), "--workers", "2", "-q", "--no-identical-check"]
    with log.open("w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_for_a_checkpoint(proc: subprocess.Popen, out: Path, log: Path) -> None:
    deadline = time.monotonic() + 240
    while not list(out.glob("runs/*/checkpoints/latest")):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "no cell wrote a checkpoint"
        time.sleep(0.1)


def _left_running(pgid: int, seconds: float) -> list[str]:
    """The group's live processes once it is empty or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while (left := _group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.slow
def test_workers_of_a_killed_suite_stop_on_their_own(tmp_path):
    """SIGKILL to the suite process (no chance to stop its workers): they notice and end."""
    out, log = tmp_path / "s", tmp_path / "console.txt"
    proc = _start_suite(tmp_path, out, log)
    try:
        _wait_for_a_checkpoint(proc, out, log)
        proc.kill()
        proc.wait(10)
        left = _left_running(proc.pid, 1.0 + executor.STOP_GRACE_S + 5.0)
    finally:
        for line in _group(proc.pid):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, f"left running: {left}"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["parent", "group", "twice"])
def test_ctrl_c_stops_the_suite_and_its_workers_and_the_suite_continues(tmp_path, how):
    """``parent``: ``kill -INT PID``; ``group``: a terminal's Ctrl-C (the whole process group);
    ``twice``: Ctrl-C pressed again while the suite stops."""
    out, log = tmp_path / "s", tmp_path / "console.txt"
    proc = _start_suite(tmp_path, out, log)
    try:
        _wait_for_a_checkpoint(proc, out, log)
        t0 = time.monotonic()
        if how == "parent":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
            if how == "twice":
                time.sleep(0.5)
                os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(30)
        stopped_in = time.monotonic() - t0
        left = _left_running(proc.pid, 5.0)  # multiprocessing's resource tracker leaves once every worker has
    finally:
        for line in _group(proc.pid):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    text = log.read_text()
    print(f"{how}: exit {rc} {stopped_in:.1f} s after the SIGINT (load {os.getloadavg()[0]:.2f})")
    assert rc == 130, text
    assert stopped_in < executor.STOP_GRACE_S + 10.0, f"stopped after {stopped_in:.1f} s"  # measured 1-7 s at load 3-5 on 2 cores
    assert not left, f"left running: {left}"
    assert "stopped at their last checkpoint" in text and f"Continue the suite with: rllab suite {out}" in text.replace("\n", "")
    runs = sorted((out / "runs").iterdir())
    unfinished = [r for r in runs if not (r / "final.json").is_file()]
    assert unfinished, "every cell finished before the interrupt: nothing was tested"
    started = [r for r in unfinished if (r / "config.toml").is_file()]  # one stopped before its first step is undone
    assert started and all((r / "checkpoints" / "latest").is_file() for r in started)
    kept = {r: _rows_up_to_checkpoint(r) for r in started}
    again = subprocess.run([sys.executable, "-m", "rllab", "suite", str(out), "--workers", "2", "-q", "--no-identical-check"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all((r / "final.json").is_file() for r in runs)
    for r, rows in kept.items():  # continued from the checkpoint: the rows before it are the first run's (their timings too)
        assert (r / "metrics.jsonl").read_text().splitlines()[: len(rows)] == rows


def _rows_up_to_checkpoint(run: Path) -> list[str]:
    step = int((run / "checkpoints" / "latest").read_text().strip().rpartition("_")[2])
    rows = [line for line in (run / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= step]
    assert rows and json.loads(rows[-1])["step"] == step
    return rows
