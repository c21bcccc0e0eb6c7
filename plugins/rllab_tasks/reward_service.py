"""The HTTP side of the reward functions that ask a server (``remote``, ``llm_judge``).

One POST of a JSON body, answered with JSON, through ``requests``:

- each attempt first takes a token from a process-wide token bucket per URL (``rate_limit``
  requests per second, bursts of up to ``burst``), so every function and thread that asks the
  same server shares one budget (verl's rate-limited reward manager);
- an attempt that cannot connect, times out (``timeout_s``, for connecting and for each read) or
  is answered 429 or 5xx is retried up to ``retries`` times, after ``backoff_s``, then twice that,
  four times that … (at most ``max_backoff_s``; a ``Retry-After`` header of 429/503 is honoured
  when longer);
- any other 4xx, or an answer that is not JSON, fails at once: asking again would not change it;
- once a request has used up its retries, the URL counts as down for ``cooldown_s``: every request
  to it meanwhile fails at once with the same error, so that an outage costs one request's
  retries, not every row's (a failed batch is asked again row by row to name the failing row);
- the first failed attempt on a URL is said once on stderr, so that a run waiting on retries is
  not silent.

A failure raises :class:`RewardServiceError` naming the URL, the attempts and the last error;
the reward function's caller then follows ``rollout.reward_errors``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import attrs

import rllab

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
"""Statuses worth asking again: too many requests, and the server's own failures."""


class RewardServiceError(RuntimeError):
    """A reward server could not be reached, kept failing, or answered something unusable."""


def _requests():
    try:
        import requests
    except ImportError:
        raise ImportError("the remote and llm_judge rewards need the requests package: pip install 'rllab[remote]'") from None
    return requests


# --------------------------------------------------------------------------- knobs


def check_url(inst, attribute, value):
    """An http(s) URL with a host."""
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{attribute.name} = {value!r} is not an http(s) URL; give the server's address, e.g. http://127.0.0.1:8000/score")


def check_headers(inst, attribute, value):
    """A JSON object of string header values."""
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{attribute.name} = {value!r} is not JSON: {e}; write a JSON object, e.g. '{{\"Authorization\": \"Bearer …\"}}'") from None
    if not isinstance(parsed, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()):
        raise ValueError(f"{attribute.name} = {value!r} is not a JSON object of string values")


@attrs.frozen(kw_only=True)
class HttpKnobs:
    """The knobs every reward server shares (mixed into the functions' configs)."""

    timeout_s: float = rllab.knob(120.0, help="seconds to connect and to wait for each read of the answer", gt=0.0)
    retries: int = rllab.knob(10, help="attempts after the first on a connection error, a timeout, a 429 or a 5xx", ge=0)
    backoff_s: float = rllab.knob(1.0, help="the wait before the first retry; each next wait doubles", ge=0.0)
    max_backoff_s: float = rllab.knob(30.0, help="the longest wait between two attempts", ge=0.0)
    rate_limit: float | None = rllab.knob(
        None, help="the most requests per second to this URL, shared by every function and thread of the process "
        "(a token bucket); None: no limit", gt=0.0,
    )
    burst: int = rllab.knob(1, help="with rate_limit: how many requests may go at once after an idle spell (the bucket's size)", ge=1)
    max_concurrency: int = rllab.knob(8, help="requests in flight at once from one call (one per completion or group)", ge=1)
    cooldown_s: float = rllab.knob(
        60.0, help="after a request has used up its retries, requests to the URL fail at once for this long (0: never)", ge=0.0,
    )
    headers: str = rllab.knob("{}", help='extra HTTP headers as a JSON object: \'{"Authorization": "Bearer …"}\'', validator=check_headers)


