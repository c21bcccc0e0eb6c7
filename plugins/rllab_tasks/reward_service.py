"""The HTTP side of the reward functions that ask a server (``remote``, ``llm_judge``).

One POST of a JSON body, answered with JSON, through ``requests``:

- each attempt first takes a token from a process-wide token bucket per URL (``rate_limit``
  requests per second, bursts of up to ``burst``), so every function and thread that asks the
  same server shares one budget (verl's rate-limited reward manager);
- an attempt that cannot connect, times out (``timeout_s``, for connecting and for each read) or
  is answered 429 or 5xx is retried up to ``retries`` times, after ``backoff_s``, then twice that,
  four times that … (at most ``max_backoff_s``), each wait shortened by a random fraction of up to
  ``jitter`` so that requests that failed together do not come back together; a ``Retry-After``
  header (seconds or an HTTP date) sets the wait instead, up to ``max_backoff_s``;
- each request waits out its own backoff: a call's requests go through :func:`ask_all`, which keeps
  up to ``max_concurrency`` attempts in flight and puts a request that must wait aside until its
  time, so that one failure holds back no other request; calls made at once (threads: the warm
  start's probes) share those ``max_concurrency`` places per URL, so the service never has more
  requests from the process in flight;
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

import hashlib
import heapq
import json
import math
import random
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait as wait_futures
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import attrs

import rllab

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
"""Statuses worth asking again: too many requests, and the server's own failures."""


class RewardServiceError(RuntimeError):
    """A reward server could not be reached, kept failing, or answered something unusable.

    ``transient``: the server could not be asked (it kept failing, or was down); another time may
    go better, so the error is not remembered with the scores."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


MISSING = "the remote and llm_judge rewards need the requests package, which is not installed: pip install 'rllab[remote]'"


def installed() -> None:
    """Refuse, naming the ``pip install``, when requests is not installed, without importing it:
    the remote and llm_judge rewards' ``check_installed``, asked before a run creates anything
    (:func:`rllab.training.parts.check_installed`)."""
    import importlib.util

    if importlib.util.find_spec("requests") is None:
        raise rllab.MissingExtraError(MISSING)


def _requests():
    try:
        import requests
    except ImportError:
        raise rllab.MissingExtraError(MISSING) from None
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


LONGEST_WAIT_S = 86_400.0
"""The longest ``timeout_s``, ``backoff_s`` and ``max_backoff_s`` (a day): an infinite one would
overflow the socket's deadline (OverflowError on the first request), not wait forever."""


@attrs.frozen(kw_only=True)
class HttpKnobs:
    """The knobs every reward server shares (mixed into the functions' configs)."""

    timeout_s: float = rllab.knob(120.0, help="seconds to connect and to wait for each read of the answer", gt=0.0, le=LONGEST_WAIT_S)
    retries: int = rllab.knob(10, help="attempts after the first on a connection error, a timeout, a 429 or a 5xx", ge=0)
    backoff_s: float = rllab.knob(0.5, help="the wait before the first retry; each next wait doubles", ge=0.0, le=LONGEST_WAIT_S)
    max_backoff_s: float = rllab.knob(30.0, help="the longest wait between two attempts (a longer Retry-After included)", ge=0.0,
                                      le=LONGEST_WAIT_S)
    jitter: float = rllab.knob(
        0.5, help="each backoff is shortened by a random fraction of up to this (0: exactly backoff_s, 2·backoff_s, …)",
        ge=0.0, le=1.0,
    )
    rate_limit: float | None = rllab.knob(
        None, help="the most requests per second to this URL, shared by every function and thread of the process "
        "(a token bucket); None: no limit", gt=0.0,
    )
    burst: int = rllab.knob(1, help="with rate_limit: how many requests may go at once after an idle spell (the bucket's size)", ge=1)
    max_concurrency: int = rllab.knob(
        8, help="requests in flight at once to this URL (one per distinct completion or group), shared by every call "
        "and thread of the process; a request waiting to be retried takes no place", ge=1,
    )
    cooldown_s: float = rllab.knob(
        60.0, help="after a request has used up its retries, requests to the URL fail at once for this long (0: never)", ge=0.0,
    )
    headers: str = rllab.knob("{}", help='extra HTTP headers as a JSON object: \'{"Authorization": "Bearer …"}\'', validator=check_headers)
    cache_size: int = rllab.knob(
        100_000, help="distinct requests whose scores the process remembers, so that an answer scored once is not "
        "sent again (in a later step, a probe, an evaluation); 0: remember none (identical requests within one call "
        "are still sent once)", ge=0,
    )


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


_PLACES: dict[tuple[str, int], threading.BoundedSemaphore] = {}


