"""The sglang backend's HTTP/1.1 client: keep-alive connections on asyncio streams.

SGLang's server (uvicorn) speaks plain HTTP/1.1: one JSON body per request, answered with a
``Content-Length`` body (or a chunked one), connections kept alive between requests. This
client speaks exactly that and nothing more, because the client's CPU per ``/generate`` is
part of every training step: on the default step's answer (128 completions, 60 KB) one
exchange costs 0.2–0.5 ms of client CPU here against 0.6–1.3 ms through aiohttp's general
machinery, measured side by side (``benchmarks/bench_sglang_client.py``).

- Connections are pooled per server and reused; one idle for more than ``idle_s`` (below
  uvicorn's 5 s keep-alive) is closed instead. A reused connection that the server closed
  while it was idle — end of stream before the first byte of the answer — is replaced by a
  fresh one and the request sent once more: the server never saw it. Any other failure is the
  caller's to handle (:class:`ConnectError`, :class:`Disconnected`, :class:`ProtocolError`;
  ``asyncio.TimeoutError`` when ``timeout`` runs out); the connection it happened on is closed,
  never reused.
- Bodies: ``Content-Length``, ``Transfer-Encoding: chunked``, or to the end of the stream;
  ``Connection: close`` honoured.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from urllib.parse import urlsplit

_LIMIT = 1 << 22  # the reader's buffer: a large answer arrives without pausing the transport


class ConnectError(OSError):
    """The server could not be reached (refused, unreachable, no such host)."""


class Disconnected(ConnectionError):
    """The server closed or reset the connection before its answer was complete."""


class ProtocolError(Exception):
    """The answer is not HTTP/1.x."""


class _Target:
    __slots__ = ("key", "host", "port", "ssl", "prefix", "host_header")

    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.ssl else 80)
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")
        self.key = (parts.scheme, self.host, self.port)


class Client:
    """``await request(method, url, path, body, timeout)`` → ``(status, body bytes)``."""

    def __init__(self, idle_s: float = 3.0):
        self.idle_s = idle_s
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple, list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]]] = {}
        self._ssl: _ssl.SSLContext | None = None

    def _target(self, url: str) -> _Target:
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = _Target(url)
        return t

    async def request(self, method: str, url: str, path: str, body: bytes | None = None,
                      timeout: float | None = None, content_type: str = "application/json") -> tuple[int, bytes]:
        t = self._target(url)
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method.encode(), (t.prefix + path).encode(), t.host_header)
        if body is not None:
            head += b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type.encode(), len(body))
        message = head + b"\r\n" + (body or b"")
        if timeout is None:
            return await self._exchange(t, message, method == "HEAD")
        async with asyncio.timeout(timeout):  # in this task: no task per request, as wait_for makes
            return await self._exchange(t, message, method == "HEAD")

    async def _exchange(self, t: _Target, message: bytes, head_only: bool) -> tuple[int, bytes]:
        conn = self._take(t.key)
        resent = False
        while True:
            reused = conn is not None
            if conn is None:
                try:
                    conn = await self._connect(t)
                except ConnectError as e:
                    if resent:  # it closed the idle connection and now refuses new ones: it went away
                        raise Disconnected(f"the server closed the connection without answering, then refused a new one ({e})") from None
                    raise
            reader, writer = conn
            try:
                writer.write(message)
                await writer.drain()
                status, keep, data = await _read_response(reader, head_only)
            except (_ClosedWhileIdle, ConnectionResetError, BrokenPipeError) as e:
                writer.close()
                if reused and not resent:  # closed by the server while idle: it never saw this request
                    conn, resent = None, True
                    continue
                if isinstance(e, _ClosedWhileIdle):
                    raise Disconnected("the server closed the connection without answering") from None
                raise Disconnected(f"the server reset the connection ({e})") from None
            except BaseException:  # a failure, a timeout, a cancellation: this connection is done
                writer.close()
                raise
            if keep:
                self._idle.setdefault(t.key, []).append((reader, writer, time.monotonic()))
            else:
                writer.close()
            return status, data

    def _take(self, key: tuple):
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            reader, writer, since = idle.pop()
            if now - since < self.idle_s and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def _connect(self, t: _Target):
        ssl = None
        if t.ssl:
            if self._ssl is None:
                self._ssl = _ssl.create_default_context()
            ssl = self._ssl
        try:
            return await asyncio.open_connection(t.host, t.port, ssl=ssl, limit=_LIMIT)
        except OSError as e:
            raise ConnectError(e.errno, f"cannot connect to {t.host}:{t.port} ({e.strerror or e})") from None

    async def close(self) -> None:
        writers = [w for conns in self._idle.values() for _, w, _ in conns]
        self._idle.clear()
        for w in writers:
            w.close()
        for w in writers:
            try:
                await w.wait_closed()
            except (OSError, ConnectionError):
                pass


class _ClosedWhileIdle(Exception):
    pass


async def _read_response(reader: asyncio.StreamReader, head_only: bool) -> tuple[int, bool, bytes]:
    """``(status, keep the connection, body)`` of one answer."""
    try:
        while True:
            try:
                raw = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as e:
                if not e.partial:
                    raise _ClosedWhileIdle from None
                raise Disconnected("the server closed the connection in the middle of its answer's headers") from None
            except asyncio.LimitOverrunError:
                raise ProtocolError("an answer's headers exceed 4 MiB") from None
            lines = raw.decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            if not version.startswith("HTTP/1."):
                raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
            try:
                status = int(rest[:3])
            except ValueError:
                raise ProtocolError(f"bad status line: {lines[0][:80]!r}") from None
            if status != 100:  # 100 Continue precedes the real answer
                break
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        if head_only or status in (204, 304) or 100 <= status < 200:
            return status, keep, b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, keep, await _read_chunked(reader)
        length = headers.get("content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                raise ProtocolError(f"bad Content-Length {length!r}") from None
            return status, keep, await reader.readexactly(n)
        return status, False, await reader.read()  # to the end of the stream
    except asyncio.IncompleteReadError as e:
        raise Disconnected(f"the server closed the connection after {len(e.partial)} bytes of its answer") from None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
