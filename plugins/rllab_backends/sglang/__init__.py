"""Rollouts from SGLang servers over their native HTTP API (``POST /generate``).

``generate(prompts, params)`` sends token ids, never text, so nothing is re-tokenised::

    POST /generate  {"input_ids": [[...], ...], "sampling_params": {...}, "return_logprob": true,
                     "logprob_start_len": -1}
    →  [{"output_ids": [...], "meta_info": {"output_token_logprobs": [[lp, id, null], ...],
         "finish_reason": {"type": "stop", "matched": 2}, "weight_version": "3", ...}}, ...]

Prompts are split into requests of ``prompts_per_request`` and sent concurrently, at most
``max_in_flight`` at a time, spread round-robin over ``urls``, on kept-alive HTTP/1.1 connections
(:mod:`rllab_backends.sglang.wire`). Without a seed a request asks for
``n`` samples per prompt (SGLang answers prompt-major, ``p0#0 … p0#n-1, p1#0 …``); with a seed
the client fans out itself, one row per sample, each with its own ``sampling_seed`` derived from
``(seed, prompt index, sample index)`` — one seed for all ``n`` copies would give ``n`` identical
samples on a deterministic server. Either way the completions come back in the hf backend's
order, with ``prompt_index`` set, and each one's ``log_probs`` are SGLang's
``output_token_logprobs``: ``log_softmax(z / T)`` of the full vocabulary, *before* top-k / top-p
truncation (greedy: ``log_softmax(z)``) — the hf backend's default ``"temperature"`` convention.
With ``logprobs = "processed"`` the request sets ``return_sampling_mask`` and the log-probs are
SGLang's ``output_token_sampling_logprobs``: the token's log-prob under the top-k / top-p
truncated, renormalised distribution it was drawn from (greedy: 0) — the hf backend's
``"processed"``, and the exact behaviour policy for TIS when sampling truncates.

Finish reasons, as SGLang sends them::

    {"type": "stop", "matched": 2 | "</s>" | [2, 7]}  → "stop"   (token id, string or ids)
    {"type": "length", "length": 128}                 → "length"
    {"type": "abort", "message": ..., "status_code"}  → retried, then SGLangAbortError
    null (unfinished)                                 → SGLangProtocolError

Faults: a refused connection, a dropped connection (a server that died), a timeout, HTTP 5xx /
503 (a server busy loading weights) and aborted samples are retried with exponential backoff
(``retries``, ``backoff_s``) on the next server that answers ``/health`` (the rows of a timed-out
seeded request are first stopped with ``/abort_request``); an HTTP 4xx is not
retried and raises :class:`SGLangRequestError` carrying SGLang's own message. When retries run
out the whole ``generate`` call fails with an :class:`SGLangError` (an ``RllabError``): a partial
batch is never returned, so the run stops and can resume from its last checkpoint.

Weights (``update_weights(policy)``, after every optimizer step) — ``weight_sync``:

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

Staleness: every completion carries SGLang's ``weight_version`` (and ``weight_versions``
spans, when the weights changed mid-request). One that differs from the version last pushed is
stale: ``stale = "drop"`` removes it, ``"keep"`` keeps it, ``"error"`` stops the run; every case
is counted in :meth:`SGLangBackend.last_metrics` (``rollout/stale`` …), so no stale sample is
trained on silently.

``launch = true`` starts ``python -m sglang.launch_server`` (``launch_command`` overrides it),
prints the command, waits for ``/health`` and stops the server in ``close()``.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import concurrent.futures
import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
import numpy as np

import rllab
from rllab import RllabError
from rllab.types import Completion, SamplingParams

from . import wire

DEFAULT_LAUNCH = (
    "{python} -m sglang.launch_server --model-path {model_path} --host {host} --port {port} "
    "--skip-tokenizer-init --weight-version {weight_version}"
)
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}


# --------------------------------------------------------------------------- errors


class SGLangError(RllabError):
    """A rollout from SGLang failed; the step produced nothing (resume from the last checkpoint)."""


class SGLangUnavailableError(SGLangError):
    """No server answered: connection refused, or a server died mid-rollout, after every retry."""


class SGLangTimeoutError(SGLangError):
    """A request took longer than ``timeout_s`` on every try."""


class SGLangRequestError(SGLangError):
    """SGLang rejected a request (HTTP 4xx, or 5xx after every retry); ``message`` is SGLang's."""

    def __init__(self, text: str, *, status: int, message: str):
        super().__init__(text)
        self.status = status
        self.message = message


class SGLangAbortError(SGLangError):
    """SGLang aborted samples (``finish_reason.type == "abort"``) on every try."""


class SGLangProtocolError(SGLangError):
    """A response that does not follow SGLang's /generate contract."""


