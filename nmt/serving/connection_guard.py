"""Idle connections cannot starve the server: uvicorn's h11 protocol with a deadline for each
request head and a bound on open connections that makes room by closing the longest-idle one.

uvicorn (h11) sets no timeout before a connection's first request, and its `limit_concurrency`
counts idle connections: a few thousand sockets that send nothing made every request, the probes
included, a plain-text 503 without Retry-After for as long as they stayed open. Here
(`GuardedH11Protocol`, made by `ConnectionGuard.protocol`; uvicorn's limit_concurrency is off):
- Each connection must deliver a complete request head within `header_timeout_s` of being
  accepted, its TLS handshake included, and again within that time of each answer on a kept-alive
  connection (uvicorn's own keep-alive timer restarts at any byte); else it is closed. TLS is
  started here (`loop.start_tls`) rather than by asyncio's server, whose handshake timeout is 60 s
  and which uvicorn gives no way to set, and whose handshaking connections no one counts.
- At most `max_connections` are open (`connection_limit`: below the file-descriptor limit, which
  `raise_file_limit` lifts to its hard maximum). A connection accepted at the limit closes the
  connection that has been idle longest (waiting for a request head or in its handshake; never
  one whose request is being answered), so a probe always finds room; with none idle, the newcomer
  gets a JSON 503 with Retry-After (a TLS one is closed: no HTTP can be spoken before the handshake).
A request whose head has arrived is the application's: its body and answer have the server's own
timeouts (serve_body_timeout_s, serve_request_timeout_s).
"""
from __future__ import annotations

import asyncio
import asyncio.sslproto
import functools
import json
import resource
import ssl
from collections import OrderedDict
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge
from uvicorn.protocols.http.h11_impl import H11Protocol

RESERVED_FILES = 128  # descriptors left for what is not a connection: the model's files, logs, the listener
REFUSAL_RETRY_AFTER_S = 1
# asyncio's SSLProtocol reads into a zeroed buffer of max_size bytes, 256 KiB, made for every
# connection, handshake or not: 4,096 idle TLS connections took the server from 0.4 to 1.9 GB. A
# TLS record is at most 16 KiB of plaintext; reading in such pieces costs only more reads.
TLS_READ_BUFFER = 16 * 1024


def raise_file_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit (as nginx and most servers do:
    the soft default, often 1,024, is a historical one); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # some systems cap it lower than they say: keep the soft limit
            pass
    return soft