# --------------------------------------------------------------------------- rate limit


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` stored; :meth:`take` blocks until one is there.

    :param clock: the time source (``time.monotonic``); :param sleep: how to wait (``time.sleep``).
    """

    def __init__(self, rate: float, capacity: int, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.rate, self.capacity = float(rate), float(capacity)
        self.clock, self.sleep = clock, sleep
        self.tokens = self.capacity
        self.stamp = clock()
        self.lock = threading.Lock()

    def take(self) -> float:
        """Take one token, waiting for it; returns the seconds waited."""
        waited = 0.0
        while True:
            with self.lock:
                now = self.clock()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1.0:
                    self.tokens -= 1.0
                    return waited
                wait = (1.0 - self.tokens) / self.rate
            self.sleep(wait)
            waited += wait


_BUCKETS: dict[tuple[str, float, int], TokenBucket] = {}
_BUCKETS_LOCK = threading.Lock()


def bucket_for(url: str, rate: float, burst: int) -> TokenBucket:
    """The process-wide bucket of ``url`` at this rate and burst (shared by every caller)."""
    key = (url, float(rate), int(burst))
    with _BUCKETS_LOCK:
        if key not in _BUCKETS:
            _BUCKETS[key] = TokenBucket(rate, burst)
        return _BUCKETS[key]


# --------------------------------------------------------------------------- the client


_LOCAL = threading.local()


def _session():
    """One ``requests.Session`` per thread (keep-alive connections, never shared between threads)."""
    s = getattr(_LOCAL, "session", None)
    if s is None:
        s = _LOCAL.session = _requests().Session()
    return s


def backoff(attempt: int, knobs: HttpKnobs) -> float:
    """The wait before retry ``attempt`` (0 for the first retry): ``backoff_s · 2^attempt``, at most ``max_backoff_s``."""
    return min(knobs.max_backoff_s, knobs.backoff_s * 2.0**attempt)


def _retry_after(response) -> float:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return 0.0


_DOWN: dict[str, tuple[float, str]] = {}
"""URL → (monotonic time until which it counts as down, the error that put it there)."""
_SAID: set[str] = set()
_STATE_LOCK = threading.Lock()


def _say_once(url: str, text: str) -> None:
    with _STATE_LOCK:
        if url in _SAID:
            return
        _SAID.add(url)
    print(text, file=sys.stderr, flush=True)


def post_json(url: str, body: Any, knobs: HttpKnobs, *, who: str, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> Any:
    """POST ``body`` as JSON to ``url`` and return the decoded JSON answer, retrying as the module
    docstring says; raises :class:`RewardServiceError`."""
    requests = _requests()
    with _STATE_LOCK:
        down = _DOWN.get(url)
    if down is not None and clock() < down[0]:
        raise RewardServiceError(f"{down[1]} (not asked again for {down[0] - clock():.0f} s: cooldown_s = {knobs.cooldown_s})")
    headers = json.loads(knobs.headers)
    bucket = bucket_for(url, knobs.rate_limit, knobs.burst) if knobs.rate_limit is not None else None
    last = ""
    for attempt in range(knobs.retries + 1):
        if attempt:
            _say_once(url, f"rllab: {who}: {url}: {last}; retrying up to {knobs.retries} times, {knobs.backoff_s} s apart and doubling "
                           f"(retries, backoff_s; said once per URL)")
            sleep(wait)
        if bucket is not None:
            bucket.take()
        wait = backoff(attempt, knobs)
        try:
            r = _session().post(url, json=body, headers=headers, timeout=knobs.timeout_s)
        except requests.Timeout:
            last = f"no answer within timeout_s = {knobs.timeout_s}"
            continue
        except requests.RequestException as e:
            last = f"{type(e).__name__}: {e}"
            continue
        if r.status_code in RETRY_STATUS:
            last = f"HTTP {r.status_code}: {r.text[:200]!r}"
            wait = max(wait, min(_retry_after(r), knobs.max_backoff_s)) if r.status_code in (429, 503) else wait
            continue
        if r.status_code >= 400:
            raise RewardServiceError(f"{who}: {url} answered HTTP {r.status_code}: {r.text[:200]!r}")
        try:
            return r.json()
        except ValueError:
            raise RewardServiceError(f"{who}: {url} answered something that is not JSON: {r.text[:200]!r}") from None
    message = f"{who}: {url} failed {knobs.retries + 1} attempt(s) (retries = {knobs.retries}); last: {last}"
    if knobs.cooldown_s > 0:
        with _STATE_LOCK:
            _DOWN[url] = (clock() + knobs.cooldown_s, message)
    raise RewardServiceError(message)


def gather(fn: Callable[[Any], Any], items: Sequence[Any], concurrency: int) -> list[Any]:
    """``[fn(x) for x in items]``, at most ``concurrency`` at once; the first error is raised."""
    if len(items) <= 1 or concurrency == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(items))) as pool:
        return list(pool.map(fn, items))
