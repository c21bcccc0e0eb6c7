"""``weight_sync = "distributed"``: the trainer broadcasts every tensor to SGLang's ranks.

SGLang's side (``/init_weights_update_group``, ``/update_weights_from_distributed``) joins a
``torch.distributed`` group of its own, apart from any default group: the rendezvous is a TCP store
at ``tcp://master_address:master_port`` hosted by rank 0 (the trainer), keyed under the group's
name, and each server's tensor-parallel rank ``t`` joins as ``rank_offset + t``. On an update the
server allocates ``torch.empty(shape, dtype)`` for every name in the request, in order, and
receives each one by ``broadcast(src=0)``; the trainer must broadcast the same tensors in the same
order *while* the HTTP call is open (both sides block). :class:`WeightGroup` is the trainer's rank 0
of such a group, created the way the server creates its side, so the two meet in the same store
keys; it works with ``nccl`` (CUDA tensors, the production route) and ``gloo`` (CPU tensors: how
the tests exercise the whole protocol against a stand-in server in another process).
"""

from __future__ import annotations

import datetime
import socket
import threading
from typing import Any, Callable
from urllib.parse import urlsplit

__all__ = ["WeightGroup", "named_weights", "route_address", "wire_dtype_name"]

_BUCKET_BYTES = 1 << 30
"""Most bytes of converted tensors held at once while their broadcasts are in flight."""


def route_address(urls: list[str]) -> str:
    """The address servers at ``urls`` reach this machine by: 127.0.0.1 when they are all local,
    else the local address of the interface that routes to the first remote one."""
    hosts = [urlsplit(u).hostname or "127.0.0.1" for u in urls]
    remote = [h for h in hosts if h not in ("127.0.0.1", "localhost", "::1")]
    if not remote:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent: connect() on UDP only routes
        s.connect((remote[0], 9))
        return s.getsockname()[0]


def wire_dtype_name(dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (SGLang calls ``getattr(torch, name)``)."""
    return str(dtype).removeprefix("torch.")


def named_weights(model: Any, dtype: str = "model") -> list[tuple[str, Any, Any]]:
    """``model``'s state dict as ``[(name, tensor, wire dtype)]`` in order, a tied tensor once
    (under its first name, as ``save_pretrained`` keeps it); the wire dtype is the tensor's own
    with ``"model"``. Nothing is copied here: :meth:`WeightGroup.send` casts each tensor as it
    goes, so a cast copy of a large model never exists all at once."""
    import torch

    seen: set[tuple[int, int]] = set()
    out = []
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key not in seen:
            seen.add(key)
            out.append((name, t.detach(), t.dtype if dtype == "model" else getattr(torch, dtype)))
    return out


def describe(named: list[tuple[str, Any, Any]]) -> dict:
    """The ``names``, ``dtypes`` and ``shapes`` fields of ``/update_weights_from_distributed``."""
    return {
        "names": [n for n, _, _ in named],
        "dtypes": [wire_dtype_name(d) for _, _, d in named],
        "shapes": [list(t.shape) for _, t, _ in named],
    }


class WeightGroup:
    """Rank 0 of SGLang's weight-update group (see the module docstring).

    ``join`` and ``send`` block (they wait for the servers), so the backend runs them in a daemon
    thread beside its HTTP calls: :func:`in_thread`.
    """

    def __init__(self, *, address: str, port: int, world_size: int, group_name: str, backend: str, timeout_s: float):
        self.address, self.port, self.world_size = address, port, world_size
        self.group_name, self.backend = group_name, backend
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.pg = None

    def join(self) -> None:
        """Host the rendezvous store and create the group (returns once every rank has joined)."""
        from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

        store, rank, world = next(rendezvous(f"tcp://{self.address}:{self.port}", 0, self.world_size, timeout=self.timeout))
        store.set_timeout(self.timeout)
        # the same keys as SGLang's side: a store prefixed with the group's name, a group of its own
        store = PrefixStore(self.group_name, store)
        pg, _ = _new_process_group_helper(world, rank, [], Backend(self.backend), store, group_name=self.group_name, timeout=self.timeout)
        _world.pg_group_ranks[pg] = {i: i for i in range(world)}
        self.pg = pg

    def send(self, named: list[tuple[str, Any, Any]]) -> int:
        """Broadcast every tensor from rank 0, in order; returns the bytes sent."""
        import torch.distributed as dist

        if self.pg is None:
            raise RuntimeError("send before join")
        pending, held, sent = [], 0, 0
        for _, t, dtype in named:
            x = t.to(dtype).contiguous()
            pending.append((dist.broadcast(x, src=0, group=self.pg, async_op=True), x))
            held += x.numel() * x.element_size()
            sent += x.numel() * x.element_size()
            if held >= _BUCKET_BYTES:
                for work, _x in pending:
                    work.wait()
                pending, held = [], 0
        for work, _x in pending:
            work.wait()
        if self.backend == "nccl":
            import torch

            torch.cuda.synchronize()
        return sent

    def close(self) -> None:
        import torch.distributed as dist

        pg, self.pg = self.pg, None
        if pg is not None:
            dist.destroy_process_group(pg)


def in_thread(loop, fn: Callable[[], Any]):
    """An asyncio future for ``fn()`` run in a daemon thread (one blocked on a rendezvous that will
    never complete must not keep the interpreter from exiting)."""
    fut = loop.create_future()

    def run():
        try:
            outcome = (fn(), None)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(_settle, fut, *outcome)
        except RuntimeError:  # the caller gave up and closed its loop (e.g. the server refused to join)
            pass

    threading.Thread(target=run, daemon=True, name="rllab-sglang-weights").start()
    return fut


def _settle(fut, value, error):
    if fut.cancelled():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