def connection_limit(configured: int, file_limit: int) -> int:
    """The connections to allow: `configured` (serve_max_connections), or fewer where the limit on
    open files would be reached first; at least 1."""
    return max(1, min(configured, file_limit - RESERVED_FILES))


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """A server-side TLS context with this certificate and key (OSError, ssl.SSLError among them,
    when they cannot be used)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


def refusal(open_connections: int, limit: int) -> bytes:
    """A whole HTTP answer: 503 with a JSON error and Retry-After, closing the connection."""
    body = json.dumps({"error": f"the server holds {open_connections} connections, none of them idle; the limit is "
                                f"{limit} (serve_max_connections): try again"}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"retry-after: {REFUSAL_RETRY_AFTER_S}\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


class ConnectionGuard:
    """What the connections of one server share: the limits, the TLS context (None: plain HTTP),
    the open connections, and the idle ones in the order they became idle (the first is closed to
    make room). Its metrics go to `registry` when one is given."""

    def __init__(self, header_timeout_s: float, max_connections: int, tls: ssl.SSLContext | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.header_timeout_s, self.max_connections, self.tls = header_timeout_s, max_connections, tls
        if tls is not None:  # for the whole process: this server is its only user of asyncio's TLS
            asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
        self.open: set[GuardedH11Protocol] = set()
        self.idle: OrderedDict[GuardedH11Protocol, None] = OrderedDict()
        self.closed = Counter("serve_connections_closed", "Connections the server closed before a request: no "
                              "complete request head in time (header_timeout), closed to make room (evicted), "
                              "refused with none idle (refused)", ["reason"], registry=registry)
        Gauge("serve_connections", "Open connections", registry=registry).set_function(lambda: len(self.open))
        Gauge("serve_connections_idle", "Open connections without a request being answered", registry=registry) \
            .set_function(lambda: len(self.idle))

    def protocol(self) -> Callable[..., H11Protocol]:
        """What uvicorn.Config(http=...) takes: it makes one protocol per connection."""
        return functools.partial(GuardedH11Protocol, guard=self)

    def admit(self, connection: GuardedH11Protocol) -> bool:
        """Count a new connection in, first closing the longest-idle one if the limit is reached;
        False (nothing counted) when every open connection is busy."""
        if len(self.open) >= self.max_connections:
            if not self.idle:
                self.closed.labels("refused").inc()
                return False
            oldest = next(iter(self.idle))
            self.closed.labels("evicted").inc()
            self.remove(oldest)  # now: its transport tells of the close only in a later turn of the loop
            oldest.close_now()
        self.open.add(connection)
        self.waiting(connection)
        return True

    def waiting(self, connection: GuardedH11Protocol) -> None:
        """`connection` waits for a request head (or its handshake): idle, with a deadline."""
        connection.cancel_deadline()
        connection.deadline = asyncio.get_running_loop().call_later(self.header_timeout_s, self.expire, connection)
        self.idle[connection] = None
        self.idle.move_to_end(connection)

    def busy(self, connection: GuardedH11Protocol) -> None:
        """A request of `connection` is being answered: no deadline here, and never closed for room."""
        connection.cancel_deadline()
        self.idle.pop(connection, None)

    def expire(self, connection: GuardedH11Protocol) -> None:
        self.closed.labels("header_timeout").inc()
        self.remove(connection)
        connection.close_now()

    def remove(self, connection: GuardedH11Protocol) -> None:
        connection.cancel_deadline()
        self.idle.pop(connection, None)
        self.open.discard(connection)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a ConnectionGuard: counted from the moment the connection is
    accepted, idle (with a deadline for the next request head) except while a request of it is
    being answered, and over TLS when the guard has a context."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.raw: asyncio.Transport | None = None  # the TCP connection, which closing ends at once
        self.deadline: asyncio.TimerHandle | None = None
        self.handshake: asyncio.Task | None = None
        self.early = bytearray()  # what arrives after the handshake, before the h11 protocol is connected

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.raw = transport
        if not self.guard.admit(self):
            if self.guard.tls is None:
                transport.write(refusal(len(self.guard.open), self.guard.max_connections))
                transport.close()
            else:
                transport.abort()
            return
        if self.guard.tls is None:
            super().connection_made(transport)
        else:
            self.handshake = asyncio.ensure_future(self.start_tls(transport))

    async def start_tls(self, raw: asyncio.Transport) -> None:
        try:
            transport = await self.loop.start_tls(raw, self, self.guard.tls, server_side=True,
                                                  ssl_handshake_timeout=self.guard.header_timeout_s)
        except Exception:  # a failed or abandoned handshake: start_tls has closed the connection
            self.guard.remove(self)
            return
        if transport is None or transport.is_closing():
            return
        super().connection_made(transport)
        if self.early:
            data, self.early = bytes(self.early), bytearray()
            super().data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:  # TLS: the handshake has ended, start_tls has not returned yet
            self.early += data
            return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self.guard.busy(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request: handle_events marks it busy
        if not self.transport.is_closing() and self.cycle.response_complete:
            self.guard.waiting(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.remove(self)
        if self.transport is not None:  # not before the h11 protocol was connected (a failed handshake)
            super().connection_lost(exc)

    def cancel_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def close_now(self) -> None:
        """Close the TCP connection at once, whatever it is doing (a handshake, a TLS close too)."""
        self.cancel_deadline()
        if self.raw is not None:
            self.raw.abort()