class SGLangWeightSyncError(SGLangError):
    """Weights could not be pushed to a server (or the chosen ``weight_sync`` cannot work)."""


class StaleSampleError(SGLangError):
    """A completion was sampled from weights other than the last pushed (``stale = "error"``)."""


class _Retry(Exception):
    """A failure worth another try (internal)."""

    def __init__(self, kind: str, text: str, status: int = 0, message: str = ""):
        super().__init__(text)
        self.kind, self.status, self.message = kind, status, message


# --------------------------------------------------------------------------- config


def _urls(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """``"a, b"``, ``"a b"`` or ``["a", "b"]`` → ``("a", "b")`` (no trailing slashes)."""
    text = value if isinstance(value, str) else ",".join(value)
    return tuple(u.strip().rstrip("/") for u in text.replace(" ", ",").split(",") if u.strip())


def _need_a_server(inst, launch: bool) -> None:
    if not launch and not _urls(inst.urls):
        raise ValueError("set urls (a server or router, e.g. urls = \"http://127.0.0.1:30000\") or launch = true")


def _check_urls(inst, attribute, value):
    for u in _urls(value or ""):
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"{attribute.name}: {u!r} is not an http:// or https:// URL")


@attrs.frozen
class SGLangBackendConfig:
    """Knobs of the sglang rollout backend."""

    urls: str | tuple[str, ...] = rllab.knob(
        "",
        help="where /generate goes: one server, several (a list, or comma-separated), or one sglang-router URL; "
        "empty with launch = true: the launched server",
        validator=_check_urls,
    )
    admin_urls: str | tuple[str, ...] = rllab.knob(
        "",
        help="servers that receive weight updates (a list, or comma-separated); empty: urls (behind a router, "
        "list its workers here)",
        validator=_check_urls,
    )
    launch: bool = rllab.knob(
        False,
        help="start an SGLang server for the run, wait for /health, stop it at close()",
        validator=lambda i, a, v: _need_a_server(i, v),
    )
    launch_command: str = rllab.knob(
        DEFAULT_LAUNCH,
        help="command launch runs (printed); fields {python} {model_path} {host} {port} {weight_version}",
    )
    launch_args: str = rllab.knob("", help="extra server flags appended to launch_command, e.g. '--mem-fraction-static 0.5'")
    launch_timeout_s: float = rllab.knob(900.0, help="longest wait for a launched server's /health", gt=0.0)
    model_path: str | None = rllab.knob(
        None, help="model directory a launched server starts from; None: a snapshot of the first update_weights"
    )
    weight_sync: str = rllab.knob(
        "disk",
        help="how update_weights reaches the servers: 'disk' (safetensors + /update_weights_from_disk), "
        "'tensor' (colocated, CUDA IPC), 'distributed' (torch.distributed broadcast from the trainer)",
        choices=("disk", "tensor", "distributed"),
    )
    distributed_backend: str = rllab.knob(
        "nccl",
        help="weight_sync = 'distributed': the group's backend ('nccl': CUDA policy; 'gloo': CPU tensors)",
        choices=("nccl", "gloo"),
    )
    distributed_address: str = rllab.knob(
        "", help="weight_sync = 'distributed': the address servers reach the trainer at; empty: 127.0.0.1 for local "
        "servers, else this machine's address on the route to them"
    )
    distributed_port: int = rllab.knob(0, help="weight_sync = 'distributed': rendezvous port on the trainer; 0: a free one", ge=0, le=65535)
    distributed_dtype: str = rllab.knob(
        "model",
        help="weight_sync = 'distributed': dtype on the wire ('model': the policy's own; 'bfloat16' halves float32 traffic)",
        choices=("model", "bfloat16", "float16", "float32"),
    )
    sync_dir: str | None = rllab.knob(
        None, help="directory for weight snapshots, visible to every server; None: a private temporary directory"
    )
    tp_size: int = rllab.knob(
        1, help="tensor-parallel ranks of each server ('tensor' sends one payload per rank; 'distributed': each rank "
        "joins the group, checked against the server's /server_info)", ge=1
    )
    prompts_per_request: int = rllab.knob(
        16, help="prompts batched into one /generate request (× n rows; SGLang warns above 128 rows with n > 1)", ge=1
    )
    max_in_flight: int = rllab.knob(64, help="most /generate requests outstanding at once (over all servers)", ge=1)
    timeout_s: float = rllab.knob(600.0, help="per-request time limit in seconds", gt=0.0)
    retries: int = rllab.knob(3, help="extra tries of a failed request (refused, dropped, timed out, 5xx, aborted)", ge=0)
    backoff_s: float = rllab.knob(0.5, help="first retry delay; doubles each try (capped at 30 s)", ge=0.0)
    logprobs: str = rllab.knob(
        "temperature",
        help="rollout log-probs: 'temperature' = output_token_logprobs, log_softmax(z/T) before top-k/top-p "
        "(the hf backend's default); 'processed' = output_token_sampling_logprobs (return_sampling_mask): the "
        "truncated, renormalised distribution each token was drawn from — exact TIS under top-k/top-p",
        choices=("temperature", "processed"),
    )
    stale: str = rllab.knob(
        "drop",
        help="a completion from other weights than the last pushed: 'drop' it, 'keep' it, or raise ('error'); "
        "always counted in rollout/stale",
        choices=("drop", "keep", "error"),
    )


    def __attrs_post_init__(self):
        if self.weight_sync != "distributed":
            fields = attrs.fields(type(self))
            set_ = [f.name for f in fields if f.name.startswith("distributed_") and getattr(self, f.name) != f.default]
            if set_:
                verb = "acts" if len(set_) == 1 else "act"
                raise ValueError(f"{', '.join(set_)} {verb} only with weight_sync = 'distributed' (weight_sync is {self.weight_sync!r})")


