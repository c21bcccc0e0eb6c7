"""A stand-in reward server for tests: ``http.server`` in a thread, on 127.0.0.1 at a free port.

Every POST body is decoded as JSON and recorded (``bodies``, with the path in ``paths``). The
answer comes from ``script`` first — a list of ``(status, body, delay_s)`` or ``(status, body, delay_s, headers)``
consumed one per request, a ``body`` that is not ``bytes`` sent as JSON — then from ``answer(path, body)``, which
returns ``(status, json_body)``. The default answer is a grader: 1.0 when the request's
``response`` equals its ``label`` (stripped), else 0.0, for one item or a list of items; a
``/generate`` request is answered ``{"text": "Score: 10"}``.

``flaky = (k, status, headers)`` makes every k-th request (counting all, retries included) answer
``status`` with ``headers`` before anything else is consulted (e.g. ``(7, 503, {})``, or
``(5, 429, {"Retry-After": "0.2"})``); ``failed`` counts those answers. ``latency_s`` delays every
answer. ``port`` (default: a free one) lets a service come back at the address it had. ``calls`` counts the requests per body (its JSON with sorted keys). A scripted ``status`` of
None, and every request while ``down`` is true, closes the connection without an answer (a reset,
as a grader process that died behind its port gives).
"""

from __future__ import annotations

import collections
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


def grade(item: dict) -> float:
    return 1.0 if str(item.get("response", "")).strip() == str(item.get("label", "")).strip() else 0.0


def default_answer(path: str, body: Any) -> tuple[int, Any]:
    if path.endswith("/generate"):
        return 200, {"text": "Score: 10", "meta_info": {}}
    if isinstance(body, list):
        return 200, [grade(b) for b in body]
    return 200, grade(body)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128
    """Connections waiting to be accepted, as a real server's listen backlog (uvicorn's is 2048):
    with Python's default of 5, clients connecting at once on a busy machine overflow it, and each
    connection dropped waits out a 1 s SYN retransmission, a stall no real service shows."""


class RewardStandIn:
    """A reward (or judge) server; ``url`` is its base address. Use as a context manager, or call :meth:`close`."""

    def __init__(self, answer: Callable[[str, Any], tuple[int, Any]] = default_answer, *,
                 flaky: tuple[int, int, dict] | None = None, latency_s: float = 0.0, port: int = 0):
        self.answer = answer
        self.flaky = flaky
        self.latency_s = latency_s
        self.failed = 0
        self.down = False
        self.calls: collections.Counter = collections.Counter()
        self.script: list[tuple] = []
        self.bodies: list[Any] = []
        self.paths: list[str] = []
        self.times: list[float] = []
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body leave at once: no 40 ms delayed-ACK stall per request

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw) if raw else None
                with stand_in.lock:
                    stand_in.bodies.append(body)
                    stand_in.paths.append(self.path)
                    stand_in.times.append(time.monotonic())
                    stand_in.calls[json.dumps(body, sort_keys=True)] += 1
                    flaky = stand_in.flaky is not None and len(stand_in.bodies) % stand_in.flaky[0] == 0
                    stand_in.failed += flaky
                    scripted = stand_in.script.pop(0) if stand_in.script and not flaky else None
                headers: dict = {}
                if stand_in.down or (scripted is not None and scripted[0] is None):
                    self.reset()
                    return
                if flaky:
                    status, out, delay, headers = stand_in.flaky[1], {"error": "busy"}, stand_in.latency_s, stand_in.flaky[2]
                elif scripted is not None:
                    status, out, delay, *more = scripted
                    headers = more[0] if more else {}
                else:
                    (status, out), delay = stand_in.answer(self.path, body), stand_in.latency_s
                if delay:
                    time.sleep(delay)
                data = out if isinstance(out, bytes) else json.dumps(out).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    pass

            def reset(self):
                """Close the connection at once, unanswered (an RST: SO_LINGER 0)."""
                self.close_connection = True
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()

        self.server = _Server(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
