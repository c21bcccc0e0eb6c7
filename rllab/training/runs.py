"""Starting a run (:func:`run_experiment`, defined with the trainer) and resuming one
(:func:`resume_run`); what a run directory records and how one is claimed is
:mod:`rllab.training.rundir`'s (its names are importable from here too).

``rllab run --resume RUN_DIR`` continues a run from its last checkpoint (``train.steps=N`` extends
it); it may also change where the run executes (:data:`DEPLOYMENT_SETTINGS`), each change
recorded in :data:`RESUME_LOG`. A resume that stops on an error says whether it can be continued
(:func:`note_how_to_continue`).
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path

import torch

from rllab.parallel import placement
from rllab.parallel import checkpoint
from rllab.training import runlock
from rllab.config import load_config, parse_overrides
from rllab.parallel.distributed import name_rank
from rllab.errors import ConfigError, RllabError
from rllab.lab import Lab
from rllab.training.rundir import (  # noqa: F401  (re-exported: the run directory's names, imported from here before)
    CONFIG_FILE,
    DEPLOYMENT_SETTINGS,
    DEVICE_SETTINGS,
    RUN_MARKERS,
    claim_on_main,
    default_run_dir,
    discard_unstarted,
    note_how_to_continue,
    prepare_run_dir,
    recorded_config,
    run_markers,
    with_deployment,
)
from rllab.training.trainer import Trainer, resolve_device, run_experiment  # noqa: F401  (run_experiment: re-exported)

RESUMABLE_SETTINGS = ("train.steps", "train.lr_schedule_steps", "train.eval_every", "train.checkpoint_every", "train.eval_size",
                      "train.eval_samples")
"""Settings an ``--resume`` may change: the rest would make the resumed run differ from the original."""

RESUME_LOG = "resumes.jsonl"
"""In the run directory: one JSON line per ``--resume`` that changed a deployment setting —
``{"time", "from_step", "changes": {key: {"from": old, "to": new}}}``."""


def resume_run(run_dir: Path, *, lab: Lab | None = None, overrides: list[str] = (), progress: bool = True) -> dict:
    """Continue an interrupted run from its last checkpoint (or restart it if it has none). A run
    stopped after its final checkpoint but before writing ``final.json`` is finished: its summary
    is written from the final evaluation the checkpoint holds, nothing is trained or evaluated again.

    ``overrides`` may change only :data:`RESUMABLE_SETTINGS` — ``train.steps=N`` extends a run
    (the LR schedule then runs over the new total; a decay with a length of its own,
    ``train.lr_schedule_steps``, needs that given too) — and the :data:`DEPLOYMENT_SETTINGS` (where
    the servers are, timeouts, device placement within a kind of device), each change of which is
    printed, appended to :data:`RESUME_LOG` and written into ``config.toml``; anything else is
    refused, naming it, since the resumed run would no longer be the one recorded.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / CONFIG_FILE
    if not cfg_path.is_file():
        from rllab.training.export import inside_run_hint

        raise RllabError(f"{run_dir} is not a run directory (no {CONFIG_FILE}){inside_run_hint(run_dir)}")
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
    recorded = load_config(cfg_path, [], lab=lab)
    _check_schedule_extends(recorded.train, cfg.train, given={k for k, _ in pairs})
    changes = _deployment_changes(recorded, cfg, [k for k, _ in pairs if k in DEPLOYMENT_SETTINGS])
    reducer = placement.start(cfg.model, device_type=resolve_device(cfg.model.device).type)
    _, lock = claim_on_main(reducer, lambda: (run_dir, runlock.acquire(run_dir)))
    try:
        return _resume(run_dir, cfg, changes, lab=lab, progress=progress, is_main=reducer.is_main)
    finally:
        if lock is not None:
            lock.release()


def _check_schedule_extends(recorded, train, *, given: set[str]) -> None:
    """A run extended with more ``train.steps`` whose decay has a length of its own
    (``train.lr_schedule_steps``) must say where the decay now ends: left as it is, the extra
    steps would train at the rate the decay ended on (0), silently."""
    decays = recorded.lr_schedule != "constant" and recorded.lr_schedule_steps > 0
    if decays and train.steps > recorded.steps and "train.lr_schedule_steps" not in given:
        raise RllabError(
            f"--resume train.steps={train.steps}: this run's {recorded.lr_schedule} decay has a length of its own, "
            f"train.lr_schedule_steps = {recorded.lr_schedule_steps} ({recorded.lr_schedule_unit}s), and ends there; give "
            f"train.lr_schedule_steps=N with train.steps (the new length, or {recorded.lr_schedule_steps} to keep it)"
        )


def _resume(run_dir: Path, cfg, changes: dict, *, lab: Lab, progress: bool, is_main: bool) -> dict:
    """The part of :func:`resume_run` that runs while the run directory is locked."""
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
        elif (run_dir / "final.json").is_file():  # finished, its checkpoints removed: starting over would replace its results
            trainer.close()
            raise RllabError(
                f"{run_dir} finished (final.json) but keeps no checkpoint ({run_dir / 'checkpoints'} holds none), so it cannot "
                f"be continued, and --resume would train it again from step 0 over its results; start a new run: "
                f"rllab run {run_dir / 'config.toml'} --run-dir NEW_DIR"
            )
        elif reducer.is_main:
            print(f"{run_dir} has no checkpoint yet: --resume starts the run over from step 0")
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
    from rllab.records.tomlio import dump_toml

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