# --------------------------------------------------------------------------- helpers


def _sample_seed(seed: int, prompt_index: int, sample: int) -> int:
    """A non-negative int64 seed per sample (splitmix64 of the three numbers)."""
    m = (1 << 64) - 1
    x = (seed * 0x9E3779B97F4A7C15 + (prompt_index + 1) * 0xBF58476D1CE4E5B9 + (sample + 1) * 0x94D049BB133111EB) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def _sample_seeds(seed: int, first_prompt: int, prompts: int, n: int) -> list[int]:
    """:func:`_sample_seed` for every (prompt, sample) of a request, prompt-major, in one
    vectorised pass: uint64 array arithmetic wraps modulo 2**64 as the masks above do (and,
    unlike numpy's scalar arithmetic, silently), and the prompt/sample term is cached per shape."""
    u = np.uint64
    x = _seed_offsets(first_prompt, prompts, n) + u((seed * 0x9E3779B97F4A7C15) & _M64)
    x ^= x >> u(30)
    x *= u(0xBF58476D1CE4E5B9)
    x ^= x >> u(27)
    x *= u(0x94D049BB133111EB)
    x ^= x >> u(31)
    x &= u((1 << 63) - 1)
    return x.tolist()


_M64 = (1 << 64) - 1


@functools.lru_cache(maxsize=64)
def _seed_offsets(first_prompt: int, prompts: int, n: int) -> np.ndarray:
    u = np.uint64
    p = np.arange(first_prompt + 1, first_prompt + prompts + 1, dtype=u)[:, None]
    j = np.arange(1, n + 1, dtype=u)[None, :]
    out = (p * u(0xBF58476D1CE4E5B9) + j * u(0x94D049BB133111EB)).reshape(-1)
    out.flags.writeable = False
    return out


