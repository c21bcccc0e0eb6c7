"""The Trackio logger (``pip install rllab[trackio]``): local, no account, no network.

``loggers = ["jsonl", "trackio"]`` records the run in Trackio's own local store (a SQLite file per
project under ``$TRACKIO_DIR``, else ``$HF_HOME/trackio``; set ``TRACKIO_DIR`` before the run to
keep it elsewhere), where ``trackio show --project rllab`` opens its dashboard, as for TRL's
``report_to="trackio"``: the config, every step's and evaluation's metrics and, at the end, the
summary (``final/accuracy``, ...) with the final checkpoint's path (``final/checkpoint``,
``final/adapter`` for LoRA) logged at the last step. ``traces = N`` logs N samples of each step as
a ``traces`` table (:data:`rllab_loggers.traces.TABLE_COLUMNS`). The Trackio run is named after
the run directory plus a short id kept in ``RUN_DIR/trackio_run``, so a resumed run continues the
same Trackio run and two run directories of the same name never share one.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from pathlib import Path

import attrs

import rllab
from rllab_loggers.trackers import final_model, flatten, installed, numbers, require, run_directory, trace_rows, traces_knob

RUN_NAME_FILE = "trackio_run"
"""The file in the run directory that keeps the Trackio run's name, so a resumed run continues it."""


@attrs.frozen
class TrackioConfig:
    """Knobs of the Trackio logger."""

    project: str = rllab.knob("rllab", help="the Trackio project (one SQLite file in Trackio's directory)")
    run_name: str = rllab.knob("", help="the run's name ('' = the run directory's name and a short id)")
    group: str = rllab.knob("", help="the run group ('' = none)")
    traces: int = traces_knob("logged as its 'traces' table")


class TrackioLogger:
    """One Trackio run per rllab run."""

    def __init__(self, config: TrackioConfig, run_dir: Path):
        self.trackio = require("trackio", logger="trackio", extra="trackio")
        self.config = config
        self.run_dir = run_directory(run_dir)
        name_file = self.run_dir / RUN_NAME_FILE
        if name_file.is_file():
            self.name = name_file.read_text().strip()
        else:
            self.name = config.run_name or f"{self.run_dir.name}-{uuid.uuid4().hex[:6]}"
            name_file.write_text(self.name + "\n")
        self.run = None
        self.last_step = 0

    def start(self, config: dict) -> None:
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # Trackio prints where its dashboard is
                self.run = self.trackio.init(project=self.config.project, name=self.name, group=self.config.group or None,
                                             config=flatten(config), resume="allow", embed=False, auto_log_cpu=False,
                                             auto_log_gpu=False)
        except Exception as e:  # noqa: BLE001  (Trackio raises its own errors)
            raise rllab.RllabError(f"the 'trackio' logger could not start a run in project {self.config.project!r}: {e}") from e

    def _started(self):
        if self.run is None:  # a logger used without start(): the run has no config
            self.start({})
        return self.run

    def log(self, step: int, metrics: dict) -> None:
        self.last_step = max(self.last_step, int(step))
        self._started().log(numbers(metrics), step=int(step))

    def samples(self, *, step, episodes, batch, advantages, trainer_log_prob, tokenizer) -> None:
        """With ``traces > 0``: that many of the step's samples as the step's ``traces`` table."""
        if not self.config.traces:
            return
        from rllab_loggers.traces import TABLE_COLUMNS

        rows = trace_rows(self.config.traces, step=step, episodes=episodes, batch=batch, advantages=advantages,
                          trainer_log_prob=trainer_log_prob, tokenizer=tokenizer)
        self._started().log({"traces": self.trackio.Table(columns=list(TABLE_COLUMNS), data=rows)}, step=int(step))

    def close(self) -> None:
        run = self._started()
        final = final_model(self.run_dir)
        if final is not None:  # stopped early: no summary
            run.log({**final.scalars(), **final.paths()}, step=self.last_step)
        with contextlib.redirect_stdout(io.StringIO()):
            run.finish()
        current = self.trackio.context_vars.current_run
        if current.get() is run:  # finished: Trackio's exit handler must not finish it again
            current.set(None)


def trackio(*, config: TrackioConfig, run_dir) -> TrackioLogger:
    """Trackio: config, metrics, samples, final summary and checkpoint path, in Trackio's local store."""
    return TrackioLogger(config, Path(run_dir))


trackio.check_installed = installed("trackio", logger="trackio", extra="trackio")
