"""SGLang's ``/generate`` JSON contract: request bodies, per-sample seeds, answers parsed.

No I/O here. A request sends token ids, never text, so nothing is re-tokenised::

    POST /generate  {"input_ids": [[...], ...], "sampling_params": {...}, "return_logprob": true,
                     "logprob_start_len": -1}
    →  [{"output_ids": [...], "meta_info": {"output_token_logprobs": [[lp, id, null], ...],
         "finish_reason": {"type": "stop", "matched": 2}, "weight_version": "3", ...}}, ...]

Without a seed a request asks for ``n`` samples per prompt (SGLang answers prompt-major,
``p0#0 … p0#n-1, p1#0 …``); with a seed each prompt is repeated ``n`` times, one row per sample,
each with its own ``sampling_seed`` from :func:`sample_seed` — one seed for all ``n`` copies would
give ``n`` identical samples on a deterministic server. Either way the rows come back in the hf
backend's order. Each completion's ``log_probs`` are SGLang's ``output_token_logprobs``:
``log_softmax(z / T)`` of the full vocabulary, *before* top-k / top-p truncation (greedy:
``log_softmax(z)``). With ``processed`` the request sets ``return_sampling_mask`` and the log-probs
are ``output_token_sampling_logprobs``: the token's log-prob under the truncated, renormalised
distribution it was drawn from (greedy: 0).

Finish reasons, as SGLang sends them::

    {"type": "stop", "matched": 2 | "</s>" | [2, 7]}  → "stop"   (token id, string or ids)
    {"type": "length", "length": 128}                 → "length"
    {"type": "abort", "message": ..., "status_code"}  → an abort (the caller resubmits that sample)
    null (unfinished)                                 → SGLangProtocolError
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from rllab.types import Completion, SamplingParams

from .errors import SGLangProtocolError

try:  # 3-4x faster than json on SGLang's float-heavy answers
    from msgspec.json import decode, encode
except ImportError:  # pragma: no cover - msgspec is in the sglang extra
    decode = json.loads

    def encode(obj: Any) -> bytes:
        return json.dumps(obj).encode()


_M64 = (1 << 64) - 1


def sample_seed(seed: int, prompt_index: int, sample: int) -> int:
    """A non-negative int64 ``sampling_seed`` for sample ``sample`` of prompt ``prompt_index``:
    splitmix64 of the three numbers (any int ``seed``, taken modulo 2**64)."""
    x = (seed * 0x9E3779B97F4A7C15 + (prompt_index + 1) * 0xBF58476D1CE4E5B9 + (sample + 1) * 0x94D049BB133111EB) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def sample_seeds(seed: int, first_prompt: int, prompts: int, n: int) -> list[int]:
    """:func:`sample_seed` of every (prompt, sample) of a request, prompt-major: ``prompts × n``."""
    return [sample_seed(seed, first_prompt + i, j) for i in range(prompts) for j in range(n)]


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


def request_body(prompts: list[tuple[int, ...]], first_index: int, params: SamplingParams, *,
                 processed: bool = False, samples: Sequence[tuple[int, int]] | None = None) -> tuple[dict, list[int]]:
    """The ``/generate`` body for ``prompts`` (the request's first is prompt ``first_index`` of
    the step) and, for each of the ``len(prompts) × n`` rows it returns, its prompt's offset in
    ``prompts``. ``processed``: ask for ``output_token_sampling_logprobs`` too.

    ``samples``: only these ``(prompt offset, sample)`` pairs, one row each (``n = 1``, each with
    its own ``sampling_seed`` when ``params.seed`` is set — the seed the full request gave it), in
    the order given: the resubmission of aborted samples."""
    n = params.n
    if samples is not None:
        base = sampling_params_json(params, n=1)
        sps = [base] * len(samples) if params.seed is None else [
            {**base, "sampling_seed": sample_seed(params.seed, first_index + i, j)} for i, j in samples
        ]
        body = {"input_ids": [prompts[i] for i, _ in samples], "sampling_params": sps, "return_logprob": True,
                "logprob_start_len": -1}
        if processed:
            body["return_sampling_mask"] = True
        return body, [i for i, _ in samples]
    if params.seed is None:
        body: dict[str, Any] = {"input_ids": prompts, "sampling_params": sampling_params_json(params)}
    else:  # one row per sample, each with its own seed
        base = sampling_params_json(params, n=1)
        seeds = sample_seeds(params.seed, first_index, len(prompts), n)
        body = {
            "input_ids": [p for p in prompts for _ in range(n)],
            "sampling_params": [{**base, "sampling_seed": s} for s in seeds],
        }
    body["return_logprob"] = True
    body["logprob_start_len"] = -1
    if processed:
        body["return_sampling_mask"] = True
    rows = [i for i in range(len(prompts)) for _ in range(n)]
    return body, rows


NOT_SGLANG = (
    "this is not an SGLang server (SGLang answers POST /generate and GET /health with JSON); "
    "check the URL and port in backend.urls"
)

_MAX_TEXT = 300
"""Characters of a non-JSON error body kept in a message (the rest is cut)."""


def error_message(body: bytes) -> str:
    """SGLang's message from an error body: ``{"error": {"message": ...}}``, ``{"error": "..."}``
    (a contract violation), ``{"message": ...}`` or plain text (whitespace folded, cut at
    ``_MAX_TEXT`` characters). An HTML page — what a web server that is not SGLang answers — is
    never echoed: the message says so, with the page's title."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return _plain_message(text)
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)
        return str(err)
    return text


