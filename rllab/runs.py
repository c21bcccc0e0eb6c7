"""Run directories: what a run records about itself; starting a run (:func:`run_experiment`) and
resuming one (:func:`resume_run`).

``RUN_DIR/config.toml`` is the experiment with every knob's value (defaults included), the extra
plugins it loaded and, under ``[provenance]``, the versions that ran it: ``rllab run
RUN_DIR/config.toml`` reproduces the run, and ``rllab run --resume RUN_DIR`` continues it from its
last checkpoint (``train.steps=N`` extends it).

A new run never starts in a directory that already holds one (:func:`prepare_run_dir`): its
metrics would mix with the old run's and its checkpoints and ``final.json`` would be overwritten.
``--overwrite`` replaces the old run first (the whole directory, by one rename, so a crash leaves
either the old run or the new one, never a mix); an empty or unrelated directory is used as it is.

No two processes write one run directory: a run holds its lock (:mod:`rllab.runlock`; under
``torchrun``, rank 0 holds it) from before the directory is prepared until the run ends, and a
second run or ``--resume`` there is refused, naming the holder's pid.

A run that stops on an error says whether it can be continued (:func:`note_how_to_continue`): from
which checkpoint, with which ``--resume`` command, or that nothing was saved and it must be
started again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import tomllib
from pathlib import Path
from typing import Callable

import torch

from rllab import checkpoint, runlock
from rllab.config import load_config, parse_overrides
from rllab.errors import ConfigError, RllabError
from rllab.lab import Lab

CONFIG_FILE = "config.toml"
RESUMABLE_SETTINGS = ("train.steps", "train.eval_every", "train.checkpoint_every", "train.eval_size", "train.eval_samples")
"""Settings an ``--resume`` may change: the rest would make the resumed run differ from the original."""

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
Each change is recorded (:data:`RESUME_LOG`) and written into ``config.toml``, so a later
``--resume`` uses it. Left out on purpose: what alters the samples or the arithmetic — the
request batching (``backend.prompts_per_request``, ``backend.max_batch_size``), the CPU thread
count (``backend.num_threads``: reductions split differently), the dtype on the wire
(``backend.distributed_dtype``) — and a device of another kind (:data:`DEVICE_SETTINGS`)."""

DEVICE_SETTINGS = ("backend.device", "model.device", "model.reference_device")
"""Placement settings: they may move the run to another device of the same kind (``cuda:0`` →
``cuda:1``), not between kinds (CPU ↔ CUDA: other kernels, other numerics)."""

RESUME_LOG = "resumes.jsonl"
"""In the run directory: one JSON line per ``--resume`` that changed a deployment setting —
``{"time", "from_step", "changes": {key: {"from": old, "to": new}}}``."""