def sampling_params_json(params: SamplingParams, *, n: int | None = None, seed: int | None = None) -> dict:
    """SGLang's ``sampling_params`` for ``params`` (only keys SGLang knows: it rejects others)."""
    sp: dict[str, Any] = {
        "n": params.n if n is None else n,
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
    }
    if params.stop_token_ids:
        sp["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
    if seed is not None:
        sp["sampling_seed"] = seed
    return sp


def error_message(body: bytes) -> str:
    """SGLang's message from an error body: ``{"error": {"message": ...}}``, ``{"error": "..."}``
    (a contract violation), ``{"message": ...}`` or plain text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)
        return str(err)
    return text


def _finish(meta: Mapping, where: str) -> tuple[str, str | None, int | None]:
    """``(kind, abort message, abort status)`` from ``meta_info.finish_reason``."""
    fr = meta.get("finish_reason")
    if isinstance(fr, str):  # older servers sent a bare string
        fr = {"type": fr}
    if not isinstance(fr, dict) or fr.get("type") not in ("stop", "length", "abort"):
        raise SGLangProtocolError(f"{where}: unfinished or unknown finish_reason {fr!r}")
    if fr["type"] == "abort":
        return "abort", str(fr.get("message") or "aborted"), fr.get("status_code")
    return fr["type"], None, None


def parse_row(row: Any, prompt: tuple[int, ...], prompt_index: int, where: str = "result",
              sampled: bool = False) -> tuple[Completion, str | None, int | None]:
    """One ``/generate`` result → ``(Completion, abort message, abort status)``.

    ``output_token_logprobs[i] = [logprob, token_id, text]`` must name ``output_ids[i]``. With
    ``sampled`` (``logprobs = "processed"``) the completion's log-probs are
    ``output_token_sampling_logprobs`` instead: one float per output token.
    """
    if not isinstance(row, dict):
        raise SGLangProtocolError(f"{where}: expected an object, got {type(row).__name__}")
    meta = row.get("meta_info")
    ids = row.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(ids, list):
        raise SGLangProtocolError(f"{where}: missing output_ids or meta_info (is the server an SGLang /generate?)")
    fr = meta.get("finish_reason")
    if type(fr) is dict and (fr.get("type") == "stop" or fr.get("type") == "length"):
        kind, abort_msg, abort_status = fr["type"], None, None  # the common case, without a call
    else:
        kind, abort_msg, abort_status = _finish(meta, where)
    lps = meta.get("output_token_logprobs")
    if lps is None:
        lps = [] if not ids else None
    if lps is None or len(lps) != len(ids):
        raise SGLangProtocolError(
            f"{where}: {len(ids)} output_ids but "
            f"{'no' if lps is None else len(lps)} output_token_logprobs (return_logprob must be honoured)"
        )
    try:
        matched = [e[1] for e in lps] == ids
        log_probs = tuple(map(float, [e[0] for e in lps]))
    except (TypeError, IndexError, KeyError):
        matched = False
    if not matched:
        i = next((i for i, (e, t) in enumerate(zip(lps, ids)) if not isinstance(e, list) or len(e) < 2 or e[1] != t or e[0] is None), 0)
        raise SGLangProtocolError(f"{where}: output_token_logprobs[{i}] = {lps[i]!r} is not a log-prob of token {ids[i]}")
    if sampled and abort_msg is None:
        log_probs = _sampling_log_probs(meta.get("output_token_sampling_logprobs"), len(ids), where)
    version = meta.get("weight_version")
    spans = meta.get("weight_versions")
    if spans:
        versions = {str(s.get("version")) for s in spans if isinstance(s, dict)}
        if len(versions) > 1:
            version = "|".join(sorted(versions))  # the weights changed mid-request
    c = Completion(
        prompt_ids=prompt,
        token_ids=tuple(ids),
        log_probs=log_probs,
        finish_reason=kind,
        prompt_index=prompt_index,
        weight_version=None if version is None else str(version),
    )
    return c, abort_msg, abort_status


def _sampling_log_probs(values: Any, n: int, where: str) -> tuple[float, ...]:
    if not isinstance(values, list) or len(values) != n:
        got = "none" if values is None else (len(values) if isinstance(values, list) else type(values).__name__)
        raise SGLangProtocolError(
            f"{where}: {n} output_ids but {got} output_token_sampling_logprobs (logprobs = 'processed' needs a server "
            f"that honours return_sampling_mask: sglang >= 0.5.2x)"
        )
    try:
        out = tuple(map(float, values))
    except (TypeError, ValueError):
        raise SGLangProtocolError(f"{where}: output_token_sampling_logprobs are not numbers: {values[:4]!r}") from None
    return out


try:  # 3-4x faster than json on SGLang's float-heavy answers
    import msgspec
    from msgspec.json import decode as _decode, encode as _encode
except ImportError:  # pragma: no cover - msgspec is in the sglang extra
    msgspec = None
    _decode = json.loads

    def _encode(obj) -> bytes:
        return json.dumps(obj).encode()


if msgspec is not None:

    class _Finish(msgspec.Struct, gc=False):
        type: str

    class _Meta(msgspec.Struct, gc=False):
        finish_reason: _Finish
        output_token_logprobs: list[tuple[float, int, Any]] = []
        output_token_sampling_logprobs: tuple[float, ...] | None = None
        weight_version: Any = None
        weight_versions: Any = None

    class _Row(msgspec.Struct, gc=False):
        output_ids: tuple[int, ...]
        meta_info: _Meta

    _TYPED = msgspec.json.Decoder(list[_Row])
    """The common answer — a list of rows whose log-probs are ``[float, int, any]`` — decoded
    straight into structs (unknown fields skipped, no dict per row: about half the decoding time);
    anything else fails it and takes the general path with its precise errors."""
else:  # pragma: no cover
    _TYPED = None


def parse_rows(raw: bytes, prompts: Sequence[tuple[int, ...]], rows: Sequence[int], first_index: int, where: str,
               sampled: bool = False):
    """The answer of ``where`` (``<url>/generate``) → ``(completions, aborts)``: a ``Completion``
    per row (``rows[j]``: the prompt of row j) and the ``(message, status)`` of every aborted one.
    The common answer takes a typed fast path; any other shape goes through :func:`parse_row`,
    which names what is wrong."""
    if _TYPED is not None:
        try:
            typed = _TYPED.decode(raw)
        except msgspec.DecodeError:
            typed = None
        if typed is not None and len(typed) == len(rows):
            toks, values, kinds, versions = [], [], [], []
            for r in typed:
                meta = r.meta_info
                kind = meta.finish_reason.type
                tk = r.output_ids
                lps = meta.output_token_logprobs
                v, named, _ = zip(*lps) if lps else ((), (), ())
                if (kind != "stop" and kind != "length") or named != tk or meta.weight_versions:
                    break  # an abort, a mismatch, a span of versions: the general path
                if sampled:
                    v = meta.output_token_sampling_logprobs
                    if v is None or len(v) != len(tk):
                        break
                toks.append(tk)
                values.append(v)
                kinds.append(kind)
                versions.append(meta.weight_version)
            else:
                return Completion.columns(
                    [prompts[i] for i in rows], toks, values, kinds, [first_index + i for i in rows],
                    [None if v is None else str(v) for v in versions],
                ), []
    try:
        data = _decode(raw)
    except ValueError as e:
        raise SGLangProtocolError(f"sglang: {where} answered with invalid JSON: {e}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or len(data) != len(rows):
        got = len(data) if isinstance(data, list) else type(data).__name__
        raise SGLangProtocolError(f"sglang: {where} returned {got} results for {len(rows)} samples")
    parsed = [parse_row(row, prompts[i], first_index + i, f"{where} result", sampled) for row, i in zip(data, rows)]
    return [c for c, _, _ in parsed], [(m, st) for _, m, st in parsed if m is not None]


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


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' own progress bars off for the duration (restored after)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - a policy saved with save_pretrained comes from transformers
        yield
        return
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _is_path(model: Any) -> bool:
    return isinstance(model, (str, bytes)) or hasattr(model, "__fspath__")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _transport_error(e: BaseException, where: str, total: float) -> Exception:
    """What a failed HTTP exchange with ``where`` means to the backend: a :class:`_Retry` of
    kind timeout, refused or died, or a protocol error."""
    if isinstance(e, TimeoutError):
        return _Retry("timeout", f"{where}: no answer within {total:g} s")
    if isinstance(e, wire.ConnectError):
        return _Retry("refused", f"{where}: cannot connect ({e.strerror or e})")
    if isinstance(e, wire.ProtocolError):
        return SGLangProtocolError(f"sglang: {where} did not answer in HTTP/1.1: {e}")
    return _Retry("died", f"{where}: the server dropped the connection mid-request ({e})")


class _Loop:
    """The backend's private event loop, driven by whoever calls ``generate``: in the caller's
    thread, or — when that thread already runs an event loop — in a short-lived worker thread.
    Calls never overlap (the backend is synchronous), so the loop and its connections stay
    usable from one call to the next."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()

    def run(self, coro):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self.loop.run_until_complete(coro)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rllab-sglang") as pool:
            return pool.submit(self.loop.run_until_complete, coro).result()

    def close(self):
        if not self.loop.is_closed():
            self.loop.close()


# --------------------------------------------------------------------------- the backend


class SGLangBackend:
    """Rollouts from SGLang servers (see the module docstring)."""

    def __init__(self, config: SGLangBackendConfig):
        self.config = config
        self.urls: list[str] = list(_urls(config.urls))
        self.admin_urls: list[str] = list(_urls(config.admin_urls))
        self.version: str | None = None
        """The weight version last pushed; completions from any other are stale (None: not checked)."""
        self._syncs = 0
        self._rr = 0
        self._requests = 0
        self._process: subprocess.Popen | None = None
        self._own_sync_dir = config.sync_dir is None
        self.sync_dir = Path(config.sync_dir or tempfile.mkdtemp(prefix="rllab-sglang-"))
        self._metrics: dict[str, float] = {}
        self._sync_metrics: dict[str, float] = {}
        self._totals = {"stale": 0, "retries": 0}
        self._loop = _Loop()
        self._group = None  # weight_sync = "distributed": rank 0 of the servers' weight-update group
        self._no_sessions: set[str] = set()  # servers without /begin_weight_update (before sglang 0.5.2x)
        self._session: wire.Client | None = None
        self._sem: asyncio.Semaphore | None = None
        if config.launch and config.model_path is not None:
            self._launch(config.model_path, "0")
            self.version = "0"

    # -- HTTP

    def _client(self) -> wire.Client:
        if self._session is None:
            self._sem = asyncio.Semaphore(self.config.max_in_flight)
            self._session = wire.Client()
        return self._session

    async def _call(self, method: str, url: str, path: str, body: Any = None, *, timeout: float | None = None):
        """One HTTP exchange → ``(status, raw body)``; transport failures become :class:`_Retry`."""
        total = timeout or self.config.timeout_s
        try:
            return await self._client().request(method, url, path, None if body is None else _encode(body), total)
        except (OSError, wire.ProtocolError) as e:
            raise _transport_error(e, url + path, total) from None

    def _call_blocking(self, method: str, url: str, path: str, body: Any = None):
        """:meth:`_call` on a plain socket in this thread: for an exchange with nothing else in
        flight (a step's one ``/generate``), without the event loop's round trips."""
        total = self.config.timeout_s
        try:
            return self._client().request_blocking(method, url, path, None if body is None else _encode(body), total)
        except (OSError, wire.ProtocolError) as e:
            raise _transport_error(e, url + path, total) from None

    async def _healthy(self, url: str) -> bool:
        try:
            status, _ = await self._call("GET", url, "/health", timeout=min(10.0, self.config.timeout_s))
        except _Retry:
            return False
        return status == 200

    async def _with_retries(self, what: str, attempt_fn, servers: list[str], first: tuple[int, _Retry] | None = None):
        """Run ``attempt_fn(url)`` until it returns, retrying :class:`_Retry` with backoff on the
        next server that passes ``/health``. ``first``: ``(start, failure)`` of a first try
        already made (on ``servers[start % len(servers)]``); the retries go on from it."""
        failures: list[str] = []
        last: _Retry = _Retry("refused", "no server answered /health")
        if first is None:
            start, begin = self._rr, 0
            self._rr += 1
        else:
            (start, last), begin = first, 1
            failures.append(f"try 1: {last}")
        for attempt in range(begin, self.config.retries + 1):
            url = servers[(start + attempt) % len(servers)]
            if attempt:
                self._totals["retries"] += 1
                await asyncio.sleep(min(30.0, self.config.backoff_s * 2 ** (attempt - 1)))
                k = servers.index(url)
                url = None
                for candidate in servers[k:] + servers[:k]:  # this try's server first, then the others
                    if await self._healthy(candidate):
                        url = candidate
                        break
                if url is None:
                    failures.append(f"try {attempt + 1}: no server answered /health")
                    continue
            try:
                return await attempt_fn(url)
            except _Retry as e:
                failures.append(f"try {attempt + 1}: {e}")
                last = e
        text = (
            f"sglang: {what} failed after {self.config.retries + 1} tries; no partial batch is returned "
            f"(the run stops here and can resume from its last checkpoint):\n  " + "\n  ".join(failures)
        )
        if last.kind == "status":
            raise SGLangRequestError(text, status=last.status, message=last.message)
        raise {"timeout": SGLangTimeoutError, "abort": SGLangAbortError}.get(last.kind, SGLangUnavailableError)(text)

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
        retries0 = self._totals["retries"]
        if len(prompts) <= self.config.prompts_per_request:
            completions = self._generate_one(prompts, params)
        else:
            completions = self._loop.run(self._generate(prompts, params))
        version = self.version
        stale = [] if version is None else [c for c in completions if c.weight_version != version]
        if stale and self.config.stale == "error":
            raise StaleSampleError(
                f"sglang: {len(stale)} of {len(completions)} completions were sampled with weight_version "
                f"{sorted({str(c.weight_version) for c in stale})}, not the last pushed {self.version!r}"
            )
        self._totals["stale"] += len(stale)
        kept = completions
        if stale and self.config.stale == "drop":
            kept = [c for c in completions if c.weight_version == self.version]
            if not kept:
                raise StaleSampleError(
                    f"sglang: every completion was stale (weight_version {sorted({str(c.weight_version) for c in stale})}, "
                    f"expected {self.version!r}); is every server in admin_urls?"
                )
        self._metrics = {
            "rollout/stale": float(len(stale)),
            "rollout/stale_dropped": float(len(completions) - len(kept)),
            "rollout/stale_total": float(self._totals["stale"]),
            "sglang/retries": float(self._totals["retries"] - retries0),
            "sglang/requests": float(self._requests),
            "time/sglang_generate": time.perf_counter() - t0,
        }
        return kept

    def _generate_one(self, prompts: list[tuple[int, ...]], params: SamplingParams) -> list[Completion]:
        """A step that fits one request (the default): its first try runs in this thread on a
        blocking socket, with no event loop; a failed first try goes on in the loop's retries."""
        self._requests = 1
        what, attempt, blocking_attempt, rids = self._request(prompts, 0, params)
        start = self._rr
        self._rr += 1
        url = self.urls[start % len(self.urls)]
        try:
            return blocking_attempt(url)
        except _Retry as e:
            failed = e

        async def retries():
            if failed.kind == "timeout" and params.seed is not None:
                await self._abort(url, rids())
            return await self._with_retries(what, attempt, self.urls, first=(start, failed))

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

    def request_body(self, prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams) -> tuple[dict, list[int]]:
        """The ``/generate`` body for ``prompts`` and the prompt (offset) of every row it returns."""
        n = params.n
        if params.seed is None:
            body = {
                "input_ids": prompts,  # tuples encode as JSON arrays
                "sampling_params": sampling_params_json(params),
            }
        else:  # one row per sample, each with its own seed
            base = sampling_params_json(params, n=1)
            seeds = _sample_seeds(params.seed, first_index, len(prompts), n)
            if msgspec is None:  # pragma: no cover
                body = {
                    "input_ids": [p for p in prompts for _ in range(n)],
                    "sampling_params": [{**base, "sampling_seed": x} for x in seeds],
                }
            else:  # the same JSON, written as bytes: each prompt encoded once, each row's params spliced
                head = _encode(base)[:-1].decode() + ',"sampling_seed":'
                body = {
                    "input_ids": msgspec.Raw(b"[%s]" % b",".join([b",".join([_encode(p)] * n) for p in prompts])),
                    "sampling_params": msgspec.Raw(f"[{head}{('},' + head).join(map(str, seeds))}}}]".encode()),
                }
        body["return_logprob"] = True
        body["logprob_start_len"] = -1
        if self.config.logprobs == "processed":
            body["return_sampling_mask"] = True
        rows = [i for i in range(len(prompts)) for _ in range(n)]
        return body, rows

    def _request(self, prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams):
        """One ``/generate`` request: ``(what, attempt, blocking_attempt, rids)``, its description,
        one try of it on a server (``await attempt(url)`` in the event loop, or
        ``blocking_attempt(url)`` in this thread), and the row ids of the last try."""
        body, rows = self.request_body(prompts, first_index, params)
        what = f"/generate for prompts {first_index}..{first_index + len(prompts) - 1}"
        sampled = self.config.logprobs == "processed"

        def rids() -> list[str]:  # SGLang names row i "<rid>_<i>"
            return [f"{body['rid']}_{i}" for i in range(len(rows))]

        def answer(url: str, status: int, raw: bytes) -> list[Completion]:
            if status != 200:
                msg = error_message(raw)
                if status in _RETRYABLE_STATUS:
                    raise _Retry("status", f"{url}/generate: HTTP {status}: {msg}", status, msg)
                raise SGLangRequestError(
                    f"sglang: {url}/generate rejected the request (HTTP {status}): {msg}", status=status, message=msg
                )
            out, aborted = parse_rows(raw, prompts, rows, first_index, f"{url}/generate", sampled)
            if aborted:
                msg, st = aborted[0]
                if st is not None and 400 <= int(st) < 500 and int(st) not in _RETRYABLE_STATUS:
                    raise SGLangAbortError(
                        f"sglang: {url} aborted {len(aborted)} of {len(rows)} samples (status {st}): {msg}"
                    )
                raise _Retry("abort", f"{url}: {len(aborted)} of {len(rows)} samples aborted: {msg}")
            return out

        def blocking_attempt(url: str) -> list[Completion]:
            body["rid"] = uuid.uuid4().hex
            return answer(url, *self._call_blocking("POST", url, "/generate", body))

        async def attempt(url: str) -> list[Completion]:
            assert self._sem is not None
            body["rid"] = uuid.uuid4().hex
            try:
                async with self._sem:
                    status, raw = await self._call("POST", url, "/generate", body)
            except _Retry as e:
                if e.kind == "timeout" and params.seed is not None:
                    await self._abort(url, rids())
                raise
            return answer(url, status, raw)

        return what, attempt, blocking_attempt, rids

    async def _generate_request(self, prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams):
        what, attempt, _, _ = self._request(prompts, first_index, params)
        return await self._with_retries(what, attempt, self.urls)

    async def _abort(self, url: str, rids: list[str]) -> None:
        """Best effort: ask ``url`` to stop rows we gave up on (a timed-out request), so a retry
        does not run beside them. Exact rids only: SGLang ignores rids it does not know, and with
        ``n > 1`` it renames rows, so only seeded (one row per sample) requests are aborted."""
        for rid in rids:
            try:
                await self._call("POST", url, "/abort_request", {"rid": rid}, timeout=5.0)
            except _Retry:
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
        elif self.config.weight_sync == "tensor" and not _is_path(model):
            self._loop.run(self._sync_tensor(model, version))
        elif self.config.weight_sync == "distributed" and not _is_path(model):
            self._loop.run(self._sync_distributed(model, version))
        else:  # "disk", or a model directory (any weight_sync): the servers load it themselves
            path = self._snapshot(model, version)
            self._loop.run(self._sync_disk(str(path), version))
            self._prune(keep=path)
        self._syncs += 1
        self.version = version
        self._sync_metrics = {"time/weight_sync": time.perf_counter() - t0, "sglang/weight_version": float(self._syncs)}
        if self._sync_bytes:
            self._sync_metrics["sglang/sync_mib"] = self._sync_bytes / 2**20
        return dict(self._sync_metrics)

    def _snapshot(self, model: Any, version: str) -> Path:
        """``model`` saved as safetensors in ``sync_dir/v<version>``, written under a temporary
        name and renamed, so a server never reads a half-written directory."""
        if _is_path(model):
            return Path(os.fsdecode(model)).resolve()
        final = self.sync_dir / f"v{version}"
        tmp = self.sync_dir / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
        try:
            with _quiet_transformers():  # a sync per step: no "Writing model shards" bar each time
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
            if status in _RETRYABLE_STATUS:
                msg = error_message(raw)
                raise _Retry("status", f"{u}{path}: HTTP {status}: {msg}", status, msg)
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

    async def _sync_disk(self, path: str, version: str) -> None:
        self._client()
        body = {"model_path": path, "weight_version": version, "flush_cache": True, "abort_all_requests": False}
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
        body = {"serialized_named_tensors": [payload] * self.config.tp_size, "weight_version": version, "flush_cache": True}
        async with self._weight_update_sessions(targets):
            for u in targets:
                await self._admin(u, "/update_weights_from_tensor", body, "/update_weights_from_tensor")

    async def _once(self, url: str, path: str, body: dict) -> dict:
        """One admin POST, no retry (a broadcast cannot be replayed half-way); failure raises."""
        try:
            status, raw = await self._call("POST", url, path, body)
        except _Retry as e:
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
                port=c.distributed_port or _free_port(),
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
        body = {**describe(named), "group_name": self._group.group_name, "weight_version": version, "flush_cache": True}
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
            except _Retry:
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

    # -- launch

    def launch_command(self, model_path: str, port: int, weight_version: str) -> list[str]:
        """The server command ``launch`` runs, as an argument list."""
        cmd = self.config.launch_command.format(
            python=shlex.quote(sys.executable),
            model_path=shlex.quote(model_path),
            host="127.0.0.1",
            port=port,
            weight_version=shlex.quote(weight_version),
        )
        return shlex.split(cmd) + shlex.split(self.config.launch_args)

    def _launch(self, model_path: str, version: str) -> None:
        port = _free_port()
        cmd = self.launch_command(model_path, port, version)
        url = f"http://127.0.0.1:{port}"
        print(f"rllab sglang: launching {shlex.join(cmd)}", file=sys.stderr, flush=True)
        self._process = subprocess.Popen(cmd, start_new_session=True)
        self._atexit = functools.partial(_stop, self._process)
        atexit.register(self._atexit)  # a run that dies without close() must not leave a GPU server behind
        deadline = time.monotonic() + self.config.launch_timeout_s
        while True:
            code = self._process.poll()
            if code is not None:
                atexit.unregister(self._atexit)
                self._process = None
                raise SGLangUnavailableError(f"sglang: the launched server exited with code {code} before answering /health: {shlex.join(cmd)}")
            if self._loop.run(self._healthy(url)):
                break
            if time.monotonic() > deadline:
                self._stop_process()
                raise SGLangUnavailableError(f"sglang: the launched server did not answer /health within {self.config.launch_timeout_s:g} s")
            time.sleep(0.2)
        if not self.config.urls:
            self.urls = [url]
        if not self.config.admin_urls:
            self.admin_urls = [url] if self.config.urls else []

    def _stop_process(self) -> None:
        proc, self._process = self._process, None
        if proc is not None:
            atexit.unregister(self._atexit)
            _stop(proc)

    # -- the rest of the protocol

    def last_metrics(self) -> dict[str, float]:
        """Counters of the last ``generate`` (namespaced, for the step's log): ``rollout/stale``,
        ``rollout/stale_dropped``, ``rollout/stale_total``, ``sglang/retries``, ``sglang/requests``,
        ``time/sglang_generate``. The weight sync's own metrics are ``update_weights``' return value."""
        return dict(self._metrics)

    def close(self) -> None:
        """Close connections, stop a launched server and remove a private snapshot directory."""
        if self._group is not None and self._session is not None and not self._loop.loop.is_closed():
            for u in self.admin_urls or self.urls:  # best effort: the servers may be gone already
                try:
                    self._loop.run(self._call("POST", u, "/destroy_weights_update_group", {"group_name": self._group.group_name}, timeout=10.0))
                except _Retry:
                    pass
        self._drop_group()
        if self._session is not None and not self._loop.loop.is_closed():
            self._loop.run(self._session.close())
            self._session = None
        self._loop.close()
        self._stop_process()
        if self._own_sync_dir:
            shutil.rmtree(self.sync_dir, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM a launched server's process group, SIGKILL it if it has not exited in 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def sglang(*, config: SGLangBackendConfig) -> SGLangBackend:
    """SGLang servers over HTTP: token-id /generate, weight sync after each step, retries, staleness checks."""
    return SGLangBackend(config)
