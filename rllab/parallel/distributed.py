"""Data-parallel processes: the ``torchrun`` process group, each rank's console, the device.

The reductions themselves (:class:`rllab.parallel.reducer.Reducer`, :data:`~rllab.parallel.reducer.SINGLE`,
:func:`~rllab.parallel.reducer.current_reducer`, :func:`~rllab.parallel.reducer.reducing`) are part of what an
algorithm and its components see and live in the kernel (:mod:`rllab.parallel.reducer`); they are
importable from here too.

Process groups come from ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``): :func:`init_from_env` starts gloo on CPU and NCCL on CUDA.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from rllab.parallel.reducer import SINGLE, Reducer, current_reducer, reducing  # noqa: F401  (re-exported: where they were)
from rllab.errors import RllabError
from rllab.parallel.launcher import launcher_env
from rllab.models.forward import is_sharded  # noqa: F401  (re-exported: where it was)

current = current_reducer
"""The reducer of the step being run (:func:`rllab.parallel.reducer.current_reducer`)."""


def name_rank(error: BaseException, reducer: Reducer) -> None:
    """Prefix ``error``'s message with the rank it was raised on (data parallel only), so that the
    report ``torchrun`` prints when it stops the other ranks names it."""
    if reducer.world_size > 1 and error.args and isinstance(error.args[0], str) and not error.args[0].startswith("rank "):
        error.args = (f"rank {reducer.rank} of {reducer.world_size}: {error.args[0]}", *error.args[1:])


class CollectiveError(RllabError):
    """A rank that waited in a collective past ``model.collective_timeout_s``, or whose peer
    stopped while it waited: the message names the step and the call it waited in."""


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


_WRAPPERS = {"wrapper", "inner", "_fn", "fn", "decorate_context", "_call_impl", "_wrapped_call_impl"}


def _collective_frames(tb) -> tuple[list[str], str | None]:
    """From a traceback: the qualified names of the rllab frames before torch.distributed was
    entered, and the torch.distributed calls, in words (None: the error is not from one):
    ``_pre_forward … all_gather_into_tensor`` for an FSDP forward, ``all_reduce`` for a reduction."""
    ours: list[str] = []
    theirs: list[str] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename.replace("\\", "/")
        if "/torch/distributed/" in path:
            if code.co_name not in _WRAPPERS and not path.endswith("c10d_logger.py"):  # logging and hook wrappers are not the call
                theirs.append(code.co_name)
        elif not theirs and ("/rllab/" in path or "/plugins/" in path or "/rllab_" in path):
            ours.append(getattr(code, "co_qualname", code.co_name))
        tb = tb.tb_next
    if not theirs:
        return ours, None
    return ours, theirs[0] if len(theirs) == 1 else f"{theirs[0]} … {theirs[-1]}"


def collective_error(error: BaseException, *, reducer: Reducer, where: str, limit_s: float | None) -> CollectiveError | None:
    """A :class:`CollectiveError` for ``error`` when it is a collective that timed out (gloo's
    ``Timed out waiting …``, torch's ``DistTimeoutError``) or whose peer went away while this rank
    waited; None for any other error. The message names the step (``where``) and the call, so the
    ranks' errors together show which collective one of them never reached."""
    import torch.distributed as dist

    if reducer.world_size <= 1 or isinstance(error, RllabError):
        return None
    ours, entered = _collective_frames(error.__traceback__)
    text = str(error)
    timed_out = isinstance(error, getattr(dist, "DistTimeoutError", ())) or "Timed out waiting" in text
    if entered is None or not (timed_out or any(sign in text for sign in _PEER_GONE)):
        return None
    call = " → ".join([*ours[-3:], entered])
    detail = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if timed_out:
        limit = f"{limit_s:g} s" if limit_s is not None else "the process group's timeout"
        msg = (f"waited more than {limit} (model.collective_timeout_s) for the other ranks in a collective {where}, in {call}: "
               f"another rank never reached the same collective (it waits in a different one, or died); the other ranks' "
               f"errors name where they wait ({detail})")
    else:
        msg = (f"another rank stopped while this one waited in a collective {where}, in {call} (the first rank's error "
               f"says why) ({detail})")
    return CollectiveError(msg)


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
    slow = None
    if world > 1:  # a gloo group for the waits on rank 0's one-time work (every rank creates it, in the same order)
        from rllab.parallel.reducer import SLOW_WAIT_S

        slow = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(SLOW_WAIT_S, timeout_s or 0.0)))
    reducer = Reducer(rank=rank, world_size=world, slow_group=slow)
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