def places_for(url: str, n: int) -> threading.BoundedSemaphore:
    """The process-wide places in flight of ``url`` (``max_concurrency`` = ``n``), shared by every
    call and thread that asks it: an attempt holds one while its POST is out."""
    key = (url, int(n))
    with _BUCKETS_LOCK:
        if key not in _PLACES:
            _PLACES[key] = threading.BoundedSemaphore(n)
        return _PLACES[key]


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
    """The longest wait before retry ``attempt`` (0 for the first retry): ``backoff_s · 2^attempt``, at most ``max_backoff_s``."""
    return min(knobs.max_backoff_s, knobs.backoff_s * 2.0**attempt)


def retry_wait(attempt: int, knobs: HttpKnobs, retry_after: float | None = None, u: float = 0.0) -> float:
    """The wait before retry ``attempt``: the server's ``Retry-After`` when it gave one (at most
    ``max_backoff_s``: it knows when it will answer), else :func:`backoff` shortened by the
    fraction ``jitter · u`` (``u`` uniform in [0, 1))."""
    if retry_after is not None:
        return min(retry_after, knobs.max_backoff_s)
    return backoff(attempt, knobs) * (1.0 - knobs.jitter * u)


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait that a ``Retry-After`` header asks for: a number of seconds, or an HTTP date
    (``Wed, 21 Oct 2015 07:28:00 GMT``; a date past is 0); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        from datetime import timezone

        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now())


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


def _down(url: str, knobs: HttpKnobs, clock: Callable[[], float]) -> RewardServiceError | None:
    """The error that marked ``url`` down, while it is (cooldown_s), else None."""
    with _STATE_LOCK:
        down = _DOWN.get(url)
    if down is not None and clock() < down[0]:
        return RewardServiceError(f"{down[1]} (not asked again for {down[0] - clock():.0f} s: cooldown_s = {knobs.cooldown_s})",
                                  transient=True)
    return None


def _attempt(url: str, body: Any, knobs: HttpKnobs, headers: dict, who: str) -> tuple[str, Any, float | None]:
    """One POST: ``("ok", answer, None)``, ``("retry", what went wrong, Retry-After seconds or None)``
    or ``("fail", RewardServiceError, None)`` (not worth asking again)."""
    requests = _requests()
    try:
        with places_for(url, knobs.max_concurrency):  # no more in flight to the URL from the process
            if knobs.rate_limit is not None:
                bucket_for(url, knobs.rate_limit, knobs.burst).take()
            r = _session().post(url, json=body, headers=headers, timeout=knobs.timeout_s)
    except requests.Timeout:
        return "retry", f"no answer within timeout_s = {knobs.timeout_s}", None
    except requests.RequestException as e:
        return "retry", f"{type(e).__name__}: {e}", None
    if r.status_code in RETRY_STATUS:
        return "retry", f"HTTP {r.status_code}: {r.text[:200]!r}", parse_retry_after(r.headers.get("Retry-After"))
    if r.status_code >= 400:
        return "fail", RewardServiceError(f"{who}: {url} answered HTTP {r.status_code}: {r.text[:200]!r}"), None
    try:
        return "ok", r.json(), None
    except ValueError:
        return "fail", RewardServiceError(f"{who}: {url} answered something that is not JSON: {r.text[:200]!r}"), None


def failing_streak(knobs: HttpKnobs) -> float:
    """Failed attempts in a row (no answer in between) after which a call sends no new request
    until a retry gets an answer: ``max(4, max_concurrency)``; never with ``cooldown_s = 0``
    (no URL is ever down: every request tries its own retries)."""
    return max(4, knobs.max_concurrency) if knobs.cooldown_s > 0 else math.inf


