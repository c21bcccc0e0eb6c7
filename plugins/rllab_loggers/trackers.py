"""What the experiment trackers (Weights & Biases, MLflow, Trackio) share: importing the optional
library, the run directory, flattening the config into parameters, the ``traces`` knob and its
table rows, and finding the run's final model at the end.

A run writes ``final.json`` and its last checkpoint (and, with LoRA, ``adapter/``) before its
loggers close, so a tracker's ``close`` tells a finished run (those files present) from one that
stopped on an error (no ``final.json``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import attrs

import rllab


def require(module: str, *, logger: str, extra: str):
    """``import module``, or an error naming the logger and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise rllab.MissingExtraError(
            f"the {logger!r} logger needs the {module} package, which is not installed: pip install 'rllab[{extra}]' "
            f"(or remove {logger!r} from loggers)"
        ) from e


def installed(module: str, *, logger: str, extra: str):
    """A function that refuses, as :func:`require` does, when ``module`` is not installed, without
    importing it: a logger's ``check_installed``, asked before a run creates anything
    (:func:`rllab.training.parts.check_installed`)."""

    def check() -> None:
        if importlib.util.find_spec(module) is None:
            raise rllab.MissingExtraError(
                f"the {logger!r} logger needs the {module} package, which is not installed: pip install 'rllab[{extra}]' "
                f"(or remove {logger!r} from loggers)"
            )

    return check


def run_directory(run_dir) -> Path:
    """``run_dir``, absolute (the paths a tracker keeps must not depend on the working directory, and
    a tracker's service process has one of its own), created if missing."""
    path = Path(run_dir).absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path


def traces_knob(kept: str):
    """The ``traces`` knob of a tracker: how many of each training step's samples it keeps, and
    ``kept`` says where (``"added to the run's 'traces' table"``)."""
    return rllab.knob(
        4, help=f"samples of each training step {kept} (round-robin over the step's groups, as the traces logger); 0: none", ge=0,
    )


def trace_rows(n: int, **samples) -> list[list]:
    """The table rows (columns :data:`rllab_loggers.traces.TABLE_COLUMNS`) of ``n`` of a step's
    samples, given as ``on_step_samples`` gives them (but ``run_dir``), picked as the traces logger picks."""
    from rllab_loggers.traces import step_records, table_row

    return [list(table_row(rec)) for rec in step_records(**samples, n=n)]


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{"train.lr": 1e-5, "model.path": "...", ...}`` (lists stay values)."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, dict) and v else {key: v})
    return out


def numbers(metrics: dict) -> dict[str, float]:
    """The numeric entries of a metrics row as floats (bools and strings are left out)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@attrs.frozen
class FinalModel:
    """What a finished run leaves: its summary (``final.json``), its last checkpoint directory
    and, for a LoRA run, the adapter directory (loadable with ``PeftModel.from_pretrained``)."""

    summary: dict
    checkpoint: Path | None
    adapter: Path | None

    @property
    def model_dir(self) -> Path | None:
        """The directory to keep as the model: the adapter when there is one, else the checkpoint."""
        return self.adapter or self.checkpoint

    def paths(self) -> dict[str, str]:
        """``{"final/checkpoint": ..., "final/adapter": ...}`` for the ones that exist."""
        out = {"final/checkpoint": self.checkpoint, "final/adapter": self.adapter}
        return {k: str(v) for k, v in out.items() if v is not None}

    def scalars(self) -> dict[str, float]:
        """The summary's finite numbers (``final/accuracy``, ``initial/accuracy``, ...)."""
        return {k: v for k, v in numbers(self.summary).items() if math.isfinite(v)}


def final_model(run_dir) -> FinalModel | None:
    """The run's final model, or None when the run has no ``final.json`` (it stopped early)."""
    from rllab.parallel.checkpoint import latest

    run_dir = Path(run_dir).absolute()  # the paths a tracker keeps must not depend on the working directory
    summary_file = run_dir / "final.json"
    if not summary_file.is_file():
        return None
    adapter = run_dir / "adapter"
    return FinalModel(
        summary=json.loads(summary_file.read_text(encoding="utf-8")),
        checkpoint=latest(run_dir),
        adapter=adapter if adapter.is_dir() else None,
    )