def _plain_message(text: str) -> str:
    """A non-JSON error body as one short line; an HTML page as a sentence naming the mistake."""
    if not text:
        return "(empty body)"
    head = text[:200].lower()
    if head.startswith("<!doctype html") or head.startswith("<html") or "<html" in head or "<body" in head:
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.I | re.S)
        named = " " + repr(" ".join(title.group(1).split())[:80]) if title and title.group(1).strip() else ""
        return f"an HTML page{named}, not JSON: {NOT_SGLANG}"
    line = " ".join(text.split())
    return line if len(line) <= _MAX_TEXT else line[:_MAX_TEXT] + f"… ({len(line) - _MAX_TEXT} more characters)"


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


def _row_fields(row: Any, where: str, sampled: bool, oldest: bool = False, submitted: str | None = None):
    """One ``/generate`` result → ``(token ids, log-probs, finish reason, weight version, abort
    message, abort status, mixed)``, each checked against the contract (module docstring).

    The weight version: ``meta_info.weight_version`` (the server's at the end), or, when
    ``meta_info.weight_versions`` spans name several, all of them joined (``"2|3"``: stale
    against any one version). With ``oldest`` (``push = "pause"``): the version of the row's first
    span — the weights of its first tokens, the oldest in it — or, from a server that reports no
    spans, ``submitted`` (the version in force when the request was sent; conservative), else
    ``meta_info.weight_version``. ``mixed``: the spans name more than one version."""
    if not isinstance(row, dict):
        raise SGLangProtocolError(f"{where}: expected an object, got {type(row).__name__}")
    meta = row.get("meta_info")
    ids = row.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(ids, list):
        raise SGLangProtocolError(f"{where}: missing output_ids or meta_info (is the server an SGLang /generate?)")
    kind, abort_msg, abort_status = _finish(meta, where)
    lps = meta.get("output_token_logprobs")
    if lps is None and not ids:
        lps = []
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
    spans = [s for s in meta.get("weight_versions") or () if isinstance(s, dict)]
    versions = {str(s.get("version")) for s in spans}
    if oldest:
        version = spans[0].get("version") if spans else (submitted if submitted is not None else version)
    elif len(versions) > 1:
        version = "|".join(sorted(versions))  # the weights changed mid-request
    return tuple(ids), log_probs, kind, None if version is None else str(version), abort_msg, abort_status, len(versions) > 1


def parse_row(row: Any, prompt: tuple[int, ...], prompt_index: int, where: str = "result",
              sampled: bool = False) -> tuple[Completion, str | None, int | None]:
    """One ``/generate`` result → ``(Completion, abort message, abort status)``.

    ``output_token_logprobs[i] = [logprob, token_id, text]`` must name ``output_ids[i]``. With
    ``sampled`` (``logprobs = "processed"``) the completion's log-probs are
    ``output_token_sampling_logprobs`` instead: one float per output token.
    """
    ids, log_probs, kind, version, abort_msg, abort_status, _ = _row_fields(row, where, sampled)
    c = Completion(prompt_ids=prompt, token_ids=ids, log_probs=log_probs, finish_reason=kind,
                   prompt_index=prompt_index, weight_version=version)
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


def answer_rows(raw: bytes, n: int, where: str, asked: str) -> list:
    """The ``n`` results of a ``/generate`` answer from ``where`` (one result alone, a JSON
    object, is a list of one); otherwise an :class:`SGLangProtocolError` naming ``where`` and what
    was ``asked`` (``"2 samples"``)."""
    try:
        data = decode(raw)
    except ValueError as e:
        raise SGLangProtocolError(f"sglang: {where} answered with invalid JSON: {e}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or len(data) != n:
        got = len(data) if isinstance(data, list) else type(data).__name__
        raise SGLangProtocolError(f"sglang: {where} returned {got} results for {asked}")
    return data


def parse_rows(raw: bytes, prompts: Sequence[tuple[int, ...]], rows: Sequence[int], first_index: int, where: str,
               sampled: bool = False, *, oldest: bool = False, submitted: str | None = None,
               mixed: list[int] | None = None) -> tuple[list[Completion], list[tuple[int, str, int | None]]]:
    """The answer of ``where`` (``<url>/generate``) → ``(completions, aborts)``: a ``Completion``
    per row (``rows[j]``: the offset of row j's prompt in ``prompts``; its ``prompt_index`` is
    ``first_index + rows[j]``) and the ``(row j, message, status)`` of every aborted one.
    ``oldest``, ``submitted``: each completion's version is its oldest (:func:`_row_fields`);
    ``mixed``: the rows j (not aborted) whose tokens span a weight update are appended to it."""
    data = answer_rows(raw, len(rows), where, f"{len(rows)} samples")
    fields = [_row_fields(row, f"{where} result", sampled, oldest, submitted) for row in data]
    ids, log_probs, kinds, versions, abort_msgs, abort_statuses, spans = zip(*fields) if fields else ((),) * 7
    if mixed is not None:
        mixed.extend(j for j, (m, a) in enumerate(zip(spans, abort_msgs)) if m and a is None)  # an abort is resubmitted
    completions = Completion.columns(
        [prompts[i] for i in rows], ids, log_probs, kinds, [first_index + i for i in rows], versions
    )
    return completions, [(j, m, st) for j, (m, st) in enumerate(zip(abort_msgs, abort_statuses)) if m is not None]
