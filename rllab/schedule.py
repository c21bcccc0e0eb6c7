"""What a config's ``[[schedule]]`` entries may change (:data:`FROZEN_DURING_A_RUN`), and the load-time
checks that each entry can do something."""

from __future__ import annotations

from rllab.errors import ConfigError

__all__ = ["FROZEN_DURING_A_RUN", "check_schedule_applies"]

FROZEN_DURING_A_RUN = {
    "model": "the model is built once",
    "task": "the task's data order is fixed for the run",
    "env": "the environment's data order is fixed for the run",
    "backend": "the rollout backend is started once",
    "algorithm.name": "the algorithm owns the run's data (pairs, buffers); its knobs may change",
    "train.seed": "every step's data derives from the seed",
    "train.steps": "extend a run with `rllab run --resume RUN_DIR train.steps=N`",
    "train.lr_schedule": "the schedule's shape is fixed; schedule train.lr instead",
    "train.warmup_steps": "the schedule's shape is fixed; schedule train.lr instead",
    "output_dir": "the run directory exists already",
    "name": "the run directory exists already",
    "loggers": "loggers are opened once",
    "plugins": "plugins load before the run",
}
"""Keys a ``[[schedule]]`` entry may not change, and why."""


def _schedule_key(key: str) -> str:
    """The setting a schedule key names: ``policy_loss`` and ``policy_loss.name`` are one."""
    return key[: -len(".name")] if key.endswith(".name") and key.count(".") == 1 else key


def check_schedule_applies(schedule, *, steps: int, where: str) -> None:
    """Refuse ``[[schedule]]`` entries that would do nothing: one that sets nothing, one at a step
    the run never reaches (a run of ``train.steps`` = N applies entries at steps 0 … N−1), and two
    entries at one step that set the same key (the later would silently replace the earlier)."""
    seen: dict[tuple[int, str], int] = {}
    for i, entry in enumerate(schedule):
        if not entry.set:
            raise ConfigError(f"{where}: schedule entry at step {entry.step} sets nothing; give it a 'set' table or remove it",
                              key="schedule")
        if entry.step >= steps:
            raise ConfigError(
                f"{where}: schedule entry at step {entry.step} (set {dict(entry.set)!r}) can never apply: train.steps = "
                f"{steps} runs steps 0 … {steps - 1}. Raise train.steps or move the entry.",
                key="schedule",
            )
        for key in entry.set:
            k = (entry.step, _schedule_key(key))
            if k in seen:
                first = schedule[seen[k]]
                raise ConfigError(
                    f"{where}: two schedule entries at step {entry.step} set {k[1]!r} ({dict(first.set)!r} and "
                    f"{dict(entry.set)!r}): only the later would apply. Merge them into one entry.",
                    key="schedule",
                )
            seen[k] = i
