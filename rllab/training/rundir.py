"""Run directories: what a run records about itself (``config.toml``), claiming a directory for a
new run (:func:`start_run`), and the note on whether and how a stopped run can be continued.

``RUN_DIR/config.toml`` is the experiment with every knob's value (defaults included), the extra
plugins it loaded and, under ``[provenance]``, the versions that ran it: ``rllab run
RUN_DIR/config.toml`` reproduces the run, and ``rllab run --resume RUN_DIR`` continues it from its
last checkpoint (:mod:`rllab.training.runs`).

A new run never starts in a directory that already holds one (:func:`prepare_run_dir`): its
metrics would mix with the old run's and its checkpoints and ``final.json`` would be overwritten.
``--overwrite`` replaces the old run first (the whole directory, by one rename, so a crash leaves
either the old run or the new one, never a mix); an empty or unrelated directory is used as it is.

No two processes write one run directory: a run holds its lock (:mod:`rllab.training.runlock`; under
``torchrun``, rank 0 holds it) from before the directory is prepared until the run ends, and a
second run or ``--resume`` there is refused, naming the holder's pid.

A run that stops on an error says whether it can be continued (:func:`note_how_to_continue`): from
which checkpoint, with which ``--resume`` command, or that nothing was saved and it must be
started again.
"""

from __future__ import annotations

import os
import shutil
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

import torch

from rllab.parallel import checkpoint
from rllab.parallel import distributed
from rllab.training import runlock
from rllab.errors import ConfigError, RllabError

CONFIG_FILE = "config.toml"
EVAL_PROBLEMS_FILE = "eval_problems.jsonl"
"""Each held-out evaluation per problem, one JSON line per evaluation: ``step``, greedy ``solved`` (0/1) and
``reward`` in the held-out order, and with ``train.eval_samples`` the ``sampled_correct`` counts of ``samples``."""

DEPLOYMENT_SETTINGS = (
    # where the rollout servers are and how they are reached (the sglang backend)
    "backend.urls", "backend.admin_urls", "backend.launch", "backend.launch_command", "backend.launch_args",
    "backend.launch_timeout_s", "backend.timeout_s", "backend.max_in_flight", "backend.retries",
    "backend.abort_retries", "backend.backoff_s", "backend.sync_dir", "backend.weight_sync",
    "backend.distributed_backend", "backend.distributed_address", "backend.distributed_port",
    # device placement, within one kind of device (DEVICE_SETTINGS)
    "backend.device", "model.device", "model.reference_device",
)
"""Settings an ``--resume`` may also change, because they say where and how the run executes, not
what it computes: a server that came back on another address, a longer timeout, another GPU.
Each change is recorded (:data:`rllab.training.runs.RESUME_LOG`) and written into ``config.toml``, so a later
``--resume`` uses it. Left out on purpose: what alters the samples or the arithmetic — the
request batching (``backend.prompts_per_request``, ``backend.max_batch_size``), the CPU thread
count (``backend.num_threads``: reductions split differently), the dtype on the wire
(``backend.distributed_dtype``) — and a device of another kind (:data:`DEVICE_SETTINGS`)."""

DEVICE_SETTINGS = ("backend.device", "model.device", "model.reference_device")
"""Placement settings: they may move the run to another device of the same kind (``cuda:0`` →
``cuda:1``), not between kinds (CPU ↔ CUDA: other kernels, other numerics)."""

def recorded_config(cfg, lab) -> dict:
    """The config as the run directory records it: every knob, the plugins, the versions."""
    import platform

    import transformers

    from rllab.lab import __version__

    data = cfg.to_dict()
    extra = [p.name for p in lab.plugins if p.ok and p.source in ("file", "module")]
    plugins = list(dict.fromkeys([*cfg.plugins, *extra]))
    if plugins:
        data = {**{k: v for k, v in data.items() if k in ("name", "output_dir")}, "plugins": plugins, **data}
    data["provenance"] = {
        "rllab": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "plugins": [
            {"name": p.name, "source": p.source, **({"distribution": p.distribution} if p.distribution else {}), **({"version": p.version} if p.version else {})}
            for p in lab.plugins
            if p.ok
        ],
    }
    return data


