"""One writer per run directory: an exclusive lock held for a run's lifetime.

Two processes writing one run directory would interleave their rows in ``metrics.jsonl`` and race
on its checkpoints and ``final.json``. Every entry point that writes a run directory
(:func:`rllab.training.runs.run_experiment`, :func:`rllab.training.runs.resume_run`, and through them ``rllab run``
and ``rllab suite``'s cells) first takes :func:`acquire` on it: an ``fcntl.flock`` on
``RUN_DIR/.rllab.lock``, which records the holder (pid, host, command). A second process is
refused with :class:`RunDirInUseError`, naming the directory and the holder's pid.

The kernel releases a ``flock`` when its holder exits, however it exits (``kill -9`` included): a
lock file left behind by a dead process is stale and does not block. Under ``torchrun`` only
rank 0, the rank that writes the run's files, holds the lock. Code that drives a
:class:`rllab.training.trainer.Trainer` itself takes the same lock with ``with acquire(run_dir): ...``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

import attrs

from rllab.errors import RllabError

LOCK_FILE = ".rllab.lock"
"""In the run directory: the lock, and who holds it (JSON: pid, host, started, command)."""


class RunDirInUseError(RllabError):
    """Another process is writing the run directory (it holds its lock)."""


@attrs.define
class RunLock:
    """A held run-directory lock; :meth:`release` (or the end of a ``with`` block, or the
    process's exit) gives it up."""

    path: Path
    fd: int | None

    def release(self) -> None:
        """Remove the lock file (only while it is still this lock's) and unlock; idempotent."""
        if self.fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)
        except OSError:
            pass  # the directory is gone (a run that failed before its first step removes it)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder(run_dir: Path) -> dict:
    """What the lock file of ``run_dir`` says about its holder (``{}`` when unreadable)."""
    try:
        data = json.loads((Path(run_dir) / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(run_dir: Path) -> str:
    """``pid 123 on host h, started …, running `rllab run …``` (what is known of it)."""
    info = holder(run_dir)
    if "pid" not in info:
        return "a process that has not recorded its pid yet"
    text = f"pid {info['pid']}"
    if info.get("host") and info["host"] != socket.gethostname():
        text += f" on host {info['host']}"
    if info.get("started"):
        text += f", started {info['started']}"
    if info.get("command"):
        text += f", running `{info['command']}`"
    return text


RUN_ADVICE = ("For a new run choose another --run-dir; otherwise wait for that run to end, or {stop}, and if it did not "
              "finish continue it with: rllab run --resume {dir}")
"""What a refused run is told to do (``{stop}``: how to stop the holder, ``{dir}``: the directory)."""


def acquire(run_dir: Path, *, advice: str = RUN_ADVICE) -> RunLock:
    """Take the exclusive lock of ``run_dir`` (created if missing) for this process, or raise
    :class:`RunDirInUseError` naming the directory, the process that holds it and ``advice``
    (a template: ``{stop}``, ``{dir}``). Another directory whose files one process at a time
    must write (a suite's) is locked the same way.

    The lock file is checked to still be the one at its path once locked (a holder removes it
    when it releases), so two processes never both believe they hold it. A file system without
    ``flock`` support is warned about and the run goes on unlocked.
    """
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RllabError(f"cannot create the directory {run_dir} ({e.strerror or e}): choose one this process can write") from None
    path = run_dir / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RllabError(
                f"cannot open {path}, the lock that keeps a second process out of {run_dir} ({e.strerror or e}): "
                f"{'remove that directory' if path.is_dir() else 'choose a directory this process can write'}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            who, info = describe_holder(run_dir), holder(run_dir)
            elsewhere = f" on host {info['host']}" if info.get("host") not in (None, socket.gethostname()) else ""
            stop = f"stop it with `kill {info['pid']}`{elsewhere}" if "pid" in info else "stop it"
            raise RunDirInUseError(
                f"{run_dir} is in use by another rllab process ({who}): two processes writing one directory would mix "
                f"their metrics and race on its checkpoints. {advice.format(stop=stop, dir=run_dir)}"
            ) from None
        except OSError as e:
            os.close(fd)
            warnings.warn(f"{run_dir}: the file system does not support locks ({e}); nothing stops a second process "
                          f"from writing this run directory at the same time", stacklevel=2)
            return RunLock(path=path, fd=None)
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # released and removed by its holder between our open and our lock: take the new one
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": _command()}
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(info) + "\n").encode())
    return RunLock(path=path, fd=fd)


def _command() -> str:
    """This process's command line, as typed (``rllab run …`` also when started as ``python -m rllab``)."""
    argv = list(sys.argv) or ["?"]
    if Path(argv[0]).name in ("rllab", "__main__.py"):
        argv[0] = "rllab"
    return " ".join(argv)


def carry_into(lock_file: Path, new_dir: Path) -> None:
    """Give ``new_dir`` (a directory about to replace the locked one) the same lock file — a
    second name of the same, still locked, file — so the replacement is never unlocked."""
    if lock_file.is_file():
        os.link(lock_file, Path(new_dir) / LOCK_FILE)
