"""``rllab eval``: a model scored on a task's held-out split, as a run's own evaluation scores it.

The target is a model directory, found from what the user gives (:func:`resolve_target`):

- a run directory — its policy after ``--step N`` (default: its newest checkpoint; a finished
  full fine-tune's ``RUN_DIR/model`` when that is the newest), exported first
  (:mod:`rllab.training.export`), with the run's config;
- an exported directory (``rllab export``: its ``rllab_config.toml``), ``RUN_DIR/model`` (the
  run's ``config.toml``), or any Hugging Face model directory (the default config);
- nothing but overrides: ``model.path=DIR``, or no model at all (the tiny model warm-started on
  the configured task).

``key=value`` overrides apply on top (``task=…``, ``train.eval_size=…``, ``rollout.…``). The
evaluation is the trainer's own (:meth:`rllab.rollout.stage.RolloutStage.evaluate`, the run's
rollout stage and backend, built by :class:`rllab.Trainer`), so a run's final model scores
exactly its ``final/accuracy``. :func:`evaluate` adds intervals over the problems:

- greedy accuracy — the Wilson score interval (:func:`wilson`) of solved problems out of n;
- ``mean@n`` and ``pass@k`` (``--samples n``) — a percentile bootstrap over problems
  (:func:`bootstrap`, fixed seed) of the per-problem values.
"""

from __future__ import annotations

import math
import random
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Sequence

import attrs

