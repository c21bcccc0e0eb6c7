"""Checkpoints: written atomically, never with non-finite weights, found again on resume.

A checkpoint is a directory ``RUN_DIR/checkpoints/step_NNNNNN`` (after NNNNNN steps) holding
``state.pt``: whatever state the trainer collects (model, optimizer, scheduler, critic, KL
controller, RNG states, history, the config in force). It is written to a temporary directory
and renamed into place, so a run killed mid-write leaves the previous checkpoint intact;
``checkpoints/latest`` names the newest, and only the newest ``keep`` are kept.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from rllab.errors import NonFiniteError

CHECKPOINTS = "checkpoints"


def nonfinite_tensors(state: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Names of the floating-point tensors in a (nested) state dict that hold NaN or inf."""
    bad = []
    for k, v in state.items():
        name = f"{prefix}{k}"
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            if not bool(torch.isfinite(v).all()):
                bad.append(name)
        elif isinstance(v, Mapping):
            bad.extend(nonfinite_tensors(v, prefix=name + "."))
    return bad


def save(run_dir: Path, step: int, state: dict, *, check: tuple[str, ...] = ("policy", "critic"), keep: int = 2) -> Path:
    """Write ``state`` as the checkpoint after ``step`` steps; returns its directory.

    Raises :class:`NonFiniteError` (and writes nothing) if a weight under ``state[k]`` for ``k``
    in ``check`` is NaN or inf: a broken model is never saved over a good one.
    """
    for key in check:
        if state.get(key) is not None:
            bad = nonfinite_tensors(state[key])
            if bad:
                shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                raise NonFiniteError(f"refusing to write the checkpoint after step {step}: non-finite {key} weights ({shown})", step=step)
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    return publish(root, tmp, final, keep=keep)


def publish(root: Path, tmp: Path, final: Path, *, keep: int) -> Path:
    """Make the fully written checkpoint directory ``tmp`` the checkpoint ``final`` and the
    latest one, atomically (renames only), then delete all but the newest ``keep``."""
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    (root / ".latest.tmp").write_text(final.name)
    os.replace(root / ".latest.tmp", root / "latest")
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / "latest"
    if pointer.is_file() and (root / pointer.read_text().strip() / "state.pt").is_file():
        return root / pointer.read_text().strip()
    steps = sorted(p for p in root.glob("step_*") if (p / "state.pt").is_file()) if root.is_dir() else []
    return steps[-1] if steps else None


def load(path: Path) -> dict:
    """The state saved in a checkpoint directory."""
    return torch.load(Path(path) / "state.pt", weights_only=False)


def plain_state(obj) -> dict:
    """The plain-valued attributes (numbers, strings, bools, None) of ``obj``: the checkpointed
    state of a small stateful component such as a KL controller."""
    return {k: v for k, v in vars(obj).items() if isinstance(v, (int, float, bool, str, type(None)))}


def restore_plain_state(obj, state: dict) -> None:
    """Set back the attributes :func:`plain_state` saved."""
    for k, v in state.items():
        setattr(obj, k, v)