def ask_all(url: str, bodies: Sequence[Any], knobs: HttpKnobs, *, who: str, sleep: Callable[[float], None] = time.sleep,
            clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
            waits: list | None = None, on_answer: Callable[[int, Any], None] | None = None) -> list[Any]:
    """POST each of ``bodies`` to ``url``; per body its decoded JSON answer, or the
    :class:`RewardServiceError` it ended in (returned, not raised: every body is seen through).

    Up to ``max_concurrency`` attempts are in flight at once. A failed attempt worth repeating
    puts its request aside until its own wait (:func:`retry_wait`) is over, while the other
    requests go on. Once :func:`failing_streak` attempts in a row have failed (a server that is
    down, not one that fails now and then), no new request is sent until one of those waiting gets
    an answer, so that an outage costs a few requests' retries rather than every row's. A request
    that used up its ``retries`` marks the URL down for ``cooldown_s``, and the requests not yet
    answered then fail at once. ``waits``, when given, receives ``(index, attempt, seconds)``
    for each wait scheduled; ``on_answer(index, answer)``, when given, hears each body's answer
    (or the error it ended in) as soon as it has it, in the calling thread."""
    n = len(bodies)
    out: list[Any] = [None] * n
    down = _down(url, knobs, clock)
    if down is not None:
        return [down] * n
    headers = json.loads(knobs.headers)
    rng = rng or random.Random()
    fresh = list(range(n - 1, -1, -1))  # never sent yet, popped from the end: first row first
    later: list[tuple[float, int, int]] = []  # (when, index, attempt): retries, a heap
    running: dict = {}
    workers = min(knobs.max_concurrency, n)
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    failed: RewardServiceError | None = None
    streak, limit = 0, failing_streak(knobs)

    def settle(i: int, attempt: int, outcome: tuple[str, Any, float | None]) -> None:
        nonlocal failed, streak
        kind, value, after = outcome
        if kind != "retry":  # an answer, good or bad: the server is there
            out[i] = value
            streak = 0
            if on_answer is not None:
                on_answer(i, value)
            return
        streak += 1
        if attempt < knobs.retries:
            _say_once(url, f"rllab: {who}: {url}: {value}; retrying up to {knobs.retries} times, {knobs.backoff_s} s apart "
                           f"and doubling, each request on its own (retries, backoff_s; said once per URL)")
            wait = retry_wait(attempt, knobs, after, rng.random())
            if waits is not None:
                waits.append((i, attempt, wait))
            heapq.heappush(later, (clock() + wait, i, attempt + 1))
            return
        message = f"{who}: {url} failed {knobs.retries + 1} attempt(s) (retries = {knobs.retries}); last: {value}"
        out[i] = RewardServiceError(message, transient=True)
        if knobs.cooldown_s > 0 and failed is None:
            failed = out[i]
            with _STATE_LOCK:
                _DOWN[url] = (clock() + knobs.cooldown_s, message)

    def start(i: int, attempt: int) -> None:
        if pool is None:
            settle(i, attempt, _attempt(url, bodies[i], knobs, headers, who))
        else:
            running[pool.submit(_attempt, url, bodies[i], knobs, headers, who)] = (i, attempt)

    try:
        while fresh or later or running:
            if failed is not None:  # the URL is down: what has not been sent again fails at once
                for i in fresh + [i for _, i, _ in later]:
                    out[i] = RewardServiceError(f"{failed} (not asked again: cooldown_s = {knobs.cooldown_s})", transient=True)
                fresh, later = [], []
                if not running:
                    break
            while len(running) < workers and (later and later[0][0] <= clock() or fresh and streak < limit):
                if later and later[0][0] <= clock():  # a retry that is due goes first
                    _, i, attempt = heapq.heappop(later)
                    start(i, attempt)
                else:
                    start(fresh.pop(), 0)
            if running:
                timeout = max(0.0, later[0][0] - clock()) if later and len(running) < workers else None
                done, _ = wait_futures(list(running), timeout=timeout, return_when=FIRST_COMPLETED)
                for f in done:
                    i, attempt = running.pop(f)
                    settle(i, attempt, f.result())
            elif later:  # nothing in flight: wait for the first retry due
                when, i, attempt = heapq.heappop(later)
                sleep(max(0.0, when - clock()))
                start(i, attempt)
            elif fresh:  # failing, with nothing in flight or waiting (cooldown_s = 0): one more request
                start(fresh.pop(), 0)
    finally:
        if pool is not None:  # normally all done; on an interruption the requests in flight end on their own
            pool.shutdown(wait=False, cancel_futures=True)
    return out


def post_json(url: str, body: Any, knobs: HttpKnobs, *, who: str, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None, waits: list | None = None) -> Any:
    """POST ``body`` as JSON to ``url`` and return the decoded JSON answer, retrying as the module
    docstring says (``waits``: see :func:`ask_all`); raises :class:`RewardServiceError`."""
    answer = ask_all(url, [body], knobs, who=who, sleep=sleep, clock=clock, rng=rng, waits=waits)[0]
    if isinstance(answer, RewardServiceError):
        raise answer
    return answer


# --------------------------------------------------------------------------- remembered scores


class ScoreCache:
    """What the process remembers of a reward function's requests: key → score (or the error a
    request ended in that asking again would not change), the ``size`` most recently used; and,
    with ``size`` > 0, the requests being asked now (``pending``: key → :class:`Asking`), which
    another call (another thread) waits for rather than sends again."""

    def __init__(self, size: int):
        self.size = size
        self.data: OrderedDict = OrderedDict()
        self.lock = threading.Lock()
        self.pending: dict[Any, Asking] = {}

    def get(self, key: Any) -> Any:
        with self.lock:
            if key in self.data:
                self.data.move_to_end(key)
                return self.data[key]
        return None

    def put(self, key: Any, value: Any) -> None:
        if self.size <= 0:
            return
        with self.lock:
            self.data[key] = value
            self.data.move_to_end(key)
            while len(self.data) > self.size:
                self.data.popitem(last=False)


