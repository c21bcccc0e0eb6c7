"""A stand-in SGLang server for tests: SGLang 0.5.23's HTTP wire format, served from a tiny model.

SGLang itself needs a GPU, so the sglang backend is tested against this instead: a real HTTP
server (``http.server``, one thread per connection, HTTP/1.1 keep-alive) on 127.0.0.1 at a
free port, that samples with rllab's hf backend (whose default log-prob convention is
SGLang's: ``log_softmax(z / T)`` before top-k / top-p) and speaks SGLang's native API:

- ``POST /generate``: every request body is decoded with SGLang's own JSON contract,
  ``sglang/api/v1/api_types.py`` from the installed ``sglang==0.5.23`` wheel, loaded by path
  (``pip install --no-deps sglang==0.5.23 msgspec``); a violation — e.g. an unknown key in
  ``sampling_params`` — is answered ``400 {"error": "<serde text>"}`` as the real server does.
  Every response row is checked against ``GenerateResponse`` before it is sent. ``n > 1`` is
  answered prompt-major; ``sampling_seed`` is honoured (the real server honours it only with
  ``--enable-deterministic-inference``).
- ``logprob_start_len >= 0`` adds ``meta_info.input_token_logprobs`` (prompt log-probs, from the
  model: :mod:`sglang_standin_scoring`); ``max_new_tokens = 0`` answers a prefill only.
- ``GET /health``, ``/health_generate``, ``/get_model_info``, ``/model_info``,
  ``/get_server_info``; ``POST /update_weights_from_disk``, ``/flush_cache``,
  ``/pause_generation``, ``/continue_generation``, ``/begin_weight_update``,
  ``/end_weight_update``, ``/update_weight_version``, ``/abort_request``, ``/get_weights_by_name``;
  ``/init_weights_update_group``, ``/update_weights_from_distributed`` and
  ``/destroy_weights_update_group`` join the trainer's ``torch.distributed`` group and receive
  its broadcasts as SGLang's ModelRunner does (with ``gloo`` here: the real server uses ``nccl``;
  run the stand-in as a separate process for these, as ``launch_knobs`` does). The admin bodies are
  not in api_types.py; their fields below are transcribed from sglang 0.5.23's
  ``srt/managers/io_struct.py`` (``UpdateWeightFromDiskReqInput`` …).

Weight pushes meet the requests in flight as in SGLang 0.5.23: a ``/generate`` holds the
model-update lock (a reader) until it is answered, and an update on a server that is not paused
takes it as the writer — it waits until every request in flight has finished, and new requests
wait behind it. ``/pause_generation`` (modes ``in_place`` and ``retract``; ``abort`` is not
modelled) stops decoding and holds new requests until ``/continue_generation``; an update on a
paused server skips the lock. ``flush_cache`` is refused, after the weights changed, while requests
are running (``in_place``): the update answers ``success: false`` with SGLang's message, and only
the scheduler's version (the spans) moves. Every finished row reports ``weight_versions`` spans
as 0.5.23 does: ``[{"version", "start", "end"}]``, one more span after each version change that
found it with output. With ``token_delay_s > 0`` a request decodes one token per
``token_delay_s`` (all rows of a request together), so that a push can land mid-request: the rest
of each row is then sampled again from what it has, with the new weights (SGLang's ``retract``;
with ``in_place`` the real server keeps the old weights' KV of the tokens so far, which the
stand-in does not model). ``/abort_request`` stops the row of that ``rid`` where it is (rows are named
as SGLang names them: by the body's ``rid`` list, or ``"<rid>_<j>"`` in a batch): it is answered
with its tokens so far and ``finish_reason`` ``{"type": "abort"}``; ``abort_requests`` keeps the bodies.

Faults are injected on demand (:meth:`StandIn.fail_next`, :meth:`delay_next`,
:meth:`abort_next`, :meth:`stale_next`, :meth:`die_after`, :meth:`unavailable_after_update`,
:meth:`fail_update`), or at random: ``abort_rate = p`` aborts each sample with probability ``p``
(seeded by ``abort_seed``), as SGLang reports a request it preempted or evicted — the row's
``finish_reason`` is ``{"type": "abort", "message": ..., "status_code": null, "err_type": null}``
and its output is cut where it stopped; ``aborted`` counts them. The server is bounded: it stops by itself after ``lifetime_s`` seconds or
``max_requests`` requests. Run it as a program to stand in for ``python -m sglang.launch_server``::

    python tests/sglang_standin.py --model-path DIR --port 30000 [--weight-version 0] [--instant 16] [--abort-rate 0.06]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import random
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_CONTRACT = None

# Transcribed from sglang 0.5.23 srt/managers/io_struct.py (these bodies are not in api_types.py).
UPDATE_FROM_DISK_FIELDS = {
    "rid", "model_path", "load_format", "abort_all_requests", "weight_version", "is_async", "torch_empty_cache",
    "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache", "manifest",
}

PAUSE_FIELDS = {"rid", "mode"}
PAUSE_MODES = ("abort", "retract", "in_place")
CONTINUE_FIELDS = {"rid", "torch_empty_cache"}
FLUSH_REFUSED = (
    "Weights were updated, but the cache was not flushed because requests are still running or queued. "
    "Retract or finish them, then call /flush_cache."
)

INIT_GROUP_FIELDS = {"rid", "master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
UPDATE_FROM_DISTRIBUTED_FIELDS = {
    "rid", "names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests", "weight_version",
    "load_format", "selector", "torch_empty_cache",
}

_LOAD_LOCK = threading.Lock()
"""Serialises model loads of every stand-in in this process (several may share one)."""


def contract():
    """SGLang's generated JSON contract (``sglang/api/v1/api_types.py``), loaded by path so that
    importing it does not import SGLang's GPU runtime. None if the wheel is not installed."""
    global _CONTRACT
    if _CONTRACT is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / "api" / "v1" / "api_types.py"
        if not path.exists():
            return None
        mod_spec = importlib.util.spec_from_file_location("_sglang_api_types", path)
        mod = importlib.util.module_from_spec(mod_spec)
        sys.modules["_sglang_api_types"] = mod  # dataclass-like structs resolve their module
        mod_spec.loader.exec_module(mod)
        _CONTRACT = mod
    return _CONTRACT


