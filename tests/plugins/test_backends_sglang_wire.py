"""The sglang backend's HTTP/1.1 client against scripted servers (asyncio, on 127.0.0.1).

Every exchange test runs through both drivers: ``await request`` on asyncio streams, and
``request_blocking`` on a plain socket (then the scripted server runs in a thread of its own,
since the blocking call holds the test's event loop)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rllab_backends.sglang import wire


class Scripted:
    """A server that reads each request (head + Content-Length body) and answers with the next
    scripted reply: bytes to send, then what to do with the connection ("keep", "close", or
    "drop" = close without sending anything)."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                data, then = self.replies.pop(0)
                if then == "drop":
                    return
                writer.write(data)
                await writer.drain()
                if then == "close":
                    return
        finally:
            writer.close()


class Blocking:
    """The client seen through ``request_blocking``, with ``request``'s signature."""

    def __init__(self, client: wire.Client):
        self.client = client

    async def request(self, *args, **kwargs):
        return self.client.request_blocking(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)

    def __setattr__(self, name, value):
        if name == "client":
            object.__setattr__(self, name, value)
        else:
            setattr(self.client, name, value)


@pytest.fixture(params=["asyncio", "blocking"])
def driver(request):
    return request.param


@pytest.fixture
def run(driver):
    """``run(replies, calls)``: start a scripted server, run ``calls(client, url)`` through the
    driver under test and return (its result, the server)."""

    def run(replies, calls):
        server = Scripted(replies)
        if driver == "asyncio":

            async def main():
                srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
                url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
                client = wire.Client()
                try:
                    return await calls(client, url), server
                finally:
                    await client.close()
                    srv.close()
                    await srv.wait_closed()

            return asyncio.run(main())

        loop = asyncio.new_event_loop()
        srv = loop.run_until_complete(asyncio.start_server(server.handle, "127.0.0.1", 0))
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        client = wire.Client()
        try:
            return asyncio.run(calls(Blocking(client), f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}")), server
        finally:
            client.close_blocking()

            async def shutdown():
                srv.close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()

    return run


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_post_sends_host_length_and_body_and_reuses_the_connection(run):
    async def calls(c, url):
        a = await c.request("POST", url, "/generate", b'{"x": 1}', 5.0)
        b = await c.request("GET", url, "/health", None, 5.0)
        return a, b

    (a, b), server = run([(ok(b'{"y": 2}'), "keep"), (ok(b""), "keep")], calls)
    assert a == (200, b'{"y": 2}') and b == (200, b"")
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:") and first.endswith(b'\r\n\r\n{"x": 1}')
    assert b"Content-Length: 8\r\n" in first and b"Content-Type: application/json\r\n" in first
    assert b"Content-Length" not in server.requests[1]


def test_a_url_path_prefix_is_kept(run):
    async def calls(c, url):
        return await c.request("GET", url + "/router/", "/health", None, 5.0)

    _, server = run([(ok(b""), "keep")], calls)
    assert server.requests[0].startswith(b"GET /router/health HTTP/1.1\r\n")


def test_chunked_body_with_extension_and_trailer(run):
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")

    async def calls(c, url):
        return [await c.request("GET", url, "/x", None, 5.0) for _ in range(2)]

    got, server = run([(chunked, "keep"), (ok(b"again"), "keep")], calls)
    assert got == [(200, b"hello world"), (200, b"again")] and server.connections == 1


def test_connection_close_and_body_to_end_of_stream(run):
    to_eof = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\nboom"

    async def calls(c, url):
        a = await c.request("GET", url, "/a", None, 5.0)
        b = await c.request("GET", url, "/b", None, 5.0)
        d = await c.request("GET", url, "/c", None, 5.0)
        return a, b, d

    got, server = run([(ok(b"1", b"Connection: close\r\n"), "close"), (to_eof, "close"), (ok(b"3"), "keep")], calls)
    assert got == ((200, b"1"), (500, b"boom"), (200, b"3"))
    assert server.connections == 3  # neither closed connection is reused


def test_100_continue_is_skipped(run):
    async def calls(c, url):
        return await c.request("POST", url, "/x", b"{}", 5.0)

    got, _ = run([(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"done"), "keep")], calls)
    assert got == (200, b"done")


def test_an_idle_connection_the_server_closed_is_not_reused(run):
    async def calls(c, url):
        a = await c.request("POST", url, "/generate", b"1", 5.0)
        await asyncio.sleep(0.05)  # the server has closed the idle connection by now
        b = await c.request("POST", url, "/generate", b"2", 5.0)
        return a, b

    # answered without "Connection: close", then closed: kept as idle, found closed, not used
    got, server = run([(ok(b"a"), "close"), (ok(b"b"), "keep")], calls)
    assert got == ((200, b"a"), (200, b"b"))
    assert server.connections == 2 and [r[-1:] for r in server.requests] == [b"1", b"2"]


def test_a_reused_connection_closed_before_answering_is_replaced_and_the_request_sent_once_more(run):
    async def calls(c, url):
        a = await c.request("POST", url, "/generate", b"1", 5.0)
        b = await c.request("POST", url, "/generate", b"2", 5.0)
        return a, b

    got, server = run([(ok(b"a"), "keep"), (b"", "drop"), (ok(b"b"), "keep")], calls)
    assert got == ((200, b"a"), (200, b"b"))
    assert server.connections == 2 and [r[-1:] for r in server.requests] == [b"1", b"2", b"2"]


