"""The sglang rollout backend: :class:`SGLangBackend`, the parts put together.

``generate(prompts, params)`` splits the prompts into requests of ``prompts_per_request`` (the
body: :mod:`~rllab_backends.sglang.protocol`), sent concurrently, at most ``max_in_flight`` at a
time, spread round-robin over ``urls``, on kept-alive HTTP/1.1 connections
(:mod:`~rllab_backends.sglang.wire`); a step that fits one request sends it on a blocking socket
in the caller's thread. Failed requests are retried (:mod:`~rllab_backends.sglang.transport`; the
rows of a timed-out seeded request are first stopped with ``/abort_request``). A sample SGLang
aborts (``finish_reason`` ``abort`` with no status or a retryable one: a preempted, paused or
evicted request) is resubmitted on its own — the request's other samples are kept — in a request
of just the aborted samples (``n = 1`` each, with the seed the full request gave it), at most
``abort_retries`` times per sample; every aborted sample is counted (``sglang/aborted``). An abort
with a client-error status (the input is too long) is not resubmitted. When retries run out the
whole ``generate`` call fails: a partial batch is never returned, so the run stops (and says whether
a checkpoint lets ``--resume`` continue it). ``update_weights`` pushes the policy by the ``weight_sync`` route
(:mod:`~rllab_backends.sglang.sync`); ``launch`` starts a server (:mod:`~rllab_backends.sglang.launch`).

Staleness: every completion carries SGLang's ``weight_version`` (and ``weight_versions``
spans, when the weights changed mid-request). One that differs from the version last pushed is
stale: ``stale = "drop"`` removes it, ``"keep"`` keeps it, ``"error"`` stops the run; every case
is counted in :meth:`SGLangBackend.last_metrics` (``rollout/stale`` …), so no stale sample is
trained on silently. With ``push = "pause"`` pushes land while requests are in flight: a
completion's version is then its *oldest* (the first span's; without spans, the version when the
``generate`` began), any version pushed since the ``generate`` began is fresh, and completions
that span a push are counted (``sglang/mixed_version_samples``).
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import functools
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from rllab.types import Completion, RolloutBackend, SamplingParams

from . import partial, protocol, wire
from .config import SGLangBackendConfig, parse_urls
from .errors import (
    RETRYABLE_STATUS,
    Retry,
    SGLangAbortError,
    SGLangError,
    SGLangRequestError,
    SGLangWeightSyncError,
    StaleSampleError,
)
from .launch import Launch
from .score import Score
from .protocol import error_message, parse_rows
from .sync import WeightSync, _is_path
from .transport import Loop, Transport


class SGLangBackend(Transport, WeightSync, Launch, Score, RolloutBackend):
    """Rollouts from SGLang servers (see the module docstring and docs/sglang.md)."""

    def __init__(self, config: SGLangBackendConfig):
        self.config = config
        self.urls: list[str] = list(parse_urls(config.urls))
        self.admin_urls: list[str] = list(parse_urls(config.admin_urls))
        self.version: str | None = None
        """The weight version last pushed; completions from any other are stale (None: not checked)."""
        self._syncs = 0
        self._rr = 0
        self._requests = 0
        self._process: subprocess.Popen | None = None
        self._own_sync_dir = config.sync_dir is None
        self._metrics: dict[str, float] = {}
        self._sync_metrics: dict[str, float] = {}
        self._totals = {"stale": 0, "retries": 0, "aborted": 0, "mixed": 0, "flush_deferred": 0}
        self._flush_due = False  # push = "pause", pause_mode = "in_place": the prefix cache holds old KV
        self._lane: SGLangBackend | None = None  # push = "pause": the pushes' own loop and connections
        self._newest: str | None = None  # push = "pause": the version being pushed (a request may end with it first)
        self._submitted: str | None = None  # the version when the current generate began
        self._loop = Loop()
        self._group = None  # weight_sync = "distributed": rank 0 of the servers' weight-update group
        self._no_sessions: set[str] = set()  # servers without /begin_weight_update (before sglang 0.5.2x)
        self._session: wire.Client | None = None
        self._sem: asyncio.Semaphore | None = None
        # a private snapshot directory goes on every exit path: close(), a failed launch here, and
        # interpreter exit for a run that dies without close() (snapshots are model-sized)
        self.sync_dir = Path(config.sync_dir or tempfile.mkdtemp(prefix="rllab-sglang-"))
        self._remove_sync_dir = functools.partial(shutil.rmtree, self.sync_dir, ignore_errors=True)
        if self._own_sync_dir:
            atexit.register(self._remove_sync_dir)
        if config.launch and config.model_path is not None:
            try:
                self._launch(config.model_path, "0")
            except BaseException:
                self.close()
                raise
            self.version = "0"

    # -- generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions per prompt, grouped: prompt 0's n first (``prompt_index`` set)."""
        prompts = [tuple(map(int, p)) for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"sglang backend: prompt {i} is empty")
        if not self.urls:
            raise SGLangError("sglang backend has no server yet: launch needs model_path or update_weights(model) first")
        t0 = time.perf_counter()
        retries0, aborted0, mixed0 = self._totals["retries"], self._totals["aborted"], self._totals["mixed"]
        deferred0 = self._totals["flush_deferred"]
        self._submitted = submitted = self.version
        if self._flush_due:
            self._flush_prefix_cache()
        if len(prompts) <= self.config.prompts_per_request:
            completions = self._generate_one(prompts, params)
        else:
            completions = self._loop.run(self._generate(prompts, params))
        if self.config.push == "pause" and submitted is not None:
            # pushes land meanwhile: a completion's (oldest) version is any one pushed since submission
            newest = max(int(submitted), int(self.version), int(self._newest or submitted))
            fresh = {str(v) for v in range(int(submitted), newest + 1)}
            expected = f"one of {sorted(fresh, key=int)} (pushed since this generate began)"
            wanted = expected
        else:
            fresh, expected, wanted = {self.version}, repr(self.version), f"the last pushed {self.version!r}"
        stale = [] if submitted is None else [c for c in completions if c.weight_version not in fresh]
        if stale and self.config.stale == "error":
            raise StaleSampleError(
                f"sglang: {len(stale)} of {len(completions)} completions were sampled with weight_version "
                f"{sorted({str(c.weight_version) for c in stale})}, not {wanted}"
            )
        self._totals["stale"] += len(stale)
        kept = completions
        if stale and self.config.stale == "drop":
            kept = [c for c in completions if c.weight_version in fresh]
            if not kept:
                raise StaleSampleError(
                    f"sglang: every completion was stale (weight_version {sorted({str(c.weight_version) for c in stale})}, "
                    f"expected {expected}); is every server in admin_urls?"
                )
        self._metrics = {
            "rollout/stale": float(len(stale)),
            "rollout/stale_dropped": float(len(completions) - len(kept)),
            "rollout/stale_total": float(self._totals["stale"]),
            "sglang/retries": float(self._totals["retries"] - retries0),
            "sglang/aborted": float(self._totals["aborted"] - aborted0),
            "sglang/aborted_total": float(self._totals["aborted"]),
            "sglang/requests": float(self._requests),
            "time/sglang_generate": time.perf_counter() - t0,
        }
        if self.config.push == "pause":
            self._metrics["sglang/mixed_version_samples"] = float(self._totals["mixed"] - mixed0)
            self._metrics["sglang/mixed_version_total"] = float(self._totals["mixed"])
            self._metrics["sglang/flush_deferred"] = float(self._totals["flush_deferred"] - deferred0)
        return kept

    def generate_until(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, caps: Sequence[int],
                       groups: Sequence[int], needed: int) -> list[Completion]:
        """Partial rollouts: one request per group, the rows still running stopped with
        ``/abort_request`` once ``needed`` groups are complete (:mod:`~rllab_backends.sglang.partial`)."""
        if params.n != 1 or len(caps) != len(prompts) or len(groups) != len(prompts):
            raise ValueError(f"sglang backend: generate_until takes n = 1 (got {params.n}) and one cap and group per prompt "
                             f"({len(caps)} caps, {len(groups)} groups for {len(prompts)} prompts)")
        if not self.urls:
            raise SGLangError("sglang backend has no server yet: launch needs model_path or update_weights(model) first")
        t0, aborted0 = time.perf_counter(), self._totals["aborted"]
        self._submitted = self.version
        out = self._loop.run(partial.generate_until(self, [tuple(map(int, p)) for p in prompts], params, caps, groups, needed))
        self._metrics = {"sglang/aborted": float(self._totals["aborted"] - aborted0), "sglang/requests": float(self._requests),
                         "time/sglang_generate": time.perf_counter() - t0}
        return out

    def _generate_one(self, prompts: list[tuple[int, ...]], params: SamplingParams) -> list[Completion]:
        """A step that fits one request (the default): its first try runs in this thread on a
        blocking socket, with no event loop; a failed first try goes on in the loop's retries."""
        self._requests = 1
        what, attempt, blocking_attempt, rids = self._request(prompts, 0, params)
        start = self._rr
        self._rr += 1
        url = self.urls[start % len(self.urls)]
        try:
            out, aborted = blocking_attempt(url)
        except Retry as e:
            failed = e
        else:
            return self._loop.run(self._resubmit(prompts, 0, params, out, aborted)) if aborted else out

        async def retries():
            if failed.kind == "timeout" and params.seed is not None:
                await self._abort(url, rids())
            out, aborted = await self._with_retries(what, attempt, self.urls, first=(start, failed))
            return await self._resubmit(prompts, 0, params, out, aborted)

        return self._loop.run(retries())

    async def _generate(self, prompts: list[tuple[int, ...]], params: SamplingParams) -> list[Completion]:
        self._client()
        k = self.config.prompts_per_request
        jobs = [self._generate_request(prompts[s : s + k], s, params) for s in range(0, len(prompts), k)]
        self._requests = len(jobs)
        tasks = [asyncio.ensure_future(j) for j in jobs]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [c for r in results for c in r]

    def request_body(self, prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams,
                     samples: list[tuple[int, int]] | None = None) -> tuple[dict, list[int]]:
        """The ``/generate`` body for ``prompts`` (or only their ``samples``, ``(prompt offset,
        sample)`` pairs) and the prompt (offset) of every row it returns."""
        return protocol.request_body(prompts, first_index, params, processed=self.config.logprobs == "processed",
                                     samples=samples)

    def _request(self, prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams,
                 samples: list[tuple[int, int]] | None = None):
        """One ``/generate`` request: ``(what, attempt, blocking_attempt, rids)``, its description,
        one try of it on a server (``await attempt(url)`` in the event loop, or
        ``blocking_attempt(url)`` in this thread), and the row ids of the last try. A try returns
        ``(completions, aborts)``: one completion per row and ``(row, message, status)`` of each
        row SGLang aborted (to resubmit). ``samples``: only these (a resubmission)."""
        body, rows = self.request_body(prompts, first_index, params, samples)
        what = f"/generate for prompts {first_index}..{first_index + len(prompts) - 1}"
        if samples is not None:
            what = f"/generate resubmitting {len(samples)} aborted samples of prompts {first_index}..{first_index + len(prompts) - 1}"
        sampled = self.config.logprobs == "processed"

        def rids() -> list[str]:  # SGLang names row i "<rid>_<i>"
            return [f"{body['rid']}_{i}" for i in range(len(rows))]

        def answer(url: str, status: int, raw: bytes) -> tuple[list[Completion], list[tuple[int, str, int | None]]]:
            if status != 200:
                msg = error_message(raw)
                if status in RETRYABLE_STATUS:
                    raise Retry("status", f"{url}/generate: HTTP {status}: {msg}", status, msg)
                raise SGLangRequestError(
                    f"sglang: {url}/generate rejected the request (HTTP {status}): {msg}", status=status, message=msg
                )
            mixed: list[int] = []
            out, aborted = parse_rows(raw, prompts, rows, first_index, f"{url}/generate", sampled,
                                      oldest=self.config.push == "pause", submitted=self._submitted, mixed=mixed)
            self._totals["mixed"] += len(mixed)
            for _, msg, st in aborted:
                if st is not None and 400 <= int(st) < 500 and int(st) not in RETRYABLE_STATUS:
                    raise SGLangAbortError(
                        f"sglang: {url} aborted {len(aborted)} of {len(rows)} samples (status {st}): {msg}"
                    )
            return out, aborted

        def blocking_attempt(url: str):
            body["rid"] = uuid.uuid4().hex
            return answer(url, *self._call_blocking("POST", url, "/generate", body))

        async def attempt(url: str):
            assert self._sem is not None
            body["rid"] = uuid.uuid4().hex
            try:
                async with self._sem:
                    status, raw = await self._call("POST", url, "/generate", body)
            except Retry as e:
                if e.kind == "timeout" and params.seed is not None:
                    await self._abort(url, rids())
                raise
            return answer(url, status, raw)

        return what, attempt, blocking_attempt, rids

    async def _generate_request(self, prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams):
        what, attempt, _, _ = self._request(prompts, first_index, params)
        out, aborted = await self._with_retries(what, attempt, self.urls)
        return await self._resubmit(prompts, first_index, params, out, aborted)

    async def _resubmit(self, prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams,
                        out: list[Completion], aborted: list[tuple[int, str, int | None]]) -> list[Completion]:
        """Replace the aborted rows of a request's answer ``out`` (row k: sample ``k % n`` of prompt
        ``k // n``, the request's order) by resubmitting only them, each at most
        ``abort_retries`` times; every aborted row counts in ``sglang/aborted``."""
        samples = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
        pending = [k for k, _, _ in aborted]
        tries = 1
        while pending:
            self._totals["aborted"] += len(pending)
            if tries > self.config.abort_retries:
                raise SGLangAbortError(
                    f"sglang: {len(pending)} of {len(samples)} samples of prompts {first_index}..{first_index + len(prompts) - 1} "
                    f"were aborted on every one of {tries} tries (abort_retries = {self.config.abort_retries}); no partial "
                    f"batch is returned (the run stops here): {aborted[0][1]}"
                )
            tries += 1
            what, attempt, _, _ = self._request(prompts, first_index, params, [samples[k] for k in pending])
            got, aborted = await self._with_retries(what, attempt, self.urls)
            for k, c in zip(pending, got):
                out[k] = c
            pending = [pending[j] for j, _, _ in aborted]
        return out

    async def _abort(self, url: str, rids: list[str]) -> None:
        """Best effort: ask ``url`` to stop rows we gave up on (a timed-out request), so a retry
        does not run beside them. Exact rids only: SGLang ignores rids it does not know, and with
        ``n > 1`` it renames rows, so only seeded (one row per sample) requests are aborted."""
        for rid in rids:
            try:
                await self._call("POST", url, "/abort_request", {"rid": rid}, timeout=5.0)
            except Retry:
                return

    # -- weights

    def update_weights(self, model: Any) -> dict[str, float]:
        """Push ``model``'s weights to every server; later completions must carry the new version.

        ``model`` is the policy (a ``transformers`` module: saved with ``save_pretrained``) or a
        model directory the servers can read. ``weight_sync`` picks the route (module docstring).
        Returns the sync's metrics for the step it follows: ``time/weight_sync``,
        ``sglang/weight_version``, ``sglang/sync_mib``.
        """
        t0 = time.perf_counter()
        self._sync_bytes = 0
        version = str(self._syncs + 1)
        if isinstance(model, Mapping):
            raise SGLangWeightSyncError("sglang backend: give update_weights the policy module or a model directory, not a state dict")
        if self.config.launch and self._process is None:
            path = self._snapshot(model, version)
            self._launch(str(path), version)
        else:
            lane = self._push_lane()
            self._newest = version
            lane._sync_bytes = 0
            if self.config.weight_sync == "tensor" and not _is_path(model):
                lane._loop.run(lane._paused(lambda: lane._sync_tensor(model, version)))
            elif self.config.weight_sync == "distributed" and not _is_path(model):
                lane._loop.run(lane._paused(lambda: lane._sync_distributed(model, version)))
            else:  # "disk", or a model directory (any weight_sync): the servers load it themselves
                path = self._snapshot(model, version)
                lane._loop.run(lane._paused(lambda: lane._sync_disk(str(path), version)))
                self._prune(keep=path)
            self._sync_bytes = lane._sync_bytes
            self._flush_due = not self._flush_cache()  # an in-place push could not flush: the next batch does
        self._syncs += 1
        self.version = version
        self._sync_metrics = {"time/weight_sync": time.perf_counter() - t0, "sglang/weight_version": float(self._syncs)}
        if self._sync_bytes:
            self._sync_metrics["sglang/sync_mib"] = self._sync_bytes / 2**20
        return dict(self._sync_metrics)

    def _flush_prefix_cache(self) -> None:
        """After an in-place push (``pause_mode = "in_place"``, which cannot flush), before the
        next ``generate`` sends anything: ``POST /flush_cache`` on every admin server, so that no
        new request reuses prefix KV computed with the old weights. SGLang flushes only an idle
        server — between two batches it is, unless another client is using it; a refusal (or a
        server that does not answer) leaves the flush due for the next ``generate`` and counts in
        ``sglang/flush_deferred``."""
        self._flush_due = False
        for u in self.admin_urls or self.urls:
            try:
                status, _ = self._call_blocking("POST", u, "/flush_cache")
            except Retry:
                status = None
            if status != 200:
                self._flush_due = True
                self._totals["flush_deferred"] += 1

    def _push_lane(self) -> "SGLangBackend":
        """Who makes a push: this backend (``push = "drain"``), or with ``push = "pause"`` a
        shallow copy of it with an event loop and connections of its own (made on the first push
        after a launch), so that a push can run while another thread is inside ``generate``."""
        if self.config.push != "pause":
            return self
        if self._lane is None:
            lane = copy.copy(self)
            lane._session, lane._sem, lane._loop, lane._lane = None, None, Loop(), None
            self._lane = lane
        return self._lane

    @property
    def pushes_in_flight(self) -> bool:
        """A push leaves the requests in flight running (``push = "pause"``): asynchronous
        rollouts then sync the weights without waiting for the batch being sampled."""
        return self.config.push == "pause"

    def follow_weights(self) -> dict[str, float]:
        """Count a weight update another process pushed to the same servers (rank 0 of a
        data-parallel run, after its ``update_weights``): later completions must carry its
        version. Sends nothing."""
        self._syncs += 1
        self.version = str(self._syncs)
        return {"sglang/weight_version": float(self._syncs)}

    # -- the rest of the protocol

    def last_metrics(self) -> dict[str, float]:
        """Counters of the last ``generate`` (namespaced, for the step's log): ``rollout/stale``,
        ``rollout/stale_dropped``, ``rollout/stale_total``, ``sglang/retries``, ``sglang/aborted``
        (aborted samples, each resubmitted), ``sglang/aborted_total``, ``sglang/requests``,
        ``time/sglang_generate``; with ``push = "pause"`` also ``sglang/mixed_version_samples``
        (completions that span a push) and ``sglang/mixed_version_total``. The weight sync's own
        metrics are ``update_weights``' return value."""
        return dict(self._metrics)

    def _close_connections(self) -> None:
        """Leave the weight-update group (best effort), close the connections and the loop."""
        if self._group is not None and self._session is not None and not self._loop.loop.is_closed():
            for u in self.admin_urls or self.urls:  # best effort: the servers may be gone already
                try:
                    self._loop.run(self._call("POST", u, "/destroy_weights_update_group", {"group_name": self._group.group_name}, timeout=10.0))
                except Retry:
                    pass
        self._drop_group()
        if self._session is not None and not self._loop.loop.is_closed():
            self._loop.run(self._session.close())
            self._session = None
        self._loop.close()

    def close(self) -> None:
        """Close connections, stop a launched server and remove a private snapshot directory —
        the last two whatever the first steps raise."""
        try:
            lane, self._lane = self._lane, None
            try:
                if lane is not None:
                    lane._close_connections()
            finally:
                self._close_connections()
        finally:
            try:
                self._stop_process()
            finally:
                if self._own_sync_dir:
                    self._remove_sync_dir()
                    atexit.unregister(self._remove_sync_dir)


def sglang(*, config: SGLangBackendConfig) -> SGLangBackend:
    """SGLang servers over HTTP: token-id /generate, weight sync after each step, retries, staleness checks."""
    return SGLangBackend(config)
