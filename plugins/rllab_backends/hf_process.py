"""The ``hf`` backend with ``process = true``: the same sampler in a child process.

In-process sampling shares Python's GIL with the trainer: with asynchronous rollouts
(``rollout.max_staleness``) on a small model, whose steps are mostly Python overhead, the
producer thread and the trainer partly take turns instead of overlapping. Here the sampler
(:class:`rllab_backends.hf.HFBackend`, unchanged, handed in by the ``hf`` factory) runs in a
spawned child process; ``generate``
sends the prompts through a pipe and waits for the completions (the caller's thread releases the
GIL meanwhile). On a 2-core machine that other jobs keep busy this measured no faster than the
thread (benchmarks/README.md, "Asynchronous rollouts"): it helps only where a core is free.

Weights (CPU): the first ``update_weights(module)`` sends the child a copy of the module whose
tensors live in shared memory; later calls copy the new weights into those same tensors
(``load_state_dict``), so a sync is one memory copy and nothing crosses the pipe. The child must
not be sampling while the weights are copied: the trainer never syncs during ``generate`` (the
synchronous loop, and :class:`rllab.rollout.asynchronous.VersionedBackend`'s lock). On CUDA the copy is
sent whole at every sync (CUDA tensors travel as IPC handles). A model directory or a state dict
is forwarded to the child as it is.

Sampling is the in-process sampler's, so completions, log-probs and ``weight_version`` are the
same for the same seed and thread count (the child computes with the torch threads its
environment gives it — ``OMP_NUM_THREADS`` — or ``num_threads``).
"""

from __future__ import annotations

import copy
import multiprocessing as mp
from typing import Any, Callable, Mapping

import torch
import torch.multiprocessing  # noqa: F401  (registers the pickling of tensors in shared memory)

import rllab


def _serve(conn, config, make_backend: Callable[[Any], Any]) -> None:
    """The child: an in-process backend (``make_backend(config)`` with ``process = false``:
    an :class:`~rllab_backends.hf.HFBackend`) answering ``(method, args)`` messages."""
    import attrs

    backend = make_backend(attrs.evolve(config, process=False))
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if method == "close":
            conn.send(("ok", None))
            return
        try:
            if method == "set_model":  # a module whose tensors are shared with the parent: sample from it as it is
                backend.model = None
                backend._set_model(args[0])
                out = None
            elif method == "set_version":
                backend.version = out = args[0]
            else:
                out = getattr(backend, method)(*args)
            conn.send(("ok", out))
        except BaseException as e:  # the parent raises it
            conn.send(("error", e))


class ProcessHFBackend(rllab.RolloutBackend):
    """An :class:`~rllab_backends.hf.HFBackend` in a child process (see the module docstring).

    ``make_backend``: the in-process backend's class (or a picklable factory), which the child
    calls with ``config`` (``process = false``)."""

    def __init__(self, config: Any, make_backend: Callable[[Any], Any]):
        self.config = config
        self.version = 0
        self._shared = None
        """The child's weights, whose tensors the parent writes (CPU float32), else None."""
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        self._in_place = config.dtype == "float32" and (auto if config.device == "auto" else config.device) == "cpu"
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, config, make_backend), name="rllab-hf-sampler", daemon=True)
        self._proc.start()
        child.close()
        if config.model_path is not None:
            self._call("update_weights", config.model_path)
            self.version = 0

    def _call(self, method: str, *args):
        try:
            self._conn.send((method, args))
            status, out = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            raise rllab.RllabError(
                f"hf backend (process = true): the sampler process stopped (exit code {self._proc.exitcode}) during {method}: {e!r}"
            ) from None
        if status == "error":
            raise out
        return out

    def generate(self, prompts, params):
        return self._call("generate", [list(p) for p in prompts], params)

    def update_weights(self, model: Any) -> None:
        self.version += 1
        if isinstance(model, (str, bytes, Mapping)) or hasattr(model, "__fspath__"):
            self._call("update_weights", model)
            return
        if self._shared is not None:
            with torch.no_grad():
                self._shared.load_state_dict(model.state_dict())
            self._call("set_version", self.version)
            return
        copied = copy.deepcopy(model).eval()
        for p in copied.parameters():
            p.requires_grad_(False)
        in_place = self._in_place and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in copied.state_dict().values())
        if in_place:
            copied.share_memory()
            self._shared = copied
        self._call("set_model", copied)
        self._call("set_version", self.version)

    def last_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._call("close")
            except rllab.RllabError:
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.terminate()
        self._conn.close()
        self._shared = None
