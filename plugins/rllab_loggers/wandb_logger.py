"""The Weights & Biases logger (``pip install rllab[wandb]``): offline by default.

``loggers = ["jsonl", "wandb"]`` records the run under ``RUN_DIR/wandb/offline-run-*``: the
config, every step's and evaluation's metrics, and at the end the summary (``final/accuracy``,
...) with the final checkpoint's path (``final/checkpoint``, ``final/adapter`` for LoRA). Upload
it later with ``wandb sync RUN_DIR/wandb/offline-run-*``. ``mode = "online"`` streams to the
server instead (it needs ``wandb login`` and the network). ``log_model = true`` also stores the
final model's files as a ``model`` artifact (the adapter for LoRA, else the checkpoint), as
``WANDB_LOG_MODEL=end`` does for TRL. ``traces = N`` adds N samples of each step to an incremental
``traces`` table (:data:`rllab_loggers.traces.TABLE_COLUMNS`). A resumed run continues the same
wandb run id.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import attrs

import rllab
from rllab_loggers.trackers import final_model, installed, require, run_directory, trace_rows, traces_knob

RUN_ID_FILE = "wandb_run_id"
"""The file in the run directory that keeps the wandb run id, so a resumed run continues it."""


@attrs.frozen
class WandbConfig:
    """Knobs of the Weights & Biases logger."""

    project: str = rllab.knob("rllab", help="the wandb project")
    entity: str = rllab.knob("", help="the wandb team or user ('' = your default entity)")
    run_name: str = rllab.knob("", help="the run's display name ('' = the run directory's name)")
    group: str = rllab.knob("", help="the run group ('' = none)")
    tags: str | tuple[str, ...] = rllab.knob((), help="tags of the run: a list, or one tag as a string")
    mode: str = rllab.knob(
        "offline", help="'offline': files under RUN_DIR/wandb, no network (sync later); 'online': stream to the server; "
        "'disabled': log nothing", choices=("offline", "online", "disabled"),
    )
    log_model: bool = rllab.knob(False, help="store the final model's files (adapter or checkpoint) as a 'model' artifact")
    traces: int = traces_knob("added to the run's 'traces' table, an incremental wandb.Table that keeps every step's rows")


class WandbLogger:
    """One wandb run per rllab run, in the run directory."""

    def __init__(self, config: WandbConfig, run_dir: Path):
        self.wandb = require("wandb", logger="wandb", extra="wandb")
        self.config = config
        self.run_dir = run_directory(run_dir)
        id_file = self.run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        if config.mode == "offline":
            os.environ["WANDB_MODE"] = "offline"  # no part of wandb tries the network, whatever the environment said
        settings = self.wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True, save_code=False)
        try:
            tags = [config.tags] if isinstance(config.tags, str) else list(config.tags)
            self.run = self.wandb.init(
                project=config.project, entity=config.entity or None, name=config.run_name or self.run_dir.name, group=config.group or None,
                tags=tags or None, mode=config.mode, dir=str(self.run_dir), id=run_id, resume="allow", settings=settings, reinit="create_new",
            )
        except Exception as e:  # noqa: BLE001  (wandb raises its own errors: no API key, no server, ...)
            hint = "; log in with `wandb login` (or set WANDB_API_KEY), or use mode = 'offline'" if config.mode == "online" else ""
            raise rllab.RllabError(f"the 'wandb' logger could not start a run (mode = {config.mode!r}): {e}{hint}") from e
        id_file.write_text(run_id + "\n")
        self._table = None

    def start(self, config: dict) -> None:
        self.run.config.update(config, allow_val_change=True)  # a resumed run may change train.steps and the like

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(dict(metrics), step=int(step))

    def samples(self, *, step, episodes, batch, advantages, trainer_log_prob, tokenizer) -> None:
        """With ``traces > 0``: that many of the step's samples as rows of the incremental ``traces`` table."""
        if not self.config.traces:
            return
        from rllab_loggers.traces import TABLE_COLUMNS

        if self._table is None:
            self._table = self.wandb.Table(columns=list(TABLE_COLUMNS), log_mode="INCREMENTAL")
        for row in trace_rows(self.config.traces, step=step, episodes=episodes, batch=batch, advantages=advantages,
                              trainer_log_prob=trainer_log_prob, tokenizer=tokenizer):
            self._table.add_data(*row)
        self.run.log({"traces": self._table}, step=int(step))

    def close(self) -> None:
        final = final_model(self.run_dir)
        if final is None:
            self.run.finish(exit_code=1)  # stopped early: the run shows as failed
            return
        self.run.summary.update({**final.scalars(), **final.paths()})
        if self.config.log_model and final.model_dir is not None:
            art = self.wandb.Artifact(f"model-{self.run.id}", type="model", metadata={"steps": final.summary.get("steps"), **final.paths()})
            art.add_dir(str(final.model_dir))
            self.run.log_artifact(art, aliases=["final"])
        self.run.finish()


def wandb(*, config: WandbConfig, run_dir) -> WandbLogger:
    """Weights & Biases: config, metrics, final summary and checkpoint path; offline by default."""
    return WandbLogger(config, Path(run_dir))


wandb.check_installed = installed("wandb", logger="wandb", extra="wandb")
