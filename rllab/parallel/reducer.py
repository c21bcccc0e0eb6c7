"""Data-parallel reductions: the one place a global quantity crosses ranks.

A run under ``torchrun`` (``model.strategy = "fsdp2"``) gives each rank whole groups of the step's
prompts; every quantity an algorithm or a component computes over *the batch* (the counts that
normalise a loss, the whitening moments of an estimator, the metrics) must be the same on every
rank and equal to what one process computes on the whole batch. It goes through a
:class:`Reducer`::

    tokens = ctx.reducer.sum(mask.sum())        # in an algorithm: Σ over ranks (identity in one process)
    reducer = current_reducer()                 # in a component (a pure function of tensors)

The trainer installs the run's reducer around each step with :func:`reducing`; in one process
:data:`SINGLE` is installed and every reduction returns its argument unchanged. Process groups
are started by :mod:`rllab.parallel.distributed`.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, Mapping

import attrs
import torch


@attrs.frozen(kw_only=True)
class Reducer:
    """Sums over the ranks of the default process group (``world_size`` 1: the identity)."""

    rank: int = 0
    world_size: int = 1
    slow_group: Any = attrs.field(default=None, eq=False, repr=False)
    """A process group with a long timeout (:data:`SLOW_WAIT_S`) for :meth:`barrier` ``(slow=True)``:
    the ranks waiting on rank 0's one-time work; None: the default group."""

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
        """A step's :class:`rllab.training.optimizer.StepOutcome` with its metrics averaged over ranks and
        its KL measure averaged (its sample count summed): the same on every rank."""
        if self.world_size == 1:
            return outcome
        kl = outcome.kl
        if kl is not None:
            kl = attrs.evolve(kl, value=self.mean_metrics({"value": kl.value})["value"], samples=int(self.sum(kl.samples)))
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
        self.barrier(slow=True)  # rank 0 may build for minutes (a warm start): not a stuck collective
        if not self.is_main:
            out = fn()
        return out

    def barrier(self, *, slow: bool = False) -> None:
        """Wait for every rank. ``slow``: the others wait on rank 0's one-time work (a cache it
        builds, weights it pushes to servers), under :data:`SLOW_WAIT_S` rather than the run's
        ``model.collective_timeout_s``."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.slow_group if slow else None)


SLOW_WAIT_S = 2 * 3600.0
"""The limit of a slow :meth:`Reducer.barrier` (rank 0 building a warm start, pushing weights)."""


SINGLE = Reducer()
"""The reducer of a single-process run: every reduction is the identity."""

_CURRENT: contextvars.ContextVar[Reducer] = contextvars.ContextVar("rllab_reducer", default=SINGLE)


def current_reducer() -> Reducer:
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
