"""Data-parallel reductions: the one place a global quantity crosses ranks.

A run under ``torchrun`` (``model.strategy = "fsdp2"``) gives each rank whole groups of the step's
prompts; every quantity that an algorithm or a component computes over *the batch* — the token
and row counts that normalise a loss, the whitening moments of an advantage estimator, the
metrics — must then be the same on every rank and equal to what one process computes on the
whole batch. They go through a :class:`Reducer`::

    reducer = ctx.reducer                       # on the RunContext; SINGLE in one process
    tokens = reducer.sum(mask.sum())            # Σ over ranks (identity when world_size == 1)

A component (a pure function of tensors) reads the run's reducer with :func:`current`; the
trainer installs it around each step with :func:`reducing`. In one process :data:`SINGLE` is
installed: every reduction returns its argument unchanged, so single-process numbers are exactly
those of a run without this module.

Process groups come from ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``): :func:`init_from_env` starts gloo on CPU and NCCL on CUDA.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from typing import Any, Callable, Iterator, Mapping

import attrs
import torch

from rllab.errors import RllabError
from rllab.launcher import launcher_env


@attrs.frozen(kw_only=True)
class Reducer:
    """Sums over the ranks of the default process group (``world_size`` 1: the identity)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Whether this rank writes the run's files and console (rank 0)."""
        return self.rank == 0

    def sum(self, value: Any) -> Any:
        """``value`` summed over ranks: a tensor (any shape, a new tensor) or a Python number."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        if isinstance(value, torch.Tensor):
            out = value.detach().clone()
            dist.all_reduce(out)
            return out
        out = torch.tensor(float(value), dtype=torch.float64)
        dist.all_reduce(out)
        return int(out.item()) if isinstance(value, int) and not isinstance(value, bool) else float(out.item())

    def max(self, value: float) -> float:
        """The largest ``value`` over ranks."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        out = torch.tensor(float(value), dtype=torch.float64)
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return float(out.item())

    def mean_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Each metric averaged over the ranks that report it (a new dict, same keys as rank 0's
        plus any only other ranks report)."""
        if self.world_size == 1:
            return dict(metrics)
        gathered = self.gather({k: float(v) for k, v in metrics.items()})
        out: dict[str, float] = {}
        for key in dict.fromkeys(k for g in gathered for k in g):
            values = [g[key] for g in gathered if key in g]
            out[key] = sum(values) / len(values)
        return out

    def reduce_outcome(self, outcome: Any) -> Any:
        """A step's :class:`rllab.optimizer.StepOutcome` with its metrics averaged over ranks and
        its KL measure averaged (its sample count summed): the same on every rank."""
        if self.world_size == 1:
            return outcome
        kl = outcome.kl
        if kl is not None:
            kl = attrs.evolve(kl, value=self.mean_metrics({"kl": kl.value})["kl"], samples=int(self.sum(kl.samples)))
        return attrs.evolve(outcome, metrics=self.mean_metrics(outcome.metrics), kl=kl)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
        if self.world_size == 1:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object) on every rank."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def main_first(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on rank 0, then on the other ranks (a cache rank 0 fills, the others read)."""
        if self.is_main:
            out = fn()
        self.barrier()
        if not self.is_main:
            out = fn()
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()


SINGLE = Reducer()
"""The reducer of a single-process run: every reduction is the identity."""

_CURRENT: contextvars.ContextVar[Reducer] = contextvars.ContextVar("rllab_reducer", default=SINGLE)


def current() -> Reducer:
    """The reducer of the step being run (:data:`SINGLE` outside a data-parallel step)."""
    return _CURRENT.get()


@contextlib.contextmanager
def reducing(reducer: Reducer) -> Iterator[Reducer]:
    """Install ``reducer`` as :func:`current` for the block (the trainer wraps each step)."""
    token = _CURRENT.set(reducer)
    try:
        yield reducer
    finally:
        _CURRENT.reset(token)


def name_rank(error: BaseException, reducer: Reducer) -> None:
    """Prefix ``error``'s message with the rank it was raised on (data parallel only), so that the
    report ``torchrun`` prints when it stops the other ranks names it."""
    if reducer.world_size > 1 and error.args and isinstance(error.args[0], str) and not error.args[0].startswith("rank "):
        error.args = (f"rank {reducer.rank} of {reducer.world_size}: {error.args[0]}", *error.args[1:])


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
    malformed one is refused (:func:`rllab.launcher.launcher_env`)."""
    return launcher_env()


def init_from_env(*, device_type: str, expected: int | None = None) -> Reducer:
    """Join (or reuse) the default process group that ``torchrun`` describes; its :class:`Reducer`.

    ``device_type``: ``"cpu"`` starts gloo, ``"cuda"`` NCCL. ``expected``: the world size the
    config asks for (``model.world_size``); a different number of processes is refused, naming both.
    """
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
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
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


def is_sharded(model: Any) -> bool:
    """Whether ``model`` is an FSDP2 module (its parameters are DTensor shards)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed support
        return False
    return isinstance(model, FSDPModule)


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; an explicit CUDA device must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RllabError(f"model.device = {name!r} but CUDA is not available here (torch {torch.__version__}); use device = \"cpu\" or \"auto\"")
    return dev
