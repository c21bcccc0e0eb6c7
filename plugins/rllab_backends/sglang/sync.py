"""Weights to the servers (``update_weights(policy)``, after every optimizer step) — ``weight_sync``:

- ``"disk"``: ``save_pretrained`` (safetensors) into a fresh directory under ``sync_dir``,
  renamed into place atomically, then ``POST /update_weights_from_disk`` on every server in
  ``admin_urls`` with ``weight_version`` set to the client's counter.
- ``"tensor"``: a colocated server (same node, CUDA): ``/begin_weight_update`` →
  ``/update_weights_from_tensor`` with CUDA-IPC handles (one payload per TP rank) →
  ``/end_weight_update``. A CPU policy is refused: its tensors cannot cross processes by handle.
- ``"distributed"``: ``torch.distributed`` broadcast (:mod:`rllab_backends.sglang.distributed`). On the
  first update the trainer hosts a rendezvous at ``distributed_address:distributed_port`` and asks
  every server in ``admin_urls`` to join (``/init_weights_update_group``; server ``i``'s TP ranks are
  ``1 + i·tp_size …``); each update is ``/begin_weight_update`` → ``/update_weights_from_distributed``
  (names, dtypes, shapes) while the trainer broadcasts every tensor in the same order →
  ``/end_weight_update``. ``distributed_backend = "nccl"`` needs the policy on CUDA and servers
  that can reach this machine; ``"gloo"`` sends CPU tensors. A failed broadcast is not retried (the
  group is left half-way): the run stops with the server's message.

Admin calls are retried on transport faults and 503 (a server busy loading) like ``/generate``.

``push`` says what happens to the requests in flight. ``"drain"``: SGLang's update takes its
model-update writer lock, so it waits until every request in flight has finished, and flushes the
cache. ``"pause"``: every server in ``admin_urls`` gets ``POST /pause_generation {"mode":
pause_mode}`` first (its requests stop where they are and new ones wait; an update on a paused
server skips the writer lock), then the route's calls, then ``POST /continue_generation`` (also
after a failed update): the requests in flight go on with the new weights, and SGLang reports each
one's ``weight_versions`` spans. With ``pause_mode = "in_place"`` the requests keep their KV cache,
so the update is sent with ``flush_cache: false`` (SGLang refuses to flush a cache that running
requests hold: the update would fail; the backend's next ``generate`` flushes instead, before its
requests); ``"retract"`` moves them back to the queue, so the cache is
flushed and their KV recomputed with the new weights when they resume. The pushes of ``"pause"``
run on a lane of their own (event loop and connections), so that they can be made while another
thread is inside ``generate``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

from .errors import (
    RETRYABLE_STATUS,
    Retry,
    SGLangError,
    SGLangRequestError,
    SGLangTimeoutError,
    SGLangUnavailableError,
    SGLangWeightSyncError,
)
from .launch import free_port
from .protocol import error_message


def tensor_payload(model: Any) -> str:
    """``model``'s named tensors as SGLang's ``update_weights_from_tensor`` takes them over HTTP:
    a base64 ``ForkingPickler`` payload of ``[(name, tensor), ...]``, in which CUDA tensors
    travel as IPC handles (so the server must be on the same node). CPU tensors are refused."""
    import io
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # noqa: F401 - registers the tensor reductions

    named = [(n, p.detach()) for n, p in model.state_dict().items()]
    cpu = [(n, t.device) for n, t in named if t.device.type != "cuda"]
    if cpu:
        raise SGLangWeightSyncError(
            f"weight_sync = 'tensor' needs the policy on CUDA on the server's node ({cpu[0][0]} is on "
            f"{cpu[0][1]}): SGLang receives CUDA-IPC handles. Use weight_sync = 'disk'"
        )
    buf = io.BytesIO()
    ForkingPickler(buf).dump(named)
    torch.cuda.synchronize()
    return base64.b64encode(buf.getvalue()).decode()


def _is_path(model: Any) -> bool:
    """``model`` is a model directory (a path), not a module."""
    return isinstance(model, (str, bytes)) or hasattr(model, "__fspath__")


class WeightSync:
    """The three weight-sync routes of :class:`~rllab_backends.sglang.backend.SGLangBackend` (a
    part of it, beside :class:`~rllab_backends.sglang.transport.Transport`). Uses the backend's
    ``config``, ``urls``, ``admin_urls``, ``sync_dir``, ``_group`` (the distributed route's
    weight-update group, made on first use), ``_no_sessions`` (servers without
    ``/begin_weight_update``) and sets ``_sync_bytes`` (bytes broadcast)."""

    def _snapshot(self, model: Any, version: str) -> Path:
        """``model`` saved as safetensors in ``sync_dir/v<version>``, written under a temporary
        name and renamed, so a server never reads a half-written directory."""
        if _is_path(model):
            return Path(os.fsdecode(model)).resolve()
        final = self.sync_dir / f"v{version}"
        tmp = self.sync_dir / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
        from rllab.models.forward import transformers_progress_bars_off

        try:
            with transformers_progress_bars_off():  # a sync per step: no "Writing model shards" bar each time
                model.save_pretrained(tmp, safe_serialization=True)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final.resolve()

    def _prune(self, keep: Path) -> None:
        for p in self.sync_dir.glob("v*"):
            if p.resolve() != keep and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    async def _admin(self, url: str, path: str, body: dict, what: str, missing_ok: bool = False) -> dict | None:
        """POST an admin route with retries on transport faults and 503; ``success: false`` raises;
        a route the server does not have (HTTP 404) gives None with ``missing_ok``."""

        async def attempt(u: str) -> dict | None:
            status, raw = await self._call("POST", u, path, body)
            if status == 404 and missing_ok:
                return None
            if status in RETRYABLE_STATUS:
                msg = error_message(raw)
                raise Retry("status", f"{u}{path}: HTTP {status}: {msg}", status, msg)
            try:
                data = json.loads(raw) if raw.strip() else {}
            except ValueError:
                data = {"message": raw.decode("utf-8", "replace")}
            if status != 200 or (isinstance(data, Mapping) and data.get("success") is False):
                msg = error_message(raw)
                raise SGLangWeightSyncError(f"sglang: {what} failed on {u} (HTTP {status}): {msg}")
            return data if isinstance(data, dict) else {}

        try:
            return await self._with_retries(f"{what} on {url}", attempt, [url])
        except (SGLangUnavailableError, SGLangTimeoutError, SGLangRequestError) as e:
            raise SGLangWeightSyncError(str(e)) from e

    def _flush_cache(self) -> bool:
        """Whether an update asks SGLang to flush its cache: not while requests stay in place."""
        return not (self.config.push == "pause" and self.config.pause_mode == "in_place")

    async def _paused(self, route) -> None:
        """``await route()`` (a route's coroutine function); with ``push = "pause"`` between
        ``/pause_generation`` and ``/continue_generation`` on every target (module docstring)."""
        if self.config.push != "pause":
            return await route()
        targets = self.admin_urls or self.urls
        paused: list[str] = []
        try:
            for u in targets:
                what = f"/pause_generation (push = 'pause', pause_mode = {self.config.pause_mode!r})"
                if await self._admin(u, "/pause_generation", {"mode": self.config.pause_mode}, what, missing_ok=True) is None:
                    raise SGLangWeightSyncError(
                        f"sglang: {u} has no /pause_generation (HTTP 404), which push = 'pause' needs (an SGLang server "
                        f"with in-place pausing, e.g. 0.5.23); use push = 'drain'"
                    )
                paused.append(u)
            await route()
        except BaseException:
            for u in paused:  # never leave a server paused; the update's own error is the one raised
                with contextlib.suppress(Exception):
                    await self._admin(u, "/continue_generation", {}, "/continue_generation")
            raise
        for u in paused:
            await self._admin(u, "/continue_generation", {}, "/continue_generation")

    async def _sync_disk(self, path: str, version: str) -> None:
        self._client()
        body = {"model_path": path, "weight_version": version, "flush_cache": self._flush_cache(), "abort_all_requests": False}
        targets = self.admin_urls or self.urls
        await asyncio.gather(*(self._admin(u, "/update_weights_from_disk", body, "/update_weights_from_disk") for u in targets))

    async def _begin(self, url: str) -> bool:
        """Open a weight-update session on ``url`` (SGLang ≥ 0.5.2x refuses tensor and distributed
        updates outside one); False on a server that predates the route (HTTP 404)."""
        if url in self._no_sessions:
            return False
        if await self._admin(url, "/begin_weight_update", {}, "/begin_weight_update", missing_ok=True) is None:
            self._no_sessions.add(url)
            return False
        return True

    @contextlib.asynccontextmanager
    async def _weight_update_sessions(self, targets: list[str]):
        """Every target inside ``/begin_weight_update`` … ``/end_weight_update`` (where it has them)."""
        opened = []
        try:
            for u in targets:
                if await self._begin(u):
                    opened.append(u)
            yield
        finally:
            for u in opened:
                await self._admin(u, "/end_weight_update", {}, "/end_weight_update")

    async def _sync_tensor(self, model: Any, version: str) -> None:
        payload = tensor_payload(model)
        self._client()
        targets = self.admin_urls or self.urls
        body = {"serialized_named_tensors": [payload] * self.config.tp_size, "weight_version": version, "flush_cache": self._flush_cache()}
        async with self._weight_update_sessions(targets):
            for u in targets:
                await self._admin(u, "/update_weights_from_tensor", body, "/update_weights_from_tensor")

    async def _once(self, url: str, path: str, body: dict) -> dict:
        """One admin POST, no retry (a broadcast cannot be replayed half-way); failure raises."""
        try:
            status, raw = await self._call("POST", url, path, body)
        except Retry as e:
            raise SGLangWeightSyncError(f"sglang: {path} on {url}: {e}") from None
        try:
            data = json.loads(raw) if raw.strip() else {}
        except ValueError:
            data = {}
        if status != 200 or (isinstance(data, Mapping) and data.get("success") is False):
            raise SGLangWeightSyncError(f"sglang: {path} failed on {url} (HTTP {status}): {error_message(raw)}")
        return data if isinstance(data, dict) else {}

    async def _together(self, what: str, blocking, posts: list) -> Any:
        """Run ``blocking()`` (a rendezvous or a broadcast) in a thread while ``posts`` are open;
        the first failure raises (a hung peer ends at ``timeout_s``, the group's own timeout)."""
        from .distributed import in_thread

        loop = asyncio.get_running_loop()
        side = in_thread(loop, blocking)
        tasks = [asyncio.ensure_future(p) for p in posts]
        try:
            done = await asyncio.gather(side, *tasks)
        except BaseException as e:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if isinstance(e, SGLangError):
                raise
            raise SGLangWeightSyncError(f"sglang: {what} failed on the trainer's side: {type(e).__name__}: {e}") from e
        return done[0]

    async def _sync_distributed(self, model: Any, version: str) -> None:
        from .distributed import WeightGroup, describe, named_weights, route_address

        c = self.config
        self._client()
        targets = self.admin_urls or self.urls
        named = named_weights(model, c.distributed_dtype)
        if c.distributed_backend == "nccl":
            devices = sorted({str(p.device) for p in model.parameters() if p.device.type != "cuda"})
            if devices:
                raise SGLangWeightSyncError(
                    f"sglang: weight_sync = 'distributed' with distributed_backend = 'nccl' needs the policy on CUDA "
                    f"(it is on {devices}); set [model] device = \"cuda\", distributed_backend = \"gloo\", or weight_sync = \"disk\""
                )
        if self._group is None:
            for u in targets:
                await self._check_parallelism(u)
            group = WeightGroup(
                address=c.distributed_address or route_address(targets),
                port=c.distributed_port or free_port(),
                world_size=1 + c.tp_size * len(targets),
                group_name=f"rllab-{uuid.uuid4().hex[:8]}",
                backend=c.distributed_backend,
                timeout_s=c.timeout_s,
            )
            joins = [
                self._once(u, "/init_weights_update_group", {
                    "master_address": group.address, "master_port": group.port, "rank_offset": 1 + i * c.tp_size,
                    "world_size": group.world_size, "group_name": group.group_name, "backend": group.backend,
                })
                for i, u in enumerate(targets)
            ]
            await self._together(f"joining the weight-update group at {group.address}:{group.port}", group.join, joins)
            self._group = group
        body = {**describe(named), "group_name": self._group.group_name, "weight_version": version, "flush_cache": self._flush_cache()}
        async with self._weight_update_sessions(targets):
            try:
                posts = [self._once(u, "/update_weights_from_distributed", body) for u in targets]
                self._sync_bytes = await self._together("broadcasting the weights", lambda: self._group.send(named), posts)
            except BaseException:
                self._drop_group()  # half-way through a broadcast the group is unusable
                raise

    async def _check_parallelism(self, url: str) -> None:
        """Refuse before anyone blocks on a rendezvous: a server whose tensor-parallel size is not
        ``tp_size`` would leave the group short of a rank (or over it) until ``timeout_s``, and
        SGLang takes distributed updates only with one data-parallel rank. Servers that do not
        report their arguments are trusted."""
        info = None
        for path in ("/server_info", "/get_server_info"):
            try:
                status, raw = await self._call("GET", url, path, timeout=min(30.0, self.config.timeout_s))
            except Retry:
                return
            if status == 200:
                try:
                    info = json.loads(raw)
                except ValueError:
                    info = None
                break
        if not isinstance(info, dict):
            return
        tp, dp = info.get("tp_size"), info.get("dp_size")
        if isinstance(tp, int) and tp != self.config.tp_size:
            raise SGLangWeightSyncError(
                f"sglang: {url} runs with tp_size {tp} but the backend's tp_size is {self.config.tp_size}: "
                f"set backend.tp_size = {tp} (each of its tensor-parallel ranks joins the weight-update group)"
            )
        if isinstance(dp, int) and dp > 1:
            raise SGLangWeightSyncError(
                f"sglang: {url} runs with dp_size {dp}; SGLang takes weight_sync = 'distributed' only with one "
                f"data-parallel rank: run one server per replica (list them in admin_urls) or use weight_sync = 'disk'"
            )

    def _drop_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            try:
                group.close()
            except Exception:  # noqa: BLE001 - best effort on a broken group
                pass
