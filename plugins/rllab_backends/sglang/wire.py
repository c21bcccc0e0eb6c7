"""The sglang backend's HTTP/1.1 client: keep-alive connections, driven by asyncio or blocking.

SGLang's server (uvicorn) speaks plain HTTP/1.1: one JSON body per request, answered with a
``Content-Length`` body (or a chunked one), connections kept alive between requests. This
client speaks exactly that and nothing more, because the client's CPU per ``/generate`` is
part of every training step. One parser (:class:`_Answer`, fed bytes as they arrive) serves
two drivers:

- ``await request(...)`` on asyncio streams, for many requests in flight at once;
- ``request_blocking(...)`` on a plain socket, for the one request a step usually sends: no
  event-loop round trips, about a third of the client CPU of the asyncio driver on the default
  step's answer (128 completions, 60 KB), measured side by side
  (``benchmarks/bench_sglang_client.py``). It blocks its thread, so it is only for a caller
  with nothing else to run meanwhile.

Both drivers behave alike:

- Connections are pooled per server and reused; one idle for more than ``idle_s`` (below
  uvicorn's 5 s keep-alive) is closed instead. A reused connection that the server closed
  while it was idle — end of stream before the first byte of the answer — is replaced by a
  fresh one and the request sent once more: the server never saw it. Any other failure is the
  caller's to handle (:class:`ConnectError`, :class:`Disconnected`, :class:`ProtocolError`;
  ``TimeoutError`` when ``timeout`` runs out); the connection it happened on is closed, never
  reused.
- Bodies: ``Content-Length``, ``Transfer-Encoding: chunked``, or to the end of the stream;
  ``Connection: close`` honoured.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as _ssl
import time
from urllib.parse import urlsplit

_LIMIT = 1 << 22  # the stream reader's buffer: a large answer arrives without pausing the transport
_READ = 1 << 16  # bytes asked for per read (a larger buffer would be mmapped afresh by every recv)
_MAX_HEAD = 1 << 22


class ConnectError(OSError):
    """The server could not be reached (refused, unreachable, no such host)."""


class Disconnected(ConnectionError):
    """The server closed or reset the connection before its answer was complete."""


class ProtocolError(Exception):
    """The answer is not HTTP/1.x."""


class _ClosedWhileIdle(Exception):
    """End of stream before the first byte of the answer."""


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


# --------------------------------------------------------------------------- the parser

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK, _TRAILERS, _TO_EOF, _DONE = range(7)


class _Answer:
    """One HTTP/1.x answer, parsed from the bytes fed to it (no I/O here).

    ``take(data)`` gets each read's bytes as they arrive — empty when the stream ended — and
    returns True once the answer is complete. It is ``feed(data)`` (bytes) or ``eof()`` (the end,
    which completes a body read to the end of the stream and is an error anywhere else). Then
    ``status``, ``keep`` (the connection may be reused) and ``body`` hold the answer."""

    __slots__ = ("head_only", "buf", "pos", "start", "state", "need", "parts", "status", "keep", "body")

    def __init__(self, head_only: bool = False):
        self.head_only = head_only
        self.buf = bytearray()
        self.pos = self.start = self.need = self.status = 0
        self.state = _HEAD
        self.parts: list[bytes] = []
        self.keep = False
        self.body = b""

    def take(self, data: bytes) -> bool:
        if not data:
            self.eof()
            return True
        return self.feed(data)

    def feed(self, data: bytes) -> bool:
        self.buf += data
        buf = self.buf
        while True:
            state = self.state
            if state == _HEAD:
                head = self._until(b"\r\n\r\n", "an answer's headers exceed 4 MiB")
                if head is None:
                    return False
                self._head(head)
                self.start = self.pos
            elif state == _LENGTH:
                if len(buf) - self.pos < self.need:
                    return False
                self.body, self.state = bytes(buf[self.pos : self.pos + self.need]), _DONE
            elif state == _CHUNK_SIZE or state == _TRAILERS:
                line = self._until(b"\r\n", "a chunk size or trailer line exceeds 4 MiB")
                if line is None:
                    return False
                if state == _TRAILERS:
                    if not line:
                        self.body = b"".join(self.parts)
                        self.state = _DONE
                    continue
                try:
                    self.need = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
                self.state = _CHUNK if self.need else _TRAILERS
            elif state == _CHUNK:
                if len(buf) - self.pos < self.need + 2:
                    return False
                end = self.pos + self.need
                if buf[end : end + 2] != b"\r\n":
                    raise ProtocolError("a chunk does not end with CRLF")
                self.parts.append(bytes(buf[self.pos : end]))
                self.pos, self.state = end + 2, _CHUNK_SIZE
            else:
                return state == _DONE

    def _until(self, sep: bytes, too_long: str) -> bytes | None:
        """The buffered bytes up to the next ``sep`` (the position moves past it), or None when
        ``sep`` has not arrived yet."""
        end = self.buf.find(sep, self.pos)
        if end < 0:
            if len(self.buf) - self.pos > _MAX_HEAD:
                raise ProtocolError(too_long)
            return None
        found, self.pos = bytes(self.buf[self.pos : end]), end + len(sep)
        return found

    def _head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        try:
            status = int(rest[:3])
        except ValueError:
            raise ProtocolError(f"bad status line: {lines[0][:80]!r}") from None
        if status == 100:  # 100 Continue precedes the real answer
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        self.status = status
        self.keep = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        if self.head_only or status in (204, 304) or 100 <= status < 200:
            self.state = _DONE
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = _CHUNK_SIZE
        elif (length := headers.get("content-length")) is not None:
            try:
                self.need = int(length)
            except ValueError:
                raise ProtocolError(f"bad Content-Length {length!r}") from None
            self.state = _LENGTH
        else:
            self.keep, self.state = False, _TO_EOF

    def eof(self) -> None:
        if self.state == _TO_EOF:
            self.body, self.state = bytes(self.buf[self.pos :]), _DONE
        elif self.state == _HEAD:
            if not self.buf:
                raise _ClosedWhileIdle
            raise Disconnected("the server closed the connection in the middle of its answer's headers")
        elif self.state != _DONE:
            raise Disconnected(f"the server closed the connection after {len(self.buf) - self.start} bytes of its answer")


# --------------------------------------------------------------------------- the client


class Client:
    """``await request(method, url, path, body, timeout)`` or ``request_blocking(...)`` →
    ``(status, body bytes)``."""

    def __init__(self, idle_s: float = 3.0):
        self.idle_s = idle_s
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple, list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]]] = {}
        self._idle_sockets: dict[tuple, list[tuple[socket.socket, float]]] = {}
        self._ssl: _ssl.SSLContext | None = None

    def _prepare(self, method: str, url: str, path: str, body: bytes | None, content_type: str) -> tuple[_Target, bytes]:
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = _Target(url)
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method.encode(), (t.prefix + path).encode(), t.host_header)
        if body is not None:
            head += b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type.encode(), len(body))
        return t, head + b"\r\n" + (body or b"")

    def _ssl_context(self) -> _ssl.SSLContext:
        if self._ssl is None:
            self._ssl = _ssl.create_default_context()
        return self._ssl

    # -- asyncio

    async def request(self, method: str, url: str, path: str, body: bytes | None = None,
                      timeout: float | None = None, content_type: str = "application/json") -> tuple[int, bytes]:
        t, message = self._prepare(method, url, path, body, content_type)
        if timeout is None:
            return await self._exchange(t, message, method == "HEAD")
        async with asyncio.timeout(timeout):  # in this task: no task per request, as wait_for makes
            return await self._exchange(t, message, method == "HEAD")

    async def _exchange(self, t: _Target, message: bytes, head_only: bool) -> tuple[int, bytes]:
        conn = self._take(self._idle, t.key)
        resent = False
        while True:
            reused = conn is not None
            if conn is None:
                try:
                    conn = await self._connect(t)
                except ConnectError as e:
                    _refused_after_resend(e, resent)
                    raise
            reader, writer = conn
            answer = _Answer(head_only)
            try:
                writer.write(message)
                await writer.drain()
                while not answer.take(await reader.read(_READ)):
                    pass
            except (_ClosedWhileIdle, ConnectionResetError, BrokenPipeError) as e:
                writer.close()
                if _resend(e, reused, resent):
                    conn, resent = None, True
                    continue
            except BaseException:  # a failure, a timeout, a cancellation: this connection is done
                writer.close()
                raise
            if answer.keep:
                self._idle.setdefault(t.key, []).append((reader, writer, time.monotonic()))
            else:
                writer.close()
            return answer.status, answer.body

    async def _connect(self, t: _Target):
        try:
            return await asyncio.open_connection(t.host, t.port, ssl=self._ssl_context() if t.ssl else None, limit=_LIMIT)
        except OSError as e:
            raise ConnectError(e.errno, f"cannot connect to {t.host}:{t.port} ({e.strerror or e})") from None

    # -- blocking

    def request_blocking(self, method: str, url: str, path: str, body: bytes | None = None,
                         timeout: float | None = None, content_type: str = "application/json") -> tuple[int, bytes]:
        """As :meth:`request`, on a plain socket in the calling thread (its own pool)."""
        t, message = self._prepare(method, url, path, body, content_type)
        deadline = None if timeout is None else time.monotonic() + timeout
        sock = self._take(self._idle_sockets, t.key)
        resent = False
        while True:
            reused = sock is not None
            if sock is None:
                try:
                    sock = self._connect_blocking(t, deadline)
                except ConnectError as e:
                    _refused_after_resend(e, resent)
                    raise
            answer = _Answer(method == "HEAD")
            try:
                _settimeout(sock, deadline)
                sock.sendall(message)
                done = False
                while not done:
                    _settimeout(sock, deadline)
                    done = answer.take(sock.recv(_READ))
            except (_ClosedWhileIdle, ConnectionResetError, BrokenPipeError) as e:
                sock.close()
                if _resend(e, reused, resent):
                    sock, resent = None, True
                    continue
            except BaseException:
                sock.close()
                raise
            if answer.keep:
                self._idle_sockets.setdefault(t.key, []).append((sock, time.monotonic()))
            else:
                sock.close()
            return answer.status, answer.body

    def _connect_blocking(self, t: _Target, deadline: float | None) -> socket.socket:
        try:
            sock = socket.create_connection((t.host, t.port), timeout=_remaining(deadline))
        except TimeoutError:
            raise
        except OSError as e:
            raise ConnectError(e.errno, f"cannot connect to {t.host}:{t.port} ({e.strerror or e})") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if t.ssl:
            try:
                sock = self._ssl_context().wrap_socket(sock, server_hostname=t.host)
            except BaseException:
                sock.close()
                raise
        return sock

    # -- both

    def _take(self, pool: dict, key: tuple):
        """An idle connection to ``key`` that is young enough and still open, or None."""
        idle = pool.get(key)
        now = time.monotonic()
        while idle:
            *conn, since = idle.pop()
            if now - since < self.idle_s and _open(conn):
                return conn[0] if len(conn) == 1 else tuple(conn)
            _close(conn)
        return None

    def close_blocking(self) -> None:
        """Close the blocking driver's idle sockets."""
        for conns in self._idle_sockets.values():
            for sock, _ in conns:
                sock.close()
        self._idle_sockets.clear()

    async def close(self) -> None:
        """Close every idle connection (both drivers')."""
        self.close_blocking()
        writers = [w for conns in self._idle.values() for _, w, _ in conns]
        self._idle.clear()
        for w in writers:
            w.close()
        for w in writers:
            try:
                await w.wait_closed()
            except (OSError, ConnectionError):
                pass


def _open(conn: list) -> bool:
    if len(conn) == 1:
        return conn[0].fileno() >= 0
    reader, writer = conn
    return not reader.at_eof() and not writer.is_closing()


def _close(conn: list) -> None:
    conn[-1].close()  # the socket, or the stream writer


def _resend(e: BaseException, reused: bool, resent: bool) -> bool:
    """True when a failed exchange is sent once more on a fresh connection (a reused connection
    the server closed while idle: it never saw the request); otherwise raises what it was."""
    if reused and not resent:
        return True
    if isinstance(e, _ClosedWhileIdle):
        raise Disconnected("the server closed the connection without answering") from None
    raise Disconnected(f"the server reset the connection ({e})") from None


def _refused_after_resend(e: ConnectError, resent: bool) -> None:
    if resent:  # it closed the idle connection and now refuses new ones: it went away
        raise Disconnected(f"the server closed the connection without answering, then refused a new one ({e})") from None


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's time ran out")
    return left


def _settimeout(sock: socket.socket, deadline: float | None) -> None:
    sock.settimeout(_remaining(deadline))
