"""The MLflow logger (``pip install rllab[mlflow]``): a local file store in the run directory by default.

``loggers = ["jsonl", "mlflow"]`` records the run in ``RUN_DIR/mlruns`` (or at ``tracking_uri``,
else at ``MLFLOW_TRACKING_URI`` when that is set): the config as parameters (``train.lr``, ...)
and as the artifact ``rllab_config.json``, every step's and evaluation's metrics, and at the end
the summary metrics with the final checkpoint's path as the tags ``final/checkpoint`` and
``final/adapter``. ``log_model = true`` also copies the final model's files (the adapter for
LoRA, else the checkpoint) into the run's artifacts under ``model/``. A run that stops on an
error ends FAILED; a resumed run continues the same MLflow run.

MLflow keeps its file store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE=true``; the logger sets that when it uses one (read the store with
``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri RUN_DIR/mlruns``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import attrs

import rllab
from rllab_loggers.trackers import final_model, flatten, installed, numbers, require, run_directory, trace_rows, traces_knob

RUN_ID_FILE = "mlflow_run_id"
"""The file in the run directory that keeps the MLflow run id, so a resumed run continues it."""

_PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
_METRICS_PER_BATCH = 1000
_PARAM_CHARS = 6000


@attrs.frozen
class MlflowConfig:
    """Knobs of the MLflow logger."""

    tracking_uri: str = rllab.knob(
        "", help="where runs go: '' = MLFLOW_TRACKING_URI if set, else the file store RUN_DIR/mlruns; "
        "or e.g. 'http://host:5000', 'sqlite:///mlflow.db', 'file:///path/mlruns'"
    )
    experiment: str = rllab.knob("rllab", help="the MLflow experiment (created when missing)")
    run_name: str = rllab.knob("", help="the run's name ('' = the run directory's name)")
    log_model: bool = rllab.knob(False, help="copy the final model's files (adapter or checkpoint) into the run's artifacts under model/")
    traces: int = traces_knob("added to the run's artifact traces.json, a table in MLflow's {columns, data} form")


class MlflowLogger:
    """One MLflow run per rllab run, written through :class:`mlflow.tracking.MlflowClient` (no
    global active run, so several rllab runs in one process keep their own)."""

    def __init__(self, config: MlflowConfig, run_dir: Path):
        require("mlflow", logger="mlflow", extra="mlflow")
        from mlflow.tracking import MlflowClient

        self.config = config
        self.run_dir = run_directory(run_dir)
        uri = config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (self.run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # see the module's docstring
        self.tracking_uri = uri
        self._trace_rows: list | None = None
        try:
            self.client = MlflowClient(tracking_uri=uri)
            exp = self.client.get_experiment_by_name(config.experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(config.experiment)
            id_file = self.run_dir / RUN_ID_FILE
            if id_file.is_file():  # a resumed run: the same MLflow run, running again
                self.run_id = id_file.read_text().strip()
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                run = self.client.create_run(exp_id, run_name=config.run_name or self.run_dir.name, tags={"rllab.run_dir": str(self.run_dir.resolve())})
                self.run_id = run.info.run_id
                id_file.write_text(self.run_id + "\n")
        except Exception as e:  # noqa: BLE001  (mlflow raises its own and the store's errors)
            raise rllab.RllabError(f"the 'mlflow' logger cannot open tracking_uri {uri!r}: {e}") from e

    def start(self, config: dict) -> None:
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        params = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in flatten(config).items()}
        new = [Param(k, v[:_PARAM_CHARS]) for k, v in params.items() if k not in logged]  # parameters cannot change once logged
        for i in range(0, len(new), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[i : i + _PARAMS_PER_BATCH])
        self.client.log_dict(self.run_id, config, "rllab_config.json")  # the config in force (the latest, on resume)

    def log(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        now = int(1000 * time.time())
        rows = [Metric(k, v, now, int(step)) for k, v in numbers(metrics).items()]
        for i in range(0, len(rows), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=rows[i : i + _METRICS_PER_BATCH])

    def samples(self, *, step, episodes, batch, advantages, trainer_log_prob, tokenizer) -> None:
        """With ``traces > 0``: that many of the step's samples appended to the ``traces.json`` table
        (rewritten each step; a resumed run keeps the rows of the steps before it)."""
        if not self.config.traces:
            return
        import json
        import tempfile

        from rllab_loggers.traces import TABLE_COLUMNS

        if self._trace_rows is None:  # first call: what an earlier part of this run logged, up to this step
            self._trace_rows = []
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    old = json.loads(Path(self.client.download_artifacts(self.run_id, "traces.json", tmp)).read_text())
                self._trace_rows = [r for r in old["data"] if r[0] < step]
            except Exception:  # noqa: BLE001  (no such artifact yet: a new run)
                pass
        self._trace_rows += trace_rows(self.config.traces, step=step, episodes=episodes, batch=batch, advantages=advantages,
                                       trainer_log_prob=trainer_log_prob, tokenizer=tokenizer)
        self.client.log_dict(self.run_id, {"columns": list(TABLE_COLUMNS), "data": self._trace_rows}, "traces.json")

    def close(self) -> None:
        final = final_model(self.run_dir)
        if final is None:
            self.client.set_terminated(self.run_id, status="FAILED")
            return
        steps = int(final.summary.get("steps", 0) or 0)
        self.log(steps, final.scalars())
        for key, path in final.paths().items():
            self.client.set_tag(self.run_id, key, path)
        if self.config.log_model and final.model_dir is not None:
            self.client.log_artifacts(self.run_id, str(final.model_dir), artifact_path="model")
        self.client.set_terminated(self.run_id, status="FINISHED")


def mlflow(*, config: MlflowConfig, run_dir) -> MlflowLogger:
    """MLflow: config as parameters, metrics, final summary and checkpoint path; a file store in the run directory by default."""
    return MlflowLogger(config, Path(run_dir))


mlflow.check_installed = installed("mlflow", logger="mlflow", extra="mlflow")