def launch_knobs(**extra) -> dict:
    """Knobs of the sglang backend that make it launch this stand-in instead of SGLang (for the
    contract suite: ``contract_cases(names=["sglang"], knobs=launch_knobs())``). Without the
    sglang wheel the stand-in runs unvalidated."""  # validate=None: whenever the wheel is there
    cmd = f"{sys.executable} {Path(__file__).resolve()} --model-path {{model_path}} --port {{port}} " \
          f"--weight-version {{weight_version}} --lifetime-s 300"
    return {"launch": True, "launch_command": cmd, "backoff_s": 0.01, "launch_timeout_s": 120.0, **extra}


class _RWLock:
    """SGLang's model-update lock (``aio_rwlock.RWLock``) with threads: readers share it, a writer
    waits for them, and a waiting writer holds new readers back."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = self._waiting = 0
        self._writer = False

    @contextlib.contextmanager
    def reader(self):
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def writer(self):
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


class StandIn:
    """The stand-in server; use as a context manager (``with StandIn(path) as s: s.url``)."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        weight_version: str = "default",
        port: int = 0,
        seed: int = 0,
        lifetime_s: float = 300.0,
        max_requests: int = 100_000,
        instant_tokens: int | None = None,
        validate: bool | None = None,
        abort_rate: float = 0.0,
        abort_seed: int = 0,
        abort_message: str = "Abort in waiting queue",
        token_delay_s: float = 0.0,
    ):
        self.api = contract()
        if self.api is None and validate:
            raise RuntimeError("the stand-in validates against sglang's api_types.py: pip install --no-deps sglang==0.5.23 msgspec")
        self.validate = self.api is not None if validate is None else validate
        """Check bodies against SGLang's contract (default: whenever the sglang wheel is installed)."""
        self.weight_version = weight_version
        self.model_path = None if model_path is None else str(model_path)
        self.instant_tokens = instant_tokens
        if not 0.0 <= abort_rate < 1.0:
            raise ValueError(f"stand-in: abort_rate = {abort_rate!r} must be in [0, 1)")
        self.abort_rate, self.abort_message = abort_rate, abort_message
        self._abort_rng = random.Random(abort_seed)
        self.aborted = 0
        """Samples aborted at random (``abort_rate``) so far."""
        self.abort_requests: list[dict] = []
        """The ``/abort_request`` bodies received, in order."""
        self.abort_rids: set[str] = set()
        """Their rids: a row decoding under one of them stops where it is, answered with its tokens so far
        and ``finish_reason`` ``abort`` (with ``token_delay_s`` = 0 a request is answered before any abort lands)."""
        self.lifetime_s, self.max_requests = lifetime_s, max_requests
        self.requests: list[tuple[str, Any]] = []
        """Every request received: ``(path, JSON body or None)``."""
        self.updates: list[dict] = []
        self.paused = False
        """``/pause_generation`` was called (and not ``/continue_generation`` since)."""
        self.pause_mode: str | None = None
        self.token_delay_s = token_delay_s
        """Seconds per decoded token (0: a request is answered at once)."""
        self.span_version = weight_version
        """The scheduler's version, which the ``weight_versions`` spans name (``weight_version`` is
        the tokenizer's, which ``meta_info.weight_version`` reports: a failed flush moves only this)."""
        self.running = 0
        """Requests decoding now."""
        self._pause_cond = threading.Condition()
        self._rw = _RWLock()
        self._lock = threading.Lock()  # the model and the fault counters
        self._faults: dict[str, list] = {"fail": [], "delay": [], "abort": [], "stale": [], "unavailable": []}
        self._die_after: int | None = None
        self._fail_update: str | None = None
        self._dead = False
        self._backend = None
        self._groups: dict[str, Any] = {}  # weight_sync = "distributed": group name → process group
        self.tp_size, self.dp_size = 1, 1
        """What ``/server_info`` reports (the stand-in itself is one rank)."""
        self._seed = seed
        if model_path is not None and instant_tokens is None:
            self._load(str(model_path))
        self._httpd = _Server(("127.0.0.1", port), self._handler())
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._started = time.monotonic()
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()

    # -- lifecycle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        """Stop listening (new connections are refused) and drop open connections."""
        if self._dead:
            return
        self._dead = True
        threading.Thread(target=self._httpd.shutdown, daemon=True).start()
        self._httpd.server_close()

    def _watch(self):
        while not self._dead:
            if time.monotonic() - self._started > self.lifetime_s or len(self.requests) > self.max_requests:
                self.stop()
            time.sleep(0.2)

    def _load(self, path: str) -> None:
        from rllab_backends.hf import HFBackend, HFBackendConfig

        b = HFBackend(HFBackendConfig(num_threads=1, seed=self._seed, device="cpu"))
        with _LOAD_LOCK:  # transformers' loading patches process-wide state: one load at a time per process
            b.update_weights(path)
        self._backend = b
        self.model_path = path

    # -- faults

    def fail_next(self, status: int, message: str, count: int = 1, path: str = "/generate") -> None:
        """Answer the next ``count`` requests to ``path`` with HTTP ``status`` and SGLang's error body."""
        key = "fail" if path == "/generate" else f"fail:{path}"
        self._faults.setdefault(key, [])
        self._faults[key] += [(status, message)] * count

    def delay_next(self, seconds: float, count: int = 1) -> None:
        """Sleep ``seconds`` before answering the next ``count`` /generate requests."""
        self._faults["delay"] += [seconds] * count

    def abort_next(self, message: str, status_code: int | None = None, count: int = 1) -> None:
        """Finish every row of the next ``count`` /generate answers with ``{"type": "abort"}``."""
        self._faults["abort"] += [(message, status_code)] * count

    def stale_next(self, version: str, count: int = 1, spans: bool = False) -> None:
        """Report ``version`` (or, with ``spans``, a change to the current version mid-request)
        in the next ``count`` /generate answers."""
        self._faults["stale"] += [(version, spans)] * count

    def unavailable_after_update(self, seconds: float) -> None:
        """After the next weight update, answer /generate and /health with 503 for ``seconds``."""
        self._faults["after_update"] = [seconds]

    def die_after(self, served: int) -> None:
        """Serve ``served`` more /generate requests, then drop the next one's connection without an
        answer and stop listening (a server that died mid-rollout)."""
        self._die_after = served

    def fail_update(self, message: str) -> None:
        """Make the next /update_weights_from_disk fail with ``success: false`` and ``message``."""
        self._fail_update = message

    def clear_faults(self) -> None:
        """Forget every fault not yet triggered."""
        with self._lock:
            for q in self._faults.values():
                q.clear()
            self._die_after = self._fail_update = None

    def _unavailable(self) -> bool:
        q = self._faults.get("unavailable")
        return bool(q) and time.monotonic() < q[0]

    def _take(self, name):
        with self._lock:
            return self._faults[name].pop(0) if self._faults.get(name) else None

    # -- generation

    def _rows(self, body: dict) -> list[dict]:
        """Normalise a /generate body as SGLang does (single vs batch, n fan-out) and sample."""
        from rllab.types import SamplingParams

        ids = body.get("input_ids")
        if ids is None:
            raise _HTTPError(400, "stand-in: only input_ids is supported (the server runs with --skip-tokenizer-init)")
        batch = [ids] if ids and isinstance(ids[0], int) else list(ids)
        if not batch or any(not p for p in batch):
            raise _HTTPError(400, "The input_ids is empty.")
        sps = body.get("sampling_params") or {}
        sp_list = sps if isinstance(sps, list) else [sps] * len(batch)
        if len(sp_list) != len(batch):
            raise _HTTPError(400, "The length of sampling_params must equal the batch size.")
        ns = {sp.get("n", 1) for sp in sp_list}
        if len(ns) != 1:
            raise _HTTPError(400, "The n parameter must be the same for all sampling params.")
        n = ns.pop()
        if not body.get("return_logprob"):
            raise _HTTPError(400, "stand-in: rllab always sends return_logprob")
        rows = []
        for p, sp in zip(batch, sp_list):
            params = SamplingParams(
                n=n,
                max_new_tokens=max(1, sp.get("max_new_tokens", 128)),  # 0: a prefill only (below)
                temperature=sp.get("temperature", 1.0),
                top_p=sp.get("top_p", 1.0),
                top_k=sp.get("top_k", -1),
                stop_token_ids=tuple(sp.get("stop_token_ids") or ()),
                seed=sp.get("sampling_seed"),
            )
            if sp.get("max_new_tokens") == 0 and self.instant_tokens is None:  # a prefill only (prompt log-probs)
                rows.extend(_Decoding(tuple(p), (), (), "length", params, None, self.span_version) for _ in range(n))
                continue
            if self.instant_tokens is not None:
                k = min(self.instant_tokens, params.max_new_tokens)
                for _ in range(n):
                    support = ([[5]] * k, [0.0] * k) if body.get("return_sampling_mask") else None
                    rows.append(_Decoding(tuple(p), (5,) * k, (-1.0,) * k, "length", params, support, self.span_version))
                continue
            with self._lock:
                if self._backend is None:
                    raise _HTTPError(400, "stand-in: no model loaded")
                out = self._backend.generate([p], params)
                for c in out:
                    support = self._support(p, c.token_ids, params) if body.get("return_sampling_mask") else None
                    rows.append(_Decoding(tuple(p), c.token_ids, c.log_probs, c.finish_reason, params, support, self.span_version))
        rid = body.get("rid")
        for j, r in enumerate(rows):  # each row's rid, as SGLang names them (a list: one per row; a string: "<rid>_<j>" in a batch)
            r.rid = rid[j] if isinstance(rid, list) and j < len(rid) else rid if len(rows) == 1 else None if rid is None else f"{rid}_{j}"
        self._decode(rows)
        out = [self._row(r) for r in rows]
        starts = body.get("logprob_start_len", -1)
        starts = starts if isinstance(starts, list) else [starts] * len(batch)
        if any(s >= 0 for s in starts):
            try:
                from tests.sglang_standin_scoring import input_token_logprobs
            except ImportError:  # run as a program: tests/ is on sys.path
                from sglang_standin_scoring import input_token_logprobs

            with self._lock:
                if self._backend is None:
                    raise _HTTPError(400, "stand-in: prompt log-probs need a model")
                for k, row in enumerate(out):
                    p, s = batch[k // n], starts[k // n]
                    if s >= 0:
                        try:
                            row["meta_info"]["input_token_logprobs"] = input_token_logprobs(self._backend.model, list(p), s)
                        except ValueError as e:
                            raise _HTTPError(400, str(e)) from None
        return out

    def _decode(self, rows: list["_Decoding"]) -> None:
        """Play the rows' decoding out in time (``token_delay_s`` per token, all rows together),
        stopping while the server is paused; a version change finds each row with ``i`` tokens:
        with ``i > 0`` it records the event (old version, ``i``) as SGLang's scheduler does
        (``record_weight_version_events``), and the rest of the row is sampled again with the new
        weights. A row ends with its spans (``compute_weight_version_spans``) and the tokenizer's
        version at that moment."""
        with self._lock:
            self.running += 1
        try:
            i = 0
            while True:
                if self.token_delay_s:
                    with self._pause_cond:
                        while self.paused and not self._dead:
                            self._pause_cond.wait(0.05)
                version = self.span_version
                for j, r in enumerate(rows):
                    if r.version is not None:
                        continue
                    if r.rid is not None and r.rid in self.abort_rids and i < len(r.tokens):  # /abort_request: cut where it is
                        r.tokens, r.log_probs, r.finish = r.tokens[:i], r.log_probs[:i], "abort"
                        if r.support is not None:
                            r.support = (r.support[0][:i], r.support[1][:i])
                    if version != r.seen:
                        if i > 0:
                            r.events.append((r.seen, i))
                        if i < len(r.tokens):
                            self._resample(r, i)
                        r.seen = version
                    if i >= len(r.tokens):
                        r.finish_at(version, self.weight_version)
                if all(r.version is not None for r in rows):
                    return
                if self.token_delay_s:
                    time.sleep(self.token_delay_s)
                i += 1
        finally:
            with self._lock:
                self.running -= 1

    def _resample(self, r: "_Decoding", i: int) -> None:
        """Sample row ``r`` again after its first ``i`` tokens, with the weights loaded now."""
        if self._backend is None:  # instant_tokens: the same fixed tokens
            return
        import attrs

        params = attrs.evolve(r.params, n=1, max_new_tokens=r.params.max_new_tokens - i,
                              seed=None if r.params.seed is None else r.params.seed + i)
        prefix = r.prompt + tuple(r.tokens[:i])
        with self._lock:
            c = self._backend.generate([prefix], params)[0]
            support = self._support(prefix, c.token_ids, params) if r.support is not None else None
        r.tokens = tuple(r.tokens[:i]) + tuple(c.token_ids)
        r.log_probs = tuple(r.log_probs[:i]) + tuple(c.log_probs)
        r.finish = c.finish_reason
        if support is not None:
            r.support = (list(r.support[0][:i]) + support[0], list(r.support[1][:i]) + support[1])

    def _support(self, prompt, tokens, params) -> tuple[list, list]:
        """``return_sampling_mask`` (selected mode): per output token the ids it was drawn from
        (top-k / top-p support of ``softmax(z / T)``, most likely first) and its log-prob under
        that truncated, renormalised distribution; greedy: ``[token]`` and 0."""
        import torch
        from rllab_backends.hf import _top_k_top_p

        if not tokens:
            return [], []
        if params.temperature == 0:
            return [[int(t)] for t in tokens], [0.0] * len(tokens)
        model = self._backend.model
        with torch.no_grad():
            ids = torch.tensor([list(prompt) + list(tokens)], device=next(model.parameters()).device)
            z = model(ids).logits[0, len(prompt) - 1 : -1].float() / params.temperature
            s = _top_k_top_p(z, params.top_k, params.top_p)
            lp = torch.log_softmax(s, -1).gather(-1, torch.tensor(tokens, device=s.device)[:, None]).squeeze(-1)
        masks = []
        for row in s:
            keep = torch.isfinite(row).nonzero().squeeze(-1)
            masks.append(keep[row[keep].argsort(descending=True)].tolist())
        return masks, lp.tolist()

    def _row(self, r: "_Decoding") -> dict:
        tokens, log_probs, finish, params, support = r.tokens, r.log_probs, r.finish, r.params, r.support
        if finish == "abort":
            fr = {"type": "abort", "message": "Abort in running batch by /abort_request", "status_code": None, "err_type": None}
        elif finish == "stop":
            fr = {"type": "stop", "matched": int(tokens[-1])}
        else:
            fr = {"type": "length", "length": params.max_new_tokens}
        row = {
            "text": "",
            "output_ids": list(tokens),
            "meta_info": {
                "id": uuid.uuid4().hex,
                "finish_reason": fr,
                "prompt_tokens": len(r.prompt),
                "completion_tokens": len(tokens),
                "cached_tokens": 0,
                "weight_version": r.version,
                "weight_versions": r.spans(),
                "e2e_latency": 0.0,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(log_probs, tokens)],
                "output_token_logprobs_length": len(tokens),
            },
        }
        if support is not None:
            masks, lps = support
            row["meta_info"].update(
                output_token_sampling_mask=masks, output_token_sampling_logprobs=lps,
                output_token_sampling_mask_length=len(masks),
            )
        return row

    @staticmethod
    def _abort_row(row: dict, message: str) -> None:
        """Finish ``row`` as SGLang finishes a request it aborted mid-decode: what was generated
        so far (here: half), ``finish_reason`` ``abort`` without a status."""
        m = row["meta_info"]
        k = len(row["output_ids"]) // 2
        row["output_ids"] = row["output_ids"][:k]
        m["output_token_logprobs"] = m["output_token_logprobs"][:k]
        m["output_token_logprobs_length"] = m["completion_tokens"] = k
        for key in ("output_token_sampling_mask", "output_token_sampling_logprobs"):
            if key in m:
                m[key] = m[key][:k]
        if "output_token_sampling_mask_length" in m:
            m["output_token_sampling_mask_length"] = k
        if "weight_versions" in m:  # shown as add_weight_versions_to_meta_info does, for the tokens kept
            m["weight_versions"] = [{**sp, "end": min(sp["end"], k)} for sp in m["weight_versions"] if sp["start"] < k or sp["start"] == 0]
        m["finish_reason"] = {"type": "abort", "message": message, "status_code": None, "err_type": None}

    def _generate(self, body: dict) -> list[dict]:
        delay = self._take("delay")
        if delay:
            time.sleep(delay)
        fail = self._take("fail")
        if fail:
            raise _HTTPError(fail[0], fail[1])
        if self._unavailable():
            raise _HTTPError(503, "The server is updating weights; try again.")
        with self._pause_cond:  # the tokenizer holds new requests while paused
            while self.paused and not self._dead:
                self._pause_cond.wait(0.05)
        with self._rw.reader():  # held until answered: an update that is not paused waits for it
            rows = self._rows(body)
        abort = self._take("abort")
        if abort:
            for r in rows:
                r["meta_info"]["finish_reason"] = {"type": "abort", "message": abort[0], "status_code": abort[1], "err_type": None}
        if self.abort_rate:
            with self._lock:
                hits = [self._abort_rng.random() < self.abort_rate for _ in rows]
                self.aborted += sum(hits)
            for r, hit in zip(rows, hits):
                if hit:
                    self._abort_row(r, self.abort_message)
        stale = self._take("stale")
        if stale:
            version, spans = stale
            for r in rows:
                m = r["meta_info"]
                if spans:
                    k = m["completion_tokens"]
                    m["weight_versions"] = [{"version": version, "start": 0, "end": k // 2}, {"version": m["weight_version"], "start": k // 2, "end": k}]
                else:
                    m["weight_version"] = version
                    m["weight_versions"] = [{"version": version, "start": 0, "end": m["completion_tokens"]}]
        if self.validate:
            for r in rows:
                self.api.decode_GenerateResponse(r)
        return rows

    # -- HTTP

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload: Any = None, text: str | None = None):
                data = text.encode() if text is not None else (b"" if payload is None else json.dumps(payload).encode())
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if text is not None else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (cancelled, timed out)
                    self.close_connection = True

            def _drop(self):
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def _body(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                return json.loads(raw) if raw.strip() else None

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def _route(self, method):
                if standin._dead:
                    return self._drop()
                try:
                    body = self._body()
                except ValueError as e:
                    return self._send(400, {"error": {"message": f"invalid JSON: {e}"}})
                path = self.path.split("?")[0]
                standin.requests.append((path, body))
                try:
                    if path == "/generate":
                        if standin._die_after is not None:
                            if standin._die_after == 0:
                                standin._die_after = None
                                standin.stop()
                                return self._drop()
                            standin._die_after -= 1
                        if standin.validate:
                            try:
                                standin.api.decode_GenerateRequest(body)
                            except standin.api.JsonContractError as e:
                                return self._send(400, {"error": str(e)})
                        rows = standin._generate(body)
                        single = isinstance(body.get("input_ids", [None])[0], int) and all(
                            isinstance(sp, dict) and sp.get("n", 1) == 1 for sp in [body.get("sampling_params") or {}]
                        )
                        return self._send(200, rows[0] if single and len(rows) == 1 else rows)
                    fail = standin._take(f"fail:{path}")
                    if fail:
                        return self._send(fail[0], {"error": {"message": fail[1]}})
                    return self._send(*standin._admin(method, path, body or {}))
                except _HTTPError as e:
                    return self._send(e.status, {"error": {"message": e.message}})

        return Handler

    def _admin(self, method: str, path: str, body: dict) -> tuple:
        if path in ("/health", "/health_generate", "/ready"):
            return (503, None) if self._unavailable() else (200, None)
        if path in ("/get_model_info", "/model_info"):
            info = {
                "model_path": self.model_path or "",
                "served_model_name": self.model_path or "",
                "tokenizer_path": "",
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
                "load_format": "auto",
            }
            if self.validate:
                self.api.decode_GetModelInfoResponse(info)
            return 200, info
        if path in ("/get_server_info", "/server_info"):
            return 200, {"version": "0.5.23", "weight_version": self.weight_version, "skip_tokenizer_init": True,
                         "tp_size": self.tp_size, "dp_size": self.dp_size}
        if path == "/update_weights_from_disk":
            unknown = set(body) - UPDATE_FROM_DISK_FIELDS
            if unknown or not isinstance(body.get("model_path"), str):
                return 400, {"error": {"message": f"invalid UpdateWeightFromDiskReqInput: unknown {sorted(unknown)} or no model_path"}}
            self.updates.append(body)
            if self._fail_update is not None:
                msg, self._fail_update = self._fail_update, None
                return 400, {"success": False, "message": msg, "num_paused_requests": 0}
            with self._update_lock():
                try:
                    with self._lock:
                        self._load(body["model_path"]) if self.instant_tokens is None else None
                        refused = self._updated(body)
                except Exception as e:  # the real server rolls back and reports the loader's message
                    return 400, {"success": False, "message": f"Failed to update weights: {e}. Rolling back to the previous weights.", "num_paused_requests": 0}
            if refused:
                return 400, {"success": False, "message": refused, "num_paused_requests": 0}
            q = self._faults.pop("after_update", None)
            if q:
                self._faults["unavailable"] = [time.monotonic() + q[0]]
            return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        if path == "/flush_cache":  # only an idle server flushes (a paused one ignores its waiting queue)
            if self.running and not (self.paused and self.pause_mode == "retract"):
                return 400, "Flush cache failed.\n"
            return 200, "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"
        if path == "/pause_generation":
            unknown = set(body) - PAUSE_FIELDS
            mode = body.get("mode", "abort")
            if unknown or mode not in PAUSE_MODES:
                return 400, {"error": {"message": f"invalid PauseGenerationReqInput: unknown {sorted(unknown)} or mode {mode!r} not in {list(PAUSE_MODES)}"}}
            if mode == "abort":
                return 400, {"error": {"message": "stand-in: /pause_generation mode 'abort' is not modelled"}}
            self.updates.append({"route": path, **body})
            with self._pause_cond:
                self.paused, self.pause_mode = True, mode
            return 200, {"message": "Generation paused successfully.", "status": "ok"}
        if path == "/continue_generation":
            unknown = set(body) - CONTINUE_FIELDS
            if unknown:
                return 400, {"error": {"message": f"invalid ContinueGenerationReqInput: unknown {sorted(unknown)}"}}
            self.updates.append({"route": path, **body})
            with self._pause_cond:
                self.paused, self.pause_mode = False, None
                self._pause_cond.notify_all()
            return 200, {"message": "Generation continued successfully.", "status": "ok"}
        if path in ("/begin_weight_update", "/end_weight_update"):
            self.updates.append({"route": path, **body})
            with self._update_lock():
                self._session_open = path == "/begin_weight_update"
            return 200, {"success": True, "message": "ok"}
        if path == "/update_weights_from_tensor":
            self.updates.append({"route": path, **body})
            if not getattr(self, "_session_open", False):  # 0.5.23's scheduler refuses these outside a session
                return 400, {"success": False, "message": "update_weights_from_tensor requires an open weight update session (call /begin_weight_update first)"}
            names = body.get("serialized_named_tensors")
            if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                return 400, {"error": {"message": "serialized_named_tensors must be a list of base64 strings, one per TP rank"}}
            with self._update_lock(), self._lock:
                refused = self._updated(body)
            if refused:
                return 400, {"success": False, "message": refused}
            return 200, {"success": True, "message": "Succeeded to update model weights."}
        if path == "/init_weights_update_group":
            return self._init_group(body)
        if path == "/update_weights_from_distributed":
            return self._update_from_distributed(body)
        if path == "/destroy_weights_update_group":
            group = self._groups.pop(body.get("group_name", "weight_update_group"), None)
            if group is None:
                return 400, {"success": False, "message": "The group to be destroyed does not exist."}
            import torch.distributed as dist

            dist.destroy_process_group(group)
            return 200, {"success": True, "message": "Succeeded to destroy custom process group."}
        if path == "/get_weights_by_name":
            params = dict(self._backend.model.named_parameters()) if self._backend is not None else {}
            if body.get("name") not in params:
                return 400, {"error": {"message": f"Get parameter by name failed: no parameter {body.get('name')!r}"}}
            return 200, params[body["name"]].detach().flatten()[: int(body.get("truncate_size", 100))].tolist()
        if path == "/update_weight_version":
            self.weight_version = self.span_version = str(body["new_version"])
            return 200, {"success": True, "message": "ok", "new_version": self.weight_version}
        if path == "/abort_request":
            if self.validate:
                self.api.decode_AbortRequest(body)
            with self._lock:
                self.abort_requests.append(body)
                self.abort_rids.add(str(body.get("rid", "")))
            return 200, None
        return 404, {"detail": "Not Found"}


    def _update_lock(self):
        """The model-update writer lock for an update, unless the server is paused (SGLang skips
        it then: whoever paused holds the requests)."""
        with self._pause_cond:
            paused = self.paused
        return contextlib.nullcontext() if paused else self._rw.writer()

    def _updated(self, body: dict) -> str | None:
        """After new weights are in: the scheduler's version moves (the spans), then the cache
        is flushed if asked — refused while requests run in place (a retracted one waits in the
        queue, which a paused server ignores) — and only then the tokenizer's version moves.
        Returns SGLang's message when the flush was refused (the update fails)."""
        version = body.get("weight_version")
        if version is not None:
            self.span_version = str(version)
        if body.get("flush_cache", True) and self.running and not (self.paused and self.pause_mode == "retract"):
            return FLUSH_REFUSED
        if version is not None:
            self.weight_version = str(version)
        return None

    # -- weight_sync = "distributed": the receiving side, as sglang 0.5.23's ModelRunner does it

    def _init_group(self, body: dict) -> tuple:
        """Join the trainer's group as rank ``rank_offset`` (one TP rank), blocking until every
        rank has joined: the rendezvous and the group of its own that SGLang creates
        (``init_custom_process_group``), here with torch's own calls."""
        unknown = set(body) - INIT_GROUP_FIELDS
        missing = {"master_address", "master_port", "rank_offset", "world_size"} - set(body)
        if unknown or missing:
            return 400, {"error": {"message": f"invalid InitWeightsUpdateGroupReqInput: unknown {sorted(unknown)}, missing {sorted(missing)}"}}
        import datetime

        from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

        name = body.get("group_name", "weight_update_group")
        try:
            timeout = datetime.timedelta(seconds=60)
            url = f"tcp://{body['master_address']}:{body['master_port']}"
            store, rank, world = next(rendezvous(url, int(body["rank_offset"]), int(body["world_size"]), timeout=timeout))
            store.set_timeout(timeout)
            pg, _ = _new_process_group_helper(world, rank, [], Backend(body.get("backend", "nccl")), PrefixStore(name, store),
                                              group_name=name, timeout=timeout)
            _world.pg_group_ranks[pg] = {i: i for i in range(world)}
        except Exception as e:
            return 400, {"success": False, "message": f"Failed to initialize custom process group: {e}."}
        self._groups[name] = pg
        return 200, {"success": True, "message": "Succeeded to initialize custom process group."}

    def _update_from_distributed(self, body: dict) -> tuple:
        import torch
        import torch.distributed as dist

        self.updates.append({"route": "/update_weights_from_distributed", **body})
        unknown = set(body) - UPDATE_FROM_DISTRIBUTED_FIELDS
        if unknown or not all(isinstance(body.get(k), list) for k in ("names", "dtypes", "shapes")):
            return 400, {"error": {"message": f"invalid UpdateWeightsFromDistributedReqInput: unknown {sorted(unknown)} or no names/dtypes/shapes"}}
        if not getattr(self, "_session_open", False):
            return 400, {"success": False, "message": "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"}
        name = body.get("group_name", "weight_update_group")
        if name not in self._groups:
            return 400, {"success": False, "message": f"Group {name} not in {list(self._groups)}. Please call `init_weights_update_group` first."}
        received = []
        for n, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
            t = torch.empty(shape, dtype=getattr(torch, dtype))
            dist.broadcast(t, src=0, group=self._groups[name])
            received.append((n, t))
        params = dict(self._backend.model.named_parameters()) if self._backend is not None else {}
        with self._update_lock(), self._lock, torch.no_grad():
            for n, t in received:  # the model's load_weights: each name into its parameter, cast to its dtype
                if n in params:
                    params[n].copy_(t)
                elif self._backend is not None:
                    return 400, {"success": False, "message": f"Failed to update parameter online: unknown parameter {n!r}"}
            refused = self._updated(body)
        if refused:
            return 400, {"success": False, "message": refused}
        return 200, {"success": True, "message": "Succeeded to update parameter online."}


class _Decoding:
    """One row of a /generate request while it decodes: its tokens so far (all of them, sampled
    ahead; :meth:`StandIn._resample` replaces the rest after a version change), the version
    change events it saw, and, once finished, the versions it reports."""

    def __init__(self, prompt, tokens, log_probs, finish, params, support, seen):
        self.prompt, self.tokens, self.log_probs, self.finish = prompt, tuple(tokens), tuple(log_probs), finish
        self.params, self.support = params, support
        self.seen = seen  # the (scheduler's) version of the weights its tokens come from
        self.events: list[tuple[str, int]] = []
        self.version: str | None = None  # meta_info.weight_version (the tokenizer's) once finished
        self.final: str | None = None  # the scheduler's version when it finished
        self.rid: str | None = None  # its rid, for /abort_request

    def finish_at(self, span_version: str, version: str) -> None:
        self.final, self.version = span_version, version

    def spans(self) -> list[dict]:
        """``meta_info.weight_versions`` as sglang 0.5.23 computes and shows them
        (``compute_weight_version_spans`` then ``add_weight_versions_to_meta_info``)."""
        n = len(self.tokens)
        spans: list[dict] = []
        for version, end in [*self.events, (self.final, n)]:
            end = min(end, n)
            if spans and end <= spans[-1]["end"]:
                continue
            if spans and version == spans[-1]["version"]:
                spans[-1]["end"] = end
                continue
            spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
        return [{**sp, "end": min(sp["end"], n)} for sp in spans if sp["start"] < n or sp["start"] == 0]


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--instant", type=int, default=None, help="answer with this many fixed tokens, no model")
    p.add_argument("--lifetime-s", type=float, default=300.0)
    p.add_argument("--no-validate", action="store_true")
    p.add_argument("--abort-rate", type=float, default=0.0, help="abort each sample with this probability")
    p.add_argument("--abort-seed", type=int, default=0)
    p.add_argument("--token-delay-s", type=float, default=0.0, help="seconds per decoded token (requests in flight can cross a push)")
    args, _unknown = p.parse_known_args(argv)  # sglang's other flags (--host, --skip-tokenizer-init …) are accepted
    model = None if args.instant is not None else args.model_path
    s = StandIn(model, weight_version=args.weight_version, port=args.port, lifetime_s=args.lifetime_s,
                instant_tokens=args.instant, validate=False if args.no_validate else None,
                abort_rate=args.abort_rate, abort_seed=args.abort_seed, token_delay_s=args.token_delay_s)
    print(f"stand-in listening on {s.url}", flush=True)
    try:
        while not s._dead:
            time.sleep(0.2)
    except KeyboardInterrupt:
        s.stop()


if __name__ == "__main__":
    main()
