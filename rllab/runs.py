"""Run directories: what a run records about itself, and resuming one.

``RUN_DIR/config.toml`` is the experiment with every knob's value (defaults included), the extra
plugins it loaded and, under ``[provenance]``, the versions that ran it: ``rllab run
RUN_DIR/config.toml`` reproduces the run, and ``rllab run --resume RUN_DIR`` continues it from its
last checkpoint (``train.steps=N`` extends it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rllab import checkpoint
from rllab.config import load_config, parse_overrides
from rllab.errors import RllabError
from rllab.lab import Lab

CONFIG_FILE = "config.toml"
RESUMABLE_SETTINGS = ("train.steps", "train.eval_every", "train.checkpoint_every", "train.eval_size")
"""Settings an ``--resume`` may change: the rest would make the resumed run differ from the original."""


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


def resume_run(run_dir: Path, *, lab: Lab | None = None, overrides: list[str] = (), progress: bool = True) -> dict:
    """Continue an interrupted run from its last checkpoint (or restart it if it has none).

    ``overrides`` may change only :data:`RESUMABLE_SETTINGS` — ``train.steps=N`` extends a run
    (the LR schedule then runs over the new total); anything else is refused, since the resumed
    run would no longer be the one recorded.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / CONFIG_FILE
    if not cfg_path.is_file():
        raise RllabError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    pairs = parse_overrides(list(overrides))
    bad = [k for k, _ in pairs if k not in RESUMABLE_SETTINGS]
    if bad:
        raise RllabError(
            f"--resume cannot change {', '.join(bad)}: the resumed run would differ from the one recorded in {cfg_path}. "
            f"Only {', '.join(RESUMABLE_SETTINGS)} may change (train.steps=N extends the run); to change anything "
            f"else, start a new run: rllab run {cfg_path} {' '.join(f'{k}={v}' for k, v in pairs)}"
        )
    lab = lab or Lab()
    cfg = load_config(cfg_path, pairs, lab=lab)
    from rllab.trainer import Trainer

    trainer = Trainer(cfg, lab=lab, run_dir=run_dir, progress=progress)
    ckpt = checkpoint.latest(run_dir)
    if ckpt is not None:
        trainer.load_checkpoint(ckpt)
        if trainer.step >= cfg.train.steps:
            trainer.close()
            raise RllabError(
                f"{run_dir} already finished its {trainer.step} steps; extend it with: rllab run --resume {run_dir} train.steps=N (N > {trainer.step})"
            )
    _truncate_metrics(run_dir, trainer.step, [ref.name for ref in cfg.loggers], cfg)
    return trainer.run()


def _truncate_metrics(run_dir: Path, step: int, loggers, cfg) -> None:
    """Drop metric rows written after the checkpoint, so the resumed log has no duplicates."""
    if "jsonl" not in loggers:
        return
    ref = next(r for r in cfg.loggers if r.name == "jsonl")
    path = run_dir / getattr(ref.config, "filename", "metrics.jsonl")
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    path.write_text("".join(ln + "\n" for ln in keep))
