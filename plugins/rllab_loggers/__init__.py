"""Metric loggers: JSON lines (always available), TensorBoard (``pip install rllab[tensorboard]``),
Weights & Biases (``rllab[wandb]``, :mod:`rllab_loggers.wandb_logger`), MLflow
(``rllab[mlflow]``, :mod:`rllab_loggers.mlflow_logger`), Trackio (``rllab[trackio]``,
:mod:`rllab_loggers.trackio_logger`) and per-sample traces
(:mod:`rllab_loggers.traces`, read with ``rllab traces RUN``: :mod:`rllab_loggers.traces_view`).

A logger is built once per run with ``factory(config=..., run_dir=...)`` and subscribed to the
run's ``on_step_end`` and ``on_eval_end`` events (:mod:`rllab.training.listeners`): it receives
``log(step, metrics)`` for every step and evaluation (metrics: a flat dict of floats with
namespaced keys such as ``rollout/reward`` or ``actor/clipfrac``) and ``close()`` at the end.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs

import rllab
from rllab_loggers.mlflow_logger import MlflowConfig, mlflow
from rllab_loggers.traces import TracesConfig, inside_run_dir, read_json_lines, read_traces, traces, truncate_traces

__all__ = [
    "JsonlConfig", "TensorBoardConfig", "TracesConfig", "jsonl", "read_jsonl", "read_traces", "tensorboard", "trace_panels",
    "traces", "traces_path", "truncate_jsonl",
]  # fmt: skip
from rllab_loggers.trackers import installed
from rllab_loggers.trackio_logger import TrackioConfig, trackio
from rllab_loggers.wandb_logger import WandbConfig, wandb


@attrs.frozen
class JsonlConfig:
    """Knobs of the JSONL logger."""

    filename: str = rllab.knob("metrics.jsonl", help="file inside the run directory", validator=inside_run_dir)


class JsonlLogger:
    """Appends one JSON object per step: ``{"step": N, "rollout/reward": ..., ...}``.

    Non-finite floats are written as strings ("nan", "inf") so every line stays valid JSON.
    The file is flushed after each line, so a killed run loses no finished step.
    """

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict) -> None:
        row = {"step": int(step)}
        for k, v in metrics.items():
            v = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            row[k] = v if not isinstance(v, float) or math.isfinite(v) else str(v)
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def jsonl(*, config: JsonlConfig, run_dir) -> JsonlLogger:
    """JSON lines, one object per step, in the run directory."""
    return JsonlLogger(Path(run_dir) / config.filename)


def truncate_jsonl(*, run_dir, config: JsonlConfig, step: int) -> None:
    """Drop the rows written after ``step`` (a run resumed from that step's checkpoint), so the
    resumed log has no duplicates, and a last row cut off by a killed run (with a warning naming it)."""
    path = Path(run_dir) / config.filename
    if not path.is_file():
        return
    keep = [json.dumps(r) for r in read_json_lines(path) if r["step"] <= step]
    path.write_text("".join(ln + "\n" for ln in keep))


def read_jsonl(path) -> list[dict]:
    """The rows of a metrics file (helper for plots and tests); a last row cut off by a killed run
    is left out with a warning."""
    return read_json_lines(path)


@attrs.frozen
class TensorBoardConfig:
    """Knobs of the TensorBoard logger."""

    subdir: str = rllab.knob("tensorboard", help="event-file directory inside the run directory")


class TensorBoardLogger:
    def __init__(self, logdir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # tensorboard is an optional extra
            raise rllab.MissingExtraError(
                "the 'tensorboard' logger needs the tensorboard package: pip install 'rllab[tensorboard]'"
            ) from e
        self._w = SummaryWriter(log_dir=str(logdir))

    def log(self, step: int, metrics: dict) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self._w.add_scalar(k, float(v), global_step=int(step))
        self._w.flush()

    def close(self) -> None:
        self._w.close()


def tensorboard(*, config: TensorBoardConfig, run_dir) -> TensorBoardLogger:
    """TensorBoard event files (scalars), viewable with `tensorboard --logdir RUN_DIR`."""
    return TensorBoardLogger(Path(run_dir) / config.subdir)


tensorboard.check_installed = installed("tensorboard", logger="tensorboard", extra="tensorboard")


@rllab.hookimpl
def register_loggers(register):
    register("jsonl", jsonl, config=JsonlConfig, truncate=truncate_jsonl)
    register("tensorboard", tensorboard, config=TensorBoardConfig)
    register("wandb", wandb, config=WandbConfig)
    register("mlflow", mlflow, config=MlflowConfig)
    register("trackio", trackio, config=TrackioConfig)
    register("traces", traces, config=TracesConfig, truncate=truncate_traces)


def traces_path(run_dir):
    """The traces file a run's traces logger writes (its ``filename`` knob, read from the run's
    config.toml); raises :class:`rllab_loggers.traces_view.TracesError` when the run has none."""
    from rllab_loggers import traces_view

    return traces_view.traces_path(run_dir)


def trace_panels(run_dir, *, step: int | None = None, color: str = "advantage", limit: int | None = None) -> list:
    """The rich panels of a run's traces (its last traced step, or ``step``), as ``rllab traces``
    prints them; [] when the run has no traces yet. For front ends (the TUI's traces view)."""
    from rllab_loggers import traces_view

    try:
        path = traces_view.traces_path(run_dir)  # the file the run's traces logger names
    except traces_view.TracesError:
        return []
    _, recs = traces_view.load(path, on_cut=lambda *_: None)  # a line being written is not an error
    return [traces_view.panel(r, color) for r in traces_view.select(recs, step=step, limit=limit)]


@rllab.hookimpl
def register_commands(subparsers):
    from rllab_loggers.traces_view import register_command

    register_command(subparsers)
