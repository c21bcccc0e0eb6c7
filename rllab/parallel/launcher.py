"""``torchrun``'s environment: the rank, world size and local rank it gives each process it
starts, read and checked (:func:`launcher_env`). Read by the load-time launcher check
(:func:`rllab.checks.config.check_launcher`) and when the process group starts
(:func:`rllab.parallel.distributed.env_world`)."""

from __future__ import annotations

import os
from typing import Mapping

from rllab.errors import ConfigError


def launcher_env(environ: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, world size, local rank) from ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``); (0, 1, 0) without it. A ``WORLD_SIZE`` that is not a whole number ≥ 1 is
    refused, and when it is above 1 so is a ``RANK`` missing, malformed or outside
    ``0 … WORLD_SIZE - 1`` and a malformed ``LOCAL_RANK``."""
    env = os.environ if environ is None else environ

    def whole(name: str, default: int, low: int) -> int:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or value < low:
            raise ConfigError(
                f"{name}={raw!r} in the environment is not a whole number ≥ {low}; torchrun sets it for each process it "
                f"starts: unset it to run one process, or start the run with `torchrun --nproc-per-node N -m rllab run ...`",
                key=name,
            )
        return value

    world = whole("WORLD_SIZE", 1, 1)
    if world == 1:  # one process: RANK and LOCAL_RANK (left by another tool) name nothing, except the GPU torchrun gave it
        local = env.get("LOCAL_RANK", "0").strip()
        return 0, 1, int(local) if local.isdigit() else 0
    rank, local = whole("RANK", 0, 0), whole("LOCAL_RANK", 0, 0)
    if world > 1 and (env.get("RANK") is None or rank >= world):
        got = "no RANK" if env.get("RANK") is None else f"RANK={rank}"
        raise ConfigError(
            f"WORLD_SIZE={world} in the environment but {got}: each of the {world} processes needs its own RANK "
            f"(0 … {world - 1}); start the run with `torchrun --nproc-per-node {world} -m rllab run ...`, which sets them",
            key="RANK",
        )
    return rank, world, local
