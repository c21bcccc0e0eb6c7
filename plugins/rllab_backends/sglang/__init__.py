"""Rollouts from SGLang servers over their native HTTP API (``POST /generate``), with weight sync
after each step, retries and staleness checks (docs/sglang.md). One module per concern:

- :mod:`.config` — :class:`SGLangBackendConfig`, the knobs and their validation;
- :mod:`.protocol` — the ``/generate`` JSON contract: request bodies, per-sample seeds, answers
  parsed into ``Completion``\\ s (no I/O);
- :mod:`.wire` — the HTTP/1.1 client (asyncio and blocking drivers, one parser);
- :mod:`.transport` — one call to a server, retries with backoff, the private event loop;
- :mod:`.sync` — the weight-sync routes (``disk``, ``tensor``, ``distributed`` with
  :mod:`.distributed`);
- :mod:`.launch` — a server started and stopped by the backend;
- :mod:`.score` — prompt log-probs of given sequences (``prompt_logprobs``: a teacher for ``opd``);
- :mod:`.partial` — ``generate_until`` for partial rollouts: a request per group, ``/abort_request``
  for the rows still running once enough groups are complete;
- :mod:`.errors` — the exceptions;
- :mod:`.backend` — :class:`SGLangBackend`, the parts put together.
"""

from .backend import SGLangBackend, sglang
from .config import SGLangBackendConfig
from .errors import (
    SGLangAbortError,
    SGLangError,
    SGLangProtocolError,
    SGLangRequestError,
    SGLangTimeoutError,
    SGLangUnavailableError,
    SGLangWeightSyncError,
    StaleSampleError,
)

__all__ = [
    "SGLangAbortError",
    "SGLangBackend",
    "SGLangBackendConfig",
    "SGLangError",
    "SGLangProtocolError",
    "SGLangRequestError",
    "SGLangTimeoutError",
    "SGLangUnavailableError",
    "SGLangWeightSyncError",
    "StaleSampleError",
    "sglang",
]
