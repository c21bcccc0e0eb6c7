"""Data-parallel processes: the ``torchrun`` process group, each rank's console, the device.

The reductions themselves (:class:`rllab.reducer.Reducer`, :data:`~rllab.reducer.SINGLE`,
:func:`~rllab.reducer.current_reducer`, :func:`~rllab.reducer.reducing`) are part of what an
algorithm and its components see and live in the kernel (:mod:`rllab.reducer`); they are
importable from here too.

Process groups come from ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``): :func:`init_from_env` starts gloo on CPU and NCCL on CUDA.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from rllab.reducer import SINGLE, Reducer, current_reducer, reducing  # noqa: F401  (re-exported: where they were)
from rllab.errors import RllabError
from rllab.parallel.launcher import launcher_env
from rllab.models.forward import is_sharded  # noqa: F401  (re-exported: where it was)

current = current_reducer
"""The reducer of the step being run (:func:`rllab.reducer.current_reducer`)."""


def name_rank(error: BaseException, reducer: Reducer) -> None:
    """Prefix ``error``'s message with the rank it was raised on (data parallel only), so that the
    report ``torchrun`` prints when it stops the other ranks names it."""
    if reducer.world_size > 1 and error.args and isinstance(error.args[0], str) and not error.args[0].startswith("rank "):
        error.args = (f"rank {reducer.rank} of {reducer.world_size}: {error.args[0]}", *error.args[1:])


def is_collective_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a collective that waited past the process group's timeout (gloo's
    ``Timed out waiting …ms``, torch's ``DistBackendError``/``DistTimeoutError``)."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistTimeoutError", None), getattr(dist, "DistBackendError", None)) if k is not None)
    if kinds and isinstance(error, kinds):
        return True
    return isinstance(error, RuntimeError) and "Timed out waiting" in str(error) and _collective_frames(error.__traceback__)[1] is not None


def _collective_frames(tb) -> tuple[list[str], str | None]:
    """From a traceback: the qualified names of the last rllab frames before torch.distributed was
    entered, and the first torch.distributed function entered (None: the error is not from one)."""
    ours: list[str] = []
    entered = None
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename.replace("\\", "/")
        if "/torch/distributed/" in path:
            if entered is None:
                entered = code.co_name
        elif entered is None and ("/rllab/" in path or "/plugins/" in path or "/rllab_" in path):
            ours.append(getattr(code, "co_qualname", code.co_name))
        tb = tb.tb_next
    return ours, entered


def explain_timeout(error: BaseException, *, reducer: Reducer, where: str, limit_s: float | None) -> None:
    """Rewrite a collective timeout's message (in place) to name the rank, the step and the call
    that waited: the rank that never reached the same collective, or died, is the other one."""
    if reducer.world_size <= 1 or not error.args or not isinstance(error.args[0], str) or not is_collective_timeout(error):
        return
    if "waited more than" in error.args[0]:
        return
    ours, entered = _collective_frames(error.__traceback__)
    call = " → ".join([*ours[-3:], entered or "?"])
    limit = f"{limit_s:g} s" if limit_s is not None else "the process group's timeout"
    error.args = (
        f"waited more than {limit} (model.collective_timeout_s) for the other ranks in a collective {where}, "
        f"in {call}: another rank never reached the same collective (it waits in a different one, or died); "
        f"the other ranks' errors name where they wait. ({error.args[0].strip()})",
        *error.args[1:],
    )


class _Prefixed:
    """A text stream whose every line starts with ``prefix``; everything else is the stream's."""

    def __init__(self, stream: Any, prefix: str):
        self._stream, self._prefix, self._fresh = stream, prefix, True

    def write(self, text: str) -> int:
        out = []
        for i, part in enumerate(text.split("\n")):
            if i:
                out.append("\n")
                self._fresh = True
            if part:
                if self._fresh:
                    out.append(self._prefix)
                    self._fresh = False
                out.append(part)
        self._stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def prefix_output(reducer: Reducer) -> None:
    """On a rank other than 0, start every line this process prints (stdout, stderr: warnings,
    tracebacks, ``error:`` lines) with ``[rank R]``; rank 0 owns the console and prints plainly."""
    if reducer.is_main:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _Prefixed):
            setattr(sys, name, _Prefixed(stream, f"[rank {reducer.rank}] "))


def env_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from ``torchrun``'s environment; (0, 1, 0) without it. A
    malformed one is refused (:func:`rllab.parallel.launcher.launcher_env`)."""
    return launcher_env()


def init_from_env(*, device_type: str, expected: int | None = None, timeout_s: float | None = None) -> Reducer:
    """Join (or reuse) the default process group that ``torchrun`` describes; its :class:`Reducer`.

    ``device_type``: ``"cpu"`` starts gloo, ``"cuda"`` NCCL. ``expected``: the world size the
    config asks for (``model.world_size``); a different number of processes is refused, naming both.
    ``timeout_s`` (``model.collective_timeout_s``): the longest one collective may wait for the
    other ranks; gloo then raises in the waiting call (:func:`explain_timeout` names it), NCCL's
    watchdog stops the process. A group that already exists keeps its own timeout.
    """
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world, local = env_world()
        if "MASTER_ADDR" not in os.environ and world == 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RllabError(
                f"model.strategy = 'fsdp2' with WORLD_SIZE={world} needs {', '.join(missing)} in the environment: "
                "start it with `torchrun --nproc-per-node N -m rllab run ...`"
            )
        if device_type == "cuda":
            torch.cuda.set_device(local)
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world, timeout=timeout)
    if expected is not None and expected != world:
        raise RllabError(
            f"model.world_size = {expected} but this run has {world} process(es) (WORLD_SIZE={world}); "
            f"start it with `torchrun --nproc-per-node {expected}` (per node) or set model.world_size = {world}"
        )
    reducer = Reducer(rank=rank, world_size=world)
    prefix_output(reducer)
    return reducer


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; an explicit CUDA device must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RllabError(f"model.device = {name!r} but CUDA is not available here (torch {torch.__version__}); use device = \"cpu\" or \"auto\"")
    return dev
