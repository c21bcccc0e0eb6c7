"""Partial rollouts on SGLang: :func:`generate_until`, the backend's ``generate_until``.

Each group is one ``/generate`` request (its rows as a batch, ``n = 1`` each, its own
``max_new_tokens`` per row and, for a seeded step, the row's ``sampling_seed``), every row named
by its own ``rid`` (a list, as ``GenerateReqInput.rid`` takes). The requests go out together (at
most ``max_in_flight`` at a time, round-robin over ``urls``); as they answer, the groups whose
rows all finished are counted, and once ``needed`` are complete every row still running is
stopped with ``POST /abort_request {"rid": ...}``. SGLang answers an aborted row with the tokens it
had sampled and ``finish_reason`` ``{"type": "abort"}``: those rows come back as ``"abort"``
completions (never resubmitted here: the rollout stage drops or continues them). A request not
yet sent when the batch is full is not sent: its rows come back ``"abort"`` with no tokens.
Transport failures are retried as for ``generate`` (:mod:`~rllab_backends.sglang.transport`).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Sequence

from rllab.types import Completion, SamplingParams

from . import protocol
from .errors import RETRYABLE_STATUS, Retry, SGLangRequestError


def group_bodies(prompts: Sequence[tuple[int, ...]], params: SamplingParams, caps: Sequence[int],
                 groups: Sequence[int]) -> list[tuple[int, int, dict]]:
    """``(first row, end row, /generate body)`` of each group's request."""
    bounds = [0] + [k for k in range(1, len(groups)) if groups[k] != groups[k - 1]] + [len(groups)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        base = protocol.sampling_params_json(params, n=1)
        sps = [{**base, "max_new_tokens": int(caps[k]),
                **({} if params.seed is None else {"sampling_seed": protocol.sample_seed(params.seed, k, 0)})} for k in range(a, b)]
        body = {"input_ids": [list(p) for p in prompts[a:b]], "sampling_params": sps, "return_logprob": True,
                "logprob_start_len": -1}
        out.append((a, b, body))
    return out


async def generate_until(backend: Any, prompts: Sequence[tuple[int, ...]], params: SamplingParams, caps: Sequence[int],
                         groups: Sequence[int], needed: int) -> list[Completion]:
    """See the module docstring; ``backend`` the :class:`~rllab_backends.sglang.backend.SGLangBackend`."""
    backend._client()
    sampled = backend.config.logprobs == "processed"
    out: list[Completion | None] = [None] * len(prompts)
    running: dict[int, tuple[str, list[str]]] = {}  # request → (url, its rows' rids) while in flight
    full = asyncio.Event()
    complete = 0

    async def one(r: int, a: int, b: int, body: dict):
        nonlocal complete

        async def attempt(url: str):
            body["rid"] = rids = [uuid.uuid4().hex for _ in range(b - a)]
            if sampled:
                body["return_sampling_mask"] = True
            running[r] = (url, rids)
            try:
                status, raw = await backend._call("POST", url, "/generate", body)
            finally:
                running.pop(r, None)
            if status != 200:
                msg = protocol.error_message(raw)
                if status in RETRYABLE_STATUS:
                    raise Retry("status", f"{url}/generate: HTTP {status}: {msg}", status, msg)
                raise SGLangRequestError(f"sglang: {url}/generate rejected the request (HTTP {status}): {msg}",
                                         status=status, message=msg)
            return protocol.parse_rows(raw, list(prompts[a:b]), list(range(b - a)), a, f"{url}/generate", sampled)

        async with backend._sem:
            if full.is_set():  # the batch filled while this group waited: never sent
                got, aborted = [Completion(prompt_ids=tuple(prompts[k]), token_ids=(), log_probs=(), finish_reason="abort",
                                           prompt_index=k, weight_version=backend.version) for k in range(a, b)], [1]
            else:
                got, aborted = await backend._with_retries(f"/generate for group rows {a}..{b - 1}", attempt, backend.urls)
        out[a:b] = got
        if not aborted:
            complete += 1
            if complete >= needed and not full.is_set():
                full.set()
                await _abort_running(backend, running)

    jobs = [one(r, a, b, body) for r, (a, b, body) in enumerate(group_bodies(prompts, params, caps, groups))]
    backend._requests = len(jobs)
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    backend._totals["aborted"] += sum(c is not None and c.finish_reason == "abort" for c in out)
    return [c for c in out if c is not None]


async def _abort_running(backend: Any, running: dict[int, tuple[str, list[str]]]) -> None:
    """``/abort_request`` for every row of the requests still in flight, sent together (best
    effort: a row that finished meanwhile is unknown to SGLang, which ignores it)."""

    async def one(url: str, rid: str) -> None:
        try:
            await backend._call("POST", url, "/abort_request", {"rid": rid}, timeout=5.0)
        except Retry:
            pass

    await asyncio.gather(*(one(url, rid) for url, rids in list(running.values()) for rid in rids))
