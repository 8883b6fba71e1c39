"""connection_guard.py, in-process (uvicorn serving a small app through the guard, clients on
loopback in the same event loop): thousands of idle connections from one client, well past the
connection limit, never keep a probe from its 200, and the server never holds more than the limit;
connections that send nothing, half a request head, or nothing after an answer, are closed after
the header timeout, and so are TLS connections that never finish their handshake; a connection
whose request is being answered is never closed to make room, and with every connection busy a
newcomer gets a JSON 503 with Retry-After. serve.py's own wiring: tests/test_serve_load.py."""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from pathlib import Path
from typing import AsyncIterator

import uvicorn

from nmt.serving.connection_guard import ConnectionGuard, connection_limit, tls_context
from test_serve_load import certificate

HEAD = b"GET /health/live HTTP/1.1\r\nHost: test\r\n\r\n"


async def app(scope: dict, receive, send) -> None:
    """200 {"status": "live"} at once; /slow answers when the test sets `release` on the app."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await app.release.wait()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"status": "live"}'})


@contextlib.asynccontextmanager
async def guarded(header_timeout_s: float, max_connections: int,
                  tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[ConnectionGuard, int]]:
    """uvicorn serving `app` through a ConnectionGuard on a free loopback port: (the guard, the port)."""
    app.release = asyncio.Event()
    guard = ConnectionGuard(header_timeout_s, max_connections, tls)
    listener = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=guard.protocol(), lifespan="off", log_level="warning",
                                           access_log=False))
    serving = asyncio.ensure_future(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield guard, listener.getsockname()[1]
    finally:
        app.release.set()
        server.should_exit = True
        await serving


async def request(port: int, head: bytes = HEAD, tls: ssl.SSLContext | None = None) -> tuple[int, dict, bytes]:
    """Status, headers and body of one request on a new connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    writer.write(head)
    status_line = await reader.readline()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    writer.close()
    return int(status_line.split()[1]), headers, body


async def closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server closes this connection (end of file or reset) within `timeout` seconds."""
    try:
        while await asyncio.wait_for(reader.read(1024), timeout):
            pass
    except ConnectionError:
        return True
    except asyncio.TimeoutError:
        return False
    return True


async def busy(guard: ConnectionGuard, count: int) -> None:
    """Wait until `count` connections have a request being answered (fail after 10 s)."""
    async with asyncio.timeout(10):
        while len(guard.open) - len(guard.idle) < count:
            await asyncio.sleep(0.01)


def test_thousands_of_idle_connections_never_starve_a_probe() -> None:
    """2,000 idle connections against a limit of 300, half of them having sent half a request
    head: every probe sent meanwhile gets 200 in well under a second, the server never holds more
    than 300, and each idle connection is closed within the header timeout of its opening."""
    async def scenario() -> None:
        async with guarded(header_timeout_s=2.0, max_connections=300) as (guard, port):
            idle, held = [], 0
            for i in range(2000):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                if i % 2:
                    writer.write(HEAD[:20])  # a slow client's first bytes, never the rest
                idle.append((time.monotonic(), reader, writer))
                held = max(held, len(guard.open))
                if i % 100 == 99:
                    started = time.monotonic()
                    assert (await request(port))[:1] == (200,)
                    assert time.monotonic() - started < 1
            assert held <= 300 and guard.closed.labels("evicted")._value.get() >= 1700
            opened, reader, _ = idle[-1]
            assert await closed_by_server(reader, opened + 3.0 - time.monotonic())
            assert all([await closed_by_server(reader, 0.5) for _, reader, _ in idle])
            assert guard.closed.labels("header_timeout")._value.get() >= 1 and not guard.open
            for _, _, writer in idle:
                writer.close()

    asyncio.run(scenario())


def test_after_an_answer_a_kept_alive_connection_gets_the_same_deadline() -> None:
    """uvicorn's keep-alive timer restarts at any byte: a client that sends one byte of its next
    request every 0.3 s would hold the connection for ever. The guard's deadline does not restart."""
    async def scenario() -> None:
        async with guarded(header_timeout_s=1.0, max_connections=10) as (guard, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HEAD)
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            answered = time.monotonic()
            closed = False
            for byte in HEAD[:10]:
                writer.write(bytes([byte]))
                if closed := await closed_by_server(reader, 0.3):
                    break
            assert closed and time.monotonic() - answered < 2.0
            writer.close()

    asyncio.run(scenario())


def test_a_busy_connection_is_never_closed_for_room_and_none_idle_gets_json_503() -> None:
    """With the limit at 3: a request being answered (held by the app) outlives 10 idle connections
    opened after it; with 3 requests being answered, a fourth connection gets 503 with a JSON error
    and Retry-After, and the three are answered when the app lets them go."""
    async def scenario() -> None:
        async with guarded(header_timeout_s=5.0, max_connections=3) as (guard, port):
            slow_head = b"GET /slow HTTP/1.1\r\nHost: test\r\n\r\n"
            slow = [asyncio.ensure_future(request(port, slow_head)) for _ in range(3)]
            await busy(guard, 3)
            status, headers, body = await request(port)
            assert (status, headers["retry-after"]) == (503, "1")
            assert "none of them idle; the limit is 3 (serve_max_connections)" in json.loads(body)["error"]
            app.release.set()
            assert [(await answer)[0] for answer in slow] == [200] * 3
            app.release.clear()
            slow = asyncio.ensure_future(request(port, slow_head))
            await busy(guard, 1)
            others = [await asyncio.open_connection("127.0.0.1", port) for _ in range(10)]
            app.release.set()
            assert (await slow)[0] == 200
            for _, writer in others:
                writer.close()

    asyncio.run(scenario())


def test_tls_handshakes_that_never_finish_are_closed_and_count(tmp_path: Path) -> None:
    """Over TLS, TCP connections that never send a ClientHello count against the limit, make room
    for a client that completes its handshake, and are closed after the header timeout."""
    cert, key = certificate(tmp_path)
    client = ssl.create_default_context(cafile=str(cert))

    async def scenario() -> None:
        async with guarded(header_timeout_s=1.5, max_connections=20, tls=tls_context(str(cert), str(key))) \
                as (guard, port):
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(50)]
            assert len(guard.open) <= 20
            assert (await request(port, tls=client))[0] == 200
            opened = time.monotonic()
            assert all([await closed_by_server(reader, 2.5) for reader, _ in idle])
            assert time.monotonic() - opened < 2.5 and not guard.open
            for _, writer in idle:
                writer.close()

    asyncio.run(scenario())


def test_the_limit_stays_below_the_open_file_limit() -> None:
    assert connection_limit(4096, 1024) == 1024 - 128 and connection_limit(4096, 65536) == 4096
    assert connection_limit(10, 100) == 1