def test_a_fresh_connection_dropped_without_an_answer_is_an_error_not_a_resend(run):
    async def calls(c, url):
        with pytest.raises(wire.Disconnected, match="without answering"):
            await c.request("POST", url, "/generate", b"1", 5.0)

    _, server = run([(b"", "drop")], calls)
    assert len(server.requests) == 1  # sent once: a fresh connection is not retried here


def test_a_reused_connection_dropped_twice_is_an_error(run):
    async def calls(c, url):
        await c.request("POST", url, "/generate", b"1", 5.0)
        with pytest.raises(wire.Disconnected, match="without answering"):
            await c.request("POST", url, "/generate", b"2", 5.0)

    _, server = run([(ok(b"a"), "keep"), (b"", "drop"), (b"", "drop")], calls)
    assert len(server.requests) == 3  # the first try on the reused connection, one resend


def test_answer_cut_mid_body(run):
    async def calls(c, url):
        with pytest.raises(wire.Disconnected, match=r"after 3 bytes"):
            await c.request("GET", url, "/x", None, 5.0)

    run([(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "close")], calls)


def test_not_http_is_a_protocol_error(run):
    async def calls(c, url):
        with pytest.raises(wire.ProtocolError, match="not an HTTP/1.x answer"):
            await c.request("GET", url, "/x", None, 5.0)

    run([(b"SSH-2.0-OpenSSH\r\n\r\n", "close")], calls)


def test_refused(driver):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = wire.Client()
    with pytest.raises(wire.ConnectError, match=f"cannot connect to 127.0.0.1:{port}"):
        if driver == "asyncio":
            asyncio.run(client.request("GET", f"http://127.0.0.1:{port}", "/health", None, 5.0))
        else:
            client.request_blocking("GET", f"http://127.0.0.1:{port}", "/health", None, 5.0)


def test_timeout_and_the_connection_is_not_kept(driver):
    import socket
    import time

    silent = socket.socket()  # accepts (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    client = wire.Client()
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            if driver == "asyncio":
                asyncio.run(client.request("GET", url, "/x", None, 0.2))
            else:
                client.request_blocking("GET", url, "/x", None, 0.2)
        assert time.monotonic() - t0 < 3.0
        key = ("http", "127.0.0.1", port)
        assert not client._idle.get(key) and not client._idle_sockets.get(key)  # not kept for reuse
    finally:
        client.close_blocking()
        silent.close()


def test_connections_idle_too_long_are_not_reused(run):
    async def calls(c, url):
        c.idle_s = 0.0
        await c.request("GET", url, "/a", None, 5.0)
        await c.request("GET", url, "/b", None, 5.0)

    _, server = run([(ok(b""), "keep"), (ok(b""), "keep")], calls)
    assert server.connections == 2


def test_bad_urls():
    with pytest.raises(ValueError, match="not an http"):
        wire._Target("ftp://x")
    t = wire._Target("https://user@example.org/base/")
    assert (t.key, t.prefix, t.host_header) == (("https", "example.org", 443), "/base", b"example.org")


def test_the_backend_names_a_server_that_does_not_speak_http():
    import socket
    import threading

    import rllab
    from rllab import SamplingParams

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def answer():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    backend = rllab.Lab().get("rollout_backend", "sglang", urls=url, retries=0)()
    try:
        with pytest.raises(rllab.RllabError, match=rf"{url}/generate did not answer in HTTP/1.1: not an HTTP/1.x answer: 'SSH-2.0"):
            backend.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    finally:
        backend.close()
        srv.close()


ANSWERS = [
    ok(b'{"y": 2}'),
    b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"done", b"Connection: close\r\n"),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
]


@pytest.mark.parametrize("raw", ANSWERS)
def test_the_parser_gives_the_same_answer_however_the_bytes_are_split(raw):
    whole = wire._Answer()
    assert whole.feed(raw)
    splits = [[raw[:cut], raw[cut:]] for cut in range(1, len(raw))] + [[raw[i : i + 1] for i in range(len(raw))]]
    for pieces in splits:
        a = wire._Answer()
        done = [a.feed(p) for p in pieces]
        assert done[-1] and not any(done[:-1]), (pieces, done)
        assert (a.status, a.keep, a.body) == (whole.status, whole.keep, whole.body)
    assert (whole.status, whole.keep) == {0: (200, True), 1: (200, False), 2: (200, True), 3: (204, True), 4: (200, False)}[ANSWERS.index(raw)]


def test_the_parser_refuses_bad_framing_and_reports_where_the_stream_ended():
    with pytest.raises(wire.ProtocolError, match="bad Content-Length 'x'"):
        wire._Answer().feed(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
    with pytest.raises(wire.ProtocolError, match="bad chunk size line"):
        wire._Answer().feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    with pytest.raises(wire.ProtocolError, match="does not end with CRLF"):
        wire._Answer().feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n")
    with pytest.raises(wire.ProtocolError, match="bad status line"):
        wire._Answer().feed(b"HTTP/1.1 abc\r\n\r\n")
    a = wire._Answer()
    assert not a.feed(b"HTTP/1.1 200 OK\r\nContent-Len")
    with pytest.raises(wire.Disconnected, match="middle of its answer's headers"):
        a.eof()
    with pytest.raises(wire._ClosedWhileIdle):
        wire._Answer().eof()
    a = wire._Answer()
    assert not a.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
    with pytest.raises(wire.Disconnected, match="after 6 bytes"):
        a.eof()
    a = wire._Answer()
    assert not a.feed(b"HTTP/1.1 200 OK\r\n\r\nto the end")
    a.eof()
    assert (a.status, a.keep, a.body) == (200, False, b"to the end")
    head = wire._Answer(head_only=True)
    assert head.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n") and head.body == b""
