"""Prompt log-probs from SGLang: a server scores given token sequences (a teacher for ``opd``).

One ``POST /generate`` per call, every sequence a row of ``input_ids``, with
``return_logprob = true``, ``logprob_start_len = first − 1`` (one per row) and
``sampling_params.max_new_tokens = 0``: SGLang runs the prefill only and answers, per row,
``meta_info.input_token_logprobs`` — ``[logprob, token_id, text]`` for every position from
``logprob_start_len`` on, the first one ``[null, …]`` (no context scored it). Entry ``k ≥ 1`` is
``log_softmax(z)`` of token ``first − 1 + k`` given the tokens before it: SGLang's prompt log-probs
are taken before temperature (``sglang/srt/layers/logprob_processor.py``, 0.5.23). Every entry's
token id is checked against the sequence sent, and the call is retried as ``/generate`` is
(:mod:`~rllab_backends.sglang.transport`).
"""

from __future__ import annotations

import uuid
from typing import Sequence

from .errors import RETRYABLE_STATUS, Retry, SGLangProtocolError, SGLangRequestError
from .protocol import answer_rows, error_message


def score_body(sequences: list[list[int]], first: list[int]) -> dict:
    """The ``/generate`` body that scores ``sequences[i][first[i]:]``."""
    return {
        "input_ids": sequences,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": [f - 1 for f in first],
        "rid": uuid.uuid4().hex,
    }


def parse_scores(raw: bytes, sequences: list[list[int]], first: list[int], where: str) -> list[list[float]]:
    """The log-probs of ``sequences[i][first[i]:]`` from a ``/generate`` answer (module docstring)."""
    rows = answer_rows(raw, len(sequences), where, f"{len(sequences)} sequences to score")
    out = []
    for i, (row, seq, f) in enumerate(zip(rows, sequences, first)):
        meta = row.get("meta_info") if isinstance(row, dict) else None
        entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
        want = len(seq) - f + 1
        if not isinstance(entries, list) or len(entries) != want:
            n = "no" if not isinstance(entries, list) else len(entries)
            raise SGLangProtocolError(
                f"{where}: row {i}: {n} input_token_logprobs for a sequence of {len(seq)} tokens scored from "
                f"position {f} ({want} expected); does this server honour logprob_start_len?"
            )
        lps = []
        for k, e in enumerate(entries[1:], start=1):
            pos = f - 1 + k
            if not isinstance(e, list) or len(e) < 2 or e[1] != seq[pos] or not isinstance(e[0], (int, float)):
                raise SGLangProtocolError(f"{where}: row {i}: input_token_logprobs[{k}] = {e!r} is not a log-prob of token {seq[pos]}")
            lps.append(float(e[0]))
        out.append(lps)
    return out


class Score:
    """:meth:`prompt_logprobs`, a part of :class:`~rllab_backends.sglang.backend.SGLangBackend`
    (uses its transport: ``urls``, retries, the event loop)."""

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]], first: Sequence[int]) -> list[list[float]]:
        """Per sequence, the log-prob of each token from position ``first[i]`` on given the tokens
        before it, ``log_softmax(z)`` of the served model (``len(seq) − first[i]`` values)."""
        seqs = [[int(t) for t in s] for s in sequences]
        first = [int(f) for f in first]
        for i, (s, f) in enumerate(zip(seqs, first)):
            if not 1 <= f <= len(s):
                raise ValueError(f"sglang prompt_logprobs: sequence {i} has {len(s)} tokens; first = {f} must be in 1..{len(s)}")
        if not seqs:
            return []
        body = score_body(seqs, first)
        what = f"/generate scoring {len(seqs)} sequences (prompt log-probs)"

        async def attempt(url: str):
            self._client()
            status, raw = await self._call("POST", url, "/generate", body)
            if status != 200:
                msg = error_message(raw)
                if status in RETRYABLE_STATUS:
                    raise Retry("status", f"{url}/generate: HTTP {status}: {msg}", status, msg)
                raise SGLangRequestError(f"sglang: {url}/generate rejected the scoring request (HTTP {status}): {msg}",
                                         status=status, message=msg)
            return parse_scores(raw, seqs, first, f"{url}/generate")

        return self._loop.run(self._with_retries(what, attempt, self.urls))