def recorded_config(cfg, lab) -> dict:
    """The config as the run directory records it: every knob, the plugins, the versions."""
    import platform

    import transformers

    import rllab

    data = cfg.to_dict()
    extra = [p.name for p in lab.plugins if p.ok and p.source in ("file", "module")]
    plugins = list(dict.fromkeys([*cfg.plugins, *extra]))
    if plugins:
        data = {**{k: v for k, v in data.items() if k in ("name", "output_dir")}, "plugins": plugins, **data}
    data["provenance"] = {
        "rllab": rllab.__version__,
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


def run_experiment(cfg: ExperimentConfig, *, lab: Lab | None = None, run_dir: Path | None = None, progress: bool = True,
                   overwrite: bool = False) -> dict:
    """Train from scratch (:class:`rllab.trainer.Trainer`); returns the summary also written to
    ``RUN_DIR/final.json``.

    A ``run_dir`` that already holds a run is refused (continue it with :func:`resume_run`), or
    with ``overwrite=True`` replaced: see :func:`prepare_run_dir`. None picks a new
    ``OUTPUT_DIR/NAME-TIMESTAMP``. A ``run_dir`` another process is writing is refused
    (:class:`rllab.runlock.RunDirInUseError`); this run holds it until it ends.

    A run that fails before its first step completes leaves no run directory behind: one it
    created is removed, and in one that existed only what the run added is.
    """
    from rllab import distributed, placement
    from rllab.trainer import Trainer, resolve_device

    reducer = placement.start(cfg.model, device_type=resolve_device(cfg.model.device).type)
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
        trainer = Trainer(cfg, lab=lab, run_dir=run_dir, progress=progress)
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


def resume_run(run_dir: Path, *, lab: Lab | None = None, overrides: list[str] = (), progress: bool = True) -> dict:
    """Continue an interrupted run from its last checkpoint (or restart it if it has none). A run
    stopped after its final checkpoint but before writing ``final.json`` is finished: its summary
    is written from the final evaluation the checkpoint holds, nothing is trained or evaluated again.

    ``overrides`` may change only :data:`RESUMABLE_SETTINGS` — ``train.steps=N`` extends a run
    (the LR schedule then runs over the new total) — and the :data:`DEPLOYMENT_SETTINGS` (where
    the servers are, timeouts, device placement within a kind of device), each change of which is
    printed, appended to :data:`RESUME_LOG` and written into ``config.toml``; anything else is
    refused, naming it, since the resumed run would no longer be the one recorded.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / CONFIG_FILE
    if not cfg_path.is_file():
        raise RllabError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    pairs = parse_overrides(list(overrides))
    bad = [k for k, _ in pairs if k not in RESUMABLE_SETTINGS and k not in DEPLOYMENT_SETTINGS]
    if bad:
        raise RllabError(
            f"--resume cannot change {', '.join(bad)}: the resumed run would differ from the one recorded in {cfg_path}. "
            f"Only {', '.join(RESUMABLE_SETTINGS)} (train.steps=N extends the run) and the deployment settings "
            f"{', '.join(DEPLOYMENT_SETTINGS)} may change; to change anything else, start a new run: "
            f"rllab run {cfg_path} {' '.join(f'{k}={v}' for k, v in pairs)}"
        )
    lab = lab or Lab()
    try:
        cfg = load_config(cfg_path, pairs, lab=lab)
    except ConfigError as e:
        if e.key == "strategy":  # torchrun around a one-process run: its strategy is part of the experiment
            raise ConfigError(
                f"{e}. A resume cannot change model.strategy: continue {run_dir} as one process, without torchrun",
                key="strategy",
            ) from None
        raise
    changes = _deployment_changes(load_config(cfg_path, [], lab=lab), cfg, [k for k, _ in pairs if k in DEPLOYMENT_SETTINGS])
    from rllab import placement
    from rllab.trainer import resolve_device

    reducer = placement.start(cfg.model, device_type=resolve_device(cfg.model.device).type)
    _, lock = claim_on_main(reducer, lambda: (run_dir, runlock.acquire(run_dir)))
    try:
        return _resume(run_dir, cfg, changes, lab=lab, progress=progress, is_main=reducer.is_main)
    finally:
        if lock is not None:
            lock.release()


def _resume(run_dir: Path, cfg, changes: dict, *, lab: Lab, progress: bool, is_main: bool) -> dict:
    """The part of :func:`resume_run` that runs while the run directory is locked."""
    from rllab.distributed import name_rank
    from rllab.trainer import Trainer

    try:
        trainer = Trainer(cfg, lab=lab, run_dir=run_dir, progress=progress)
    except BaseException as e:  # e.g. a server that does not answer: the checkpoint is still there
        if not isinstance(e, ConfigError) and is_main:
            note_how_to_continue(e, run_dir)
        raise
    reducer = trainer.placement.reducer
    try:
        ckpt = reducer.broadcast(checkpoint.latest(run_dir))  # every rank resumes from the one rank 0 found
        if ckpt is not None:
            trainer.load_checkpoint(ckpt)
            # a run stopped after its last checkpoint but before final.json is finished, not refused
            if trainer.step >= cfg.train.steps and (run_dir / "final.json").is_file():
                trainer.close()
                raise RllabError(
                    f"{run_dir} already finished its {trainer.step} steps; extend it with: rllab run --resume {run_dir} train.steps=N (N > {trainer.step})"
                )
            if trainer.step > cfg.train.steps:
                trainer.close()
                raise RllabError(
                    f"train.steps = {cfg.train.steps}, but {run_dir} is already past it: its last checkpoint ({ckpt.name}) is "
                    f"after step {trainer.step}, and a run cannot be shortened. Continue it with: rllab run --resume {run_dir} "
                    f"train.steps=N with N > {trainer.step} (the total an earlier --resume extended it to, or more)"
                )
        if reducer.is_main:
            _truncate_logs(run_dir, trainer.step, cfg, trainer.lab)
            if changes:
                record_deployment_changes(run_dir, trainer.step, changes)
    except BaseException as e:
        name_rank(e, reducer)
        raise
    try:
        return trainer.run()
    except BaseException as e:
        if reducer.is_main:
            note_how_to_continue(e, run_dir)
        name_rank(e, reducer)
        raise


def _truncate_logs(run_dir: Path, step: int, cfg, lab) -> None:
    """Each logger with the trait truncate drops what it wrote after the checkpoint's step, so the
    resumed log has no duplicates."""
    for ref in cfg.loggers:
        truncate = lab.spec("logger", ref.name).traits.get("truncate")
        if truncate is not None:
            truncate(run_dir=run_dir, config=ref.config, step=step)


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


def _value(data: dict, key: str):
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _device_kind(value) -> str | None:
    if value in (None, "auto"):
        return None if value is None else ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(value).type


def _deployment_changes(recorded, resumed, keys: list[str]) -> dict[str, dict]:
    """``{key: {"from": recorded value, "to": new value}}`` for the deployment ``keys`` whose value
    differs between the recorded config and the resumed one; a device of another kind is refused."""
    old, new = recorded.to_dict(), resumed.to_dict()
    changes = {}
    for key in dict.fromkeys(keys):
        a, b = _value(old, key), _value(new, key)
        if a == b:
            continue
        if key in DEVICE_SETTINGS:
            model_kind = _device_kind(_value(new, "model.device"))
            ka, kb = (_device_kind(v) or model_kind for v in (a, b))  # reference_device None: the model's device
            if ka != kb:
                raise RllabError(
                    f"--resume cannot change {key} from {a!r} ({ka}) to {b!r} ({kb}): another kind of device computes "
                    f"with other kernels, so the resumed run would differ from the one recorded. A device of the same kind "
                    f"(e.g. cuda:0 → cuda:1) may change; to change the kind, start a new run"
                )
        changes[key] = {"from": a, "to": b}
    return changes


def record_deployment_changes(run_dir: Path, step: int, changes: dict[str, dict]) -> None:
    """Print each change, append it to ``RUN_DIR/resumes.jsonl`` and write the new values into
    ``config.toml`` (the rest of it, provenance included, as it was), so a later ``--resume``
    starts from them."""
    from rllab.tomlio import dump_toml

    for key, c in changes.items():
        print(f"resume at step {step}: {key} changed from {c['from']!r} to {c['to']!r} (recorded in {run_dir / RESUME_LOG})")
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_step": step, "changes": changes}
    with open(run_dir / RESUME_LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")
    cfg_path = run_dir / CONFIG_FILE
    data = tomllib.loads(cfg_path.read_text())
    for key, c in changes.items():
        *parents, last = key.split(".")
        table = data
        for part in parents:
            table = table.setdefault(part, {})
        if c["to"] is None:
            table.pop(last, None)
        else:
            table[last] = list(c["to"]) if isinstance(c["to"], tuple) else c["to"]
    tmp = cfg_path.with_name(cfg_path.name + ".tmp")
    tmp.write_text(dump_toml(data))
    os.replace(tmp, cfg_path)