RUN_MARKERS = (CONFIG_FILE, "final.json", checkpoint.CHECKPOINTS, "metrics.jsonl")
"""What a run writes into its directory; any of them there means the directory holds a run."""


def run_markers(run_dir: Path) -> list[str]:
    """The :data:`RUN_MARKERS` present in ``run_dir`` (an empty ``metrics.jsonl`` does not count)."""
    run_dir = Path(run_dir)
    found = []
    for name in RUN_MARKERS:
        p = run_dir / name
        if p.is_dir() or (p.is_file() and (name != "metrics.jsonl" or p.stat().st_size > 0)):
            found.append(name)
    return found


def _recorded_by_a_run(path: Path) -> bool:
    """Whether ``path`` is a ``config.toml`` a run wrote (it carries a ``[provenance]`` table)."""
    try:
        return isinstance(tomllib.loads(path.read_text()).get("provenance"), dict)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def prepare_run_dir(run_dir: Path, *, overwrite: bool = False) -> Path:
    """Make ``run_dir`` ready for a new run: absent or empty (or holding no run) is fine; a
    directory that holds a run is refused, or with ``overwrite`` replaced by an empty one.

    Only a directory whose ``config.toml`` a run wrote (it has ``[provenance]``) is ever removed.
    The old directory is renamed aside in one step and then deleted, so an interruption leaves
    the old run whole (or a hidden ``.NAME.replaced`` beside the new one), never a mix of two runs.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RllabError(f"run directory {run_dir} is a file, not a directory: choose another --run-dir")
    found = run_markers(run_dir) if run_dir.is_dir() else []
    if not found:
        return run_dir
    cfg = run_dir / CONFIG_FILE
    is_run = cfg.is_file() and _recorded_by_a_run(cfg)
    if found == [CONFIG_FILE] and not is_run:
        raise RllabError(
            f"{cfg} is not a config a run recorded (no [provenance]); a run writes its own {CONFIG_FILE} into its "
            f"directory and would replace this file: choose another --run-dir"
        )
    if not is_run:
        raise RllabError(
            f"{run_dir} holds {', '.join(found)} but no {CONFIG_FILE} recorded by a run: it does not look like a run "
            f"directory, so it is neither reused nor removed; choose another --run-dir"
        )
    if not overwrite:
        raise RllabError(
            f"{run_dir} already holds a run ({', '.join(found)}): a new run there would append to its metrics and "
            f"overwrite its checkpoints and final.json. Continue it with: rllab run --resume {run_dir} (train.steps=N "
            f"extends it); replace it with --overwrite; or choose another --run-dir"
        )
    here = Path.cwd().resolve()
    target = run_dir.resolve()
    if here == target or target in here.parents:
        raise RllabError(f"--overwrite would remove {run_dir}, which holds the current directory: run from elsewhere")
    aside = target.with_name(f".{target.name}.replaced")
    fresh = target.with_name(f".{target.name}.new")
    for left in (aside, fresh):  # left by an interrupted replacement
        shutil.rmtree(left, ignore_errors=True)
    fresh.mkdir()
    runlock.carry_into(target / runlock.LOCK_FILE, fresh)  # the replacement is locked from its first moment
    os.replace(target, aside)
    os.rename(fresh, target)
    shutil.rmtree(aside)
    return run_dir


def discard_unstarted(run_dir: Path, before: frozenset[str] | None) -> None:
    """Undo what a run that failed before its first step wrote: nothing in it can be resumed
    (``--resume`` would start over) and its partial files would pass for a run. ``before``: the
    entries the directory held when the run began (they are kept), or None when the run created
    the directory (it is removed)."""
    import shutil

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    if before is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for entry in run_dir.iterdir():
        if entry.name not in before:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def default_run_dir(cfg) -> Path:
    """A new ``OUTPUT_DIR/NAME-TIMESTAMP``, created here so that no other run takes it; ``-2``,
    ``-3``… when runs start within the same second."""
    base = Path(cfg.output_dir) / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    base.parent.mkdir(parents=True, exist_ok=True)
    path, n = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


def start_run(cfg, reducer, make_trainer: Callable[[Path], Any], *, run_dir: Path | None = None, overwrite: bool = False) -> dict:
    """Claim a run directory for a new run of ``cfg``, build its trainer there
    (``make_trainer(run_dir)``) and run it; the summary ``trainer.run()`` returns. ``reducer``:
    the process group the placement started (:func:`rllab.parallel.placement.start`).

    A ``run_dir`` that already holds a run is refused (continue it with
    :func:`rllab.training.runs.resume_run`), or with ``overwrite=True`` replaced: see
    :func:`prepare_run_dir`. None picks a new ``OUTPUT_DIR/NAME-TIMESTAMP``. A ``run_dir``
    another process is writing is refused (:class:`rllab.training.runlock.RunDirInUseError`); this run
    holds it until it ends.

    A run that fails before its first step completes leaves no run directory behind: one it
    created is removed, and in one that existed only what the run added is.
    """
    existed = run_dir is not None and Path(run_dir).is_dir()

    def claim() -> tuple[Path, runlock.RunLock]:
        if run_dir is None:
            path = default_run_dir(cfg)
        elif Path(run_dir).exists() and not Path(run_dir).is_dir():
            raise RllabError(f"run directory {run_dir} is a file, not a directory: choose another --run-dir")
        else:
            path = Path(run_dir)
        lock = runlock.acquire(path)  # before anything is read or replaced there
        try:
            return prepare_run_dir(path, overwrite=overwrite), lock
        except BaseException:
            lock.release()
            if not existed and path.is_dir() and not any(path.iterdir()):
                path.rmdir()
            raise

    run_dir, lock = claim_on_main(reducer, claim)  # under torchrun every rank uses the directory rank 0 claimed
    before = frozenset(p.name for p in run_dir.iterdir()) if existed and run_dir.is_dir() else None
    trainer = None
    try:
        trainer = make_trainer(run_dir)
        return trainer.run()
    except BaseException as e:
        if (trainer is None or trainer.step == 0) and reducer.is_main:
            discard_unstarted(run_dir, before)
            if not isinstance(e, ConfigError):  # a refused setting says itself what to change
                removed = f"{run_dir} was removed" if before is None else f"what it wrote to {run_dir} was removed"
                e.add_note(f"the run stopped before its first step completed: nothing was saved and there is no checkpoint "
                           f"to resume from ({removed}); start the run again")
        elif reducer.is_main:
            note_how_to_continue(e, run_dir)
        distributed.name_rank(e, reducer)
        raise
    finally:
        if lock is not None:
            lock.release()




def claim_on_main(reducer, claim: Callable[[], tuple[Path, runlock.RunLock]]) -> tuple[Path, runlock.RunLock | None]:
    """``claim()`` — the run directory and its lock — on rank 0 only (the rank that writes the
    run's files); every rank gets the directory, or raises the error that refused it."""
    path = lock = refused = None
    if reducer.is_main:
        try:
            path, lock = claim()
        except RllabError as e:
            refused = e
    shared = reducer.broadcast((False, str(refused)) if refused is not None else (True, str(path)))
    if refused is not None:
        raise refused
    if not shared[0]:
        raise RllabError(f"rank 0 refused the run directory: {shared[1]}")
    return Path(shared[1]), lock


def note_how_to_continue(error: BaseException, run_dir: Path) -> None:
    """On an error (a Ctrl-C included) of a run that got past its first step, a note
    (``error.add_note``, printed by the CLI) on whether and how it can be continued, and from
    which checkpoint."""
    last = checkpoint.latest(run_dir)
    if last is not None:
        error.add_note(f"{run_dir} keeps its last checkpoint ({last.name}); continue it with: rllab run --resume {run_dir}")
    else:
        error.add_note(f"{run_dir} has no checkpoint yet (train.checkpoint_every), so nothing can be continued: "
                       f"rllab run --resume {run_dir} starts the run over from step 0")


def with_deployment(recorded: dict, current: dict) -> dict:
    """A checkpoint's config (``recorded``, as ``to_dict`` gives it) with the deployment settings
    of ``current`` (:data:`DEPLOYMENT_SETTINGS`), which a resume may have changed."""
    data = dict(recorded)
    for key in DEPLOYMENT_SETTINGS:
        section, knob = key.split(".")
        if not isinstance(data.get(section), dict) or not isinstance(current.get(section), dict):
            continue
        table = {k: v for k, v in data[section].items() if k != knob}
        if knob in current[section]:
            table[knob] = current[section][knob]
        data[section] = table
    return data