from rllab.errors import RllabError
from rllab.training import export

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: 95% two-sided intervals."""
DROPPED_MODEL_KEYS = ("path", "sha256", "tiny", "warm_start", "lora", "strategy", "world_size", "cpu_offload", "collective_timeout_s")
"""``[model]`` settings of the run that describe how it trained, not the model evaluated (a
directory of plain weights, on one process)."""


# --------------------------------------------------------------------------- intervals


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / n`` (``(nan, nan)`` for n = 0)::

        (p + z²/2n ± z·sqrt(p(1−p)/n + z²/4n²)) / (1 + z²/n)
    """
    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 ≤ successes ≤ n, got successes={successes}, n={n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap(values: Sequence[float], *, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values`` (one per problem): the
    ``(1−level)/2`` and ``(1+level)/2`` quantiles (nearest rank) of the means of ``resamples``
    resamples with replacement, drawn with ``seed``."""
    n = len(values)
    if n == 0:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[max(0, math.ceil((1 - level) / 2 * resamples) - 1)]
    hi = means[min(resamples - 1, math.ceil((1 + level) / 2 * resamples) - 1)]
    return (lo, hi)


# --------------------------------------------------------------------------- targets


@attrs.frozen
class Target:
    """What ``rllab eval`` evaluates: a model directory and the config its evaluation runs under."""

    model_dir: Path | None
    """None: the tiny model of ``config`` (warm-started on its task)."""
    data: dict
    """The config (TOML data) before the command line's overrides."""
    label: str
    step: int | None = None
    """The run's step, for a run directory's checkpoint."""


def _toml(path: Path) -> dict:
    return tomllib.loads(Path(path).read_text(encoding="utf-8"))


def _as_model(data: dict, model_dir: Path) -> dict:
    """``data`` with ``model.path = model_dir`` and without the run's training-only model settings."""
    data = dict(data)
    model = {k: v for k, v in dict(data.get("model", {})).items() if k not in DROPPED_MODEL_KEYS}
    data["model"] = {**model, "path": str(Path(model_dir).resolve())}
    data.pop("provenance", None)
    return data


def resolve_target(target: str | None, *, step: int | None = None, lab: Any, tmp: Path, progress: bool = False) -> Target:
    """The :class:`Target` of ``target`` (see the module notes); a run's checkpoint is exported under ``tmp``."""
    if target is None:
        if step is not None:
            raise RllabError("--step picks a run directory's checkpoint: give the run directory too (rllab eval RUN_DIR --step N)")
        return Target(model_dir=None, data={}, label="the configured model")
    path = Path(target)
    if not path.exists():
        raise RllabError(f"{target} does not exist: give a run directory, a model directory (rllab export writes one), "
                         "or model.path=DIR")
    if export.is_run_dir(path):
        ckpt = export.run_checkpoint(path, step)
        at = int(ckpt.name.rpartition("_")[2])
        final = path / export.MODEL_DIR
        data = _toml(path / "config.toml")
        if (final / "config.json").is_file() and _final_step(path) == at:
            model_dir = final  # the finished run's final model, already written
        else:
            model_dir, at = export.export_run(path, tmp / "model", step=at, lab=lab, progress=progress)
        return Target(model_dir=model_dir, data=data, label=f"{path} after step {at}", step=at)
    if step is not None:
        raise RllabError(f"--step picks a run directory's checkpoint; {target} is not a run directory (no config.toml and checkpoints/)")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise RllabError(f"{target} is neither a run directory (config.toml, checkpoints/) nor a model directory (config.json)")
    if (path / export.CONFIG_NAME).is_file():
        data = _toml(path / export.CONFIG_NAME)
    elif (path.parent / "config.toml").is_file() and path.name == export.MODEL_DIR:
        data = _toml(path.parent / "config.toml")  # RUN_DIR/model
    else:
        data = {}
    return Target(model_dir=path, data=data, label=str(path))


def _final_step(run_dir: Path) -> int | None:
    import json

    final = Path(run_dir) / "final.json"
    try:
        return int(json.loads(final.read_text())["steps"]) if final.is_file() else None
    except (ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------- evaluation


def _evaluator_class():
    from rllab.training.trainer import Trainer

    class Evaluator(Trainer):
        """The trainer's construction, without the models only training needs (reference, critic)."""

        def _ensure_models(self) -> None:
            return None

    return Evaluator


def evaluate(target: str | None, overrides: Sequence[str] = (), *, step: int | None = None, samples: int | None = None,
             show: int = 0, lab: Any = None, progress: bool = False) -> dict:
    """Evaluate ``target`` (see :func:`resolve_target`) under its config and ``overrides``.

    Returns ``{"target", "model_dir", "task", "metrics", "intervals", "problems", "samples"}``:
    ``metrics`` as a run logs them (``eval/accuracy``, ``eval/reward``, ``eval/n``, with
    ``samples``: ``eval/mean@n``, ``eval/pass@k``), ``intervals`` their 95% intervals over problems,
    ``samples`` the first ``show`` greedy episodes (prompt, completion, reward, solved)."""
    from rllab.config import apply_schedule, load_config
    from rllab.lab import Lab
    from rllab.models.forward import transformers_progress_bars_off
    from rllab.rollout.evalmetrics import pass_at_k, report_ks

    lab = lab or Lab()
    if samples is not None and samples < 1:
        raise RllabError(f"--samples must be at least 1, got {samples}")
    with tempfile.TemporaryDirectory(prefix="rllab-eval-") as tmp:
        t = resolve_target(target, step=step, lab=lab, tmp=Path(tmp), progress=progress)
        data = _as_model(t.data, t.model_dir) if t.model_dir is not None else t.data
        cfg = load_config(data, list(overrides), lab=lab)
        for entry in cfg.schedule:  # the run's settings in force at that step
            if t.step is not None and entry.step < t.step:
                cfg = apply_schedule(cfg, entry, lab=lab)
        cfg = attrs.evolve(cfg, loggers=(), schedule=(), rollout=attrs.evolve(cfg.rollout, max_staleness=0))
        n = cfg.train.eval_samples if samples is None else samples
        with transformers_progress_bars_off():
            trainer = _evaluator_class()(cfg, lab=lab, run_dir=Path(tmp) / "run", progress=progress)
        try:
            rollout = trainer.rollout
            metrics = rollout.evaluate(cfg.train.eval_size, samples=n)
            episodes = list(rollout.eval_episodes or [])
            per_problem = getattr(rollout, "eval_problems", None) or {}  # greedy solved and sampled counts, per problem
            solved = list(per_problem.get("solved") or [int(rollout._solved_episode(e)) for e in episodes])
            correct = list(per_problem.get("sampled_correct") or [])
            shown = [{"prompt": _text(e.example.prompt), "answer": getattr(e.example, "answer", None),
                      "completion": _completion(rollout.tokenizer, e), "reward": float(e.reward),
                      "solved": bool(rollout._solved_episode(e))} for e in episodes[:max(0, show)]]
        finally:
            trainer.close()
    intervals = {"eval/accuracy": wilson(sum(solved), len(solved))}
    if n and correct:
        intervals[f"eval/mean@{n}"] = bootstrap([c / n for c in correct])
        for k in report_ks(n):
            intervals[f"eval/pass@{k}"] = bootstrap([pass_at_k(n, c, k) for c in correct])
    return {
        "target": t.label,
        "model_dir": str(t.model_dir) if t.model_dir is not None else None,
        "step": t.step,
        "task": cfg.component(cfg.source).name,
        "solved_when": rollout.solved_rule,
        "metrics": {k: v for k, v in metrics.items() if k.startswith("eval/")},
        "intervals": {k: list(v) for k, v in intervals.items()},
        "problems": len(solved),
        "samples": shown,
    }


def _text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"[{m.get('role')}] {m.get('content')}" for m in prompt)


def _completion(tokenizer: Any, episode: Any) -> str:
    """The episode's model text: its turns' decoded texts, else its response tokens decoded."""
    if episode.texts:
        return "\n".join(episode.texts)
    return tokenizer.decode(list(episode.completion.token_ids), skip_special_tokens=True)
