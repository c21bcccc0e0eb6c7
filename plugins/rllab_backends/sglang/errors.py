"""What can go wrong with a rollout from SGLang, as exceptions (every one an ``RllabError``)."""

from __future__ import annotations

from rllab import RllabError

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses worth another try (a busy, overloaded or restarting server)."""


class SGLangError(RllabError):
    """A rollout from SGLang failed; the step produced nothing (the run stops; rllab run says whether a checkpoint lets it continue)."""


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
    """SGLang aborted a sample (``finish_reason.type == "abort"``) on every one of its tries
    (``abort_retries``), or with a client-error status (not resubmitted)."""


class SGLangProtocolError(SGLangError):
    """A response that does not follow SGLang's /generate contract."""


class SGLangWeightSyncError(SGLangError):
    """Weights could not be pushed to a server (or the chosen ``weight_sync`` cannot work)."""


class StaleSampleError(SGLangError):
    """A completion was sampled from weights other than the last pushed (``stale = "error"``)."""


class Retry(Exception):
    """A failure worth another try, inside the backend (never leaves it): ``kind`` is one of
    ``"timeout"``, ``"refused"``, ``"died"`` or ``"status"`` (with the HTTP ``status`` and
    SGLang's ``message``). Aborted samples are not a ``Retry``: they are resubmitted on their own."""

    def __init__(self, kind: str, text: str, status: int = 0, message: str = ""):
        super().__init__(text)
        self.kind, self.status, self.message = kind, status, message
