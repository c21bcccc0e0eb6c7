"""The backend's exchanges with its servers: one HTTP call, retries with backoff, the event loop.

Faults: a refused connection, a dropped connection (a server that died), a timeout and HTTP 5xx /
503 (a server busy loading weights) are retried with exponential backoff
(``retries``, ``backoff_s``) on the next server that answers ``/health``; an HTTP 4xx is not
retried and raises :class:`SGLangRequestError` carrying SGLang's own message. When retries run
out the call fails with an :class:`SGLangError` naming every try.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from . import wire
from .errors import (
    Retry,
    SGLangProtocolError,
    SGLangRequestError,
    SGLangTimeoutError,
    SGLangUnavailableError,
)
from .protocol import encode


class Loop:
    """The backend's private event loop, driven by whoever calls the backend: in the caller's
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


def transport_error(e: BaseException, where: str, total: float) -> Exception:
    """What a failed HTTP exchange with ``where`` means to the backend: a :class:`Retry` of
    kind timeout, refused or died, or a protocol error."""
    if isinstance(e, TimeoutError):
        return Retry("timeout", f"{where}: no answer within {total:g} s")
    if isinstance(e, wire.ConnectError):
        return Retry("refused", f"{where}: cannot connect ({e.strerror or e})")
    if isinstance(e, wire.ProtocolError):
        return SGLangProtocolError(f"sglang: {where} did not answer in HTTP/1.1: {e}")
    return Retry("died", f"{where}: the server dropped the connection mid-request ({e})")


class Transport:
    """HTTP calls and retries of :class:`~rllab_backends.sglang.backend.SGLangBackend` (a part of
    it). Uses the backend's ``config`` (``timeout_s``, ``retries``, ``backoff_s``,
    ``max_in_flight``), ``_session`` (the :class:`wire.Client`, made on first use), ``_sem``
    (the in-flight limit), ``_rr`` (the round-robin position) and ``_totals["retries"]``."""

    def _client(self) -> wire.Client:
        if self._session is None:
            self._sem = asyncio.Semaphore(self.config.max_in_flight)
            self._session = wire.Client()
        return self._session

    async def _call(self, method: str, url: str, path: str, body: Any = None, *, timeout: float | None = None):
        """One HTTP exchange → ``(status, raw body)``; transport failures become :class:`Retry`."""
        total = timeout or self.config.timeout_s
        try:
            return await self._client().request(method, url, path, None if body is None else encode(body), total)
        except (OSError, wire.ProtocolError) as e:
            raise transport_error(e, url + path, total) from None

    def _call_blocking(self, method: str, url: str, path: str, body: Any = None):
        """:meth:`_call` on a plain socket in this thread: for an exchange with nothing else in
        flight (a step's one ``/generate``), without the event loop's round trips."""
        total = self.config.timeout_s
        try:
            return self._client().request_blocking(method, url, path, None if body is None else encode(body), total)
        except (OSError, wire.ProtocolError) as e:
            raise transport_error(e, url + path, total) from None

    async def _healthy(self, url: str) -> bool:
        try:
            status, _ = await self._call("GET", url, "/health", timeout=min(10.0, self.config.timeout_s))
        except Retry:
            return False
        return status == 200

    async def _with_retries(self, what: str, attempt_fn, servers: list[str], first: tuple[int, Retry] | None = None):
        """Run ``attempt_fn(url)`` until it returns, retrying :class:`Retry` with backoff on the
        next server that passes ``/health``. ``first``: ``(start, failure)`` of a first try
        already made (on ``servers[start % len(servers)]``); the retries go on from it."""
        failures: list[str] = []
        last: Retry = Retry("refused", "no server answered /health")
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
            except Retry as e:
                failures.append(f"try {attempt + 1}: {e}")
                last = e
        text = (
            f"sglang: {what} failed after {self.config.retries + 1} tries; no partial batch is returned "
            f"(the run stops here):\n  " + "\n  ".join(failures)
        )
        if last.kind == "status":
            raise SGLangRequestError(text, status=last.status, message=last.message)
        raise (SGLangTimeoutError if last.kind == "timeout" else SGLangUnavailableError)(text)