class Asking:
    """A request one call is asking: another call waits for its :attr:`value` (:meth:`wait`)."""

    def __init__(self):
        self.done = threading.Event()
        self.value: Any = None

    def settle(self, value: Any) -> None:
        self.value = value
        self.done.set()

    def wait(self) -> Any:
        self.done.wait()
        return self.value


_CACHES: dict[Any, ScoreCache] = {}


def cache_for(config: Any) -> ScoreCache:
    """The process-wide :class:`ScoreCache` of a reward function's config (one per distinct config:
    another URL, template or score_key scores apart)."""
    with _STATE_LOCK:
        if config not in _CACHES:
            _CACHES[config] = ScoreCache(config.cache_size)
        return _CACHES[config]


def forget() -> None:
    """Forget every remembered score and every URL marked down (for tests and benchmarks)."""
    with _STATE_LOCK:
        _CACHES.clear()
        _DOWN.clear()


def score_unique(keys: Sequence[str], ask: Callable[[list[int], Callable[[int, Any], None]], list[Any]], config: Any,
                 report: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Per row, its score (or the error it ended in), ``keys[i]`` naming row i's request: each
    distinct request is asked once — ``ask(indices, answered)`` asks for the rows ``indices``, one
    row per distinct request, returns their results in order, and may call ``answered(k, result)``
    as soon as the k-th is known — and those the process remembers (``config.cache_size``; a
    transient error is not remembered) not at all. With ``cache_size`` > 0 a request that another
    call is asking at this moment (another thread) is not sent again: this call waits for that
    answer, whatever it is, as it would have found it remembered had the other call ended first;
    it hears it as soon as the other call's ``ask`` says it (``answered``), not once that call's
    slowest request (a long chain of retries, say) is answered too.
    ``report(i, result)``, when given, hears each row's result as soon as it is known (in the
    calling thread), once."""
    cache = cache_for(config)
    keys = [hashlib.blake2b(k.encode(), digest_size=16).digest() for k in keys]  # 16 bytes a request, however long
    rows: dict[bytes, list[int]] = {}
    for i, k in enumerate(keys):
        rows.setdefault(k, []).append(i)
    known: dict[bytes, Any] = {}
    todo: list[bytes] = []
    elsewhere: dict[bytes, Asking] = {}  # asked by another call now
    mine: dict[bytes, Asking] = {}  # asked by this call, not yet settled: what another call waits for
    with cache.lock:
        for k in rows:
            if k in cache.data:
                cache.data.move_to_end(k)
                known[k] = cache.data[k]
            elif k in cache.pending:
                elsewhere[k] = cache.pending[k]
            else:
                todo.append(k)
                if cache.size > 0:
                    cache.pending[k] = mine[k] = Asking()
    told: set[bytes] = set()

    def tell(k: bytes, value: Any) -> None:
        if report is not None and k not in told:
            told.add(k)
            for i in rows[k]:
                report(i, value)

    def settle(k: bytes, value: Any) -> None:
        """Request ``k``'s result is known: remembered, and heard at once by a call waiting for it
        (not only once this call's slowest request is answered)."""
        if not (isinstance(value, RewardServiceError) and value.transient):
            cache.put(k, value)
        with cache.lock:
            asking = mine.pop(k, None)
            if asking is not None:
                del cache.pending[k]
        if asking is not None:
            asking.settle(value)

    def answered(j: int, value: Any) -> None:
        settle(todo[j], value)
        tell(todo[j], value)

    for k, value in known.items():
        tell(k, value)
    got: list[Any] = []
    try:
        got = ask([rows[k][0] for k in todo], answered) if todo else []
    finally:
        for k, value in zip(todo, got):
            known[k] = value
        with cache.lock:
            unsettled = [(j, k) for j, k in enumerate(todo) if k in mine]  # the others were settled as they came
        for j, k in unsettled:  # remembered, and a call waiting for it hears the answer, or why there is none
            settle(k, got[j] if j < len(got) else RewardServiceError(
                "the call that was asking this request stopped before its answer", transient=True))
    for k in todo:
        tell(k, known[k])
    for k, asking in elsewhere.items():
        known[k] = asking.wait()
        tell(k, known[k])
    return [known[k] for k in keys]
