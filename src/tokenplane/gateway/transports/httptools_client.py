"""The hot-path HTTP/1.1 client to instances: keep-alive connections as asyncio protocols, parsed by
httptools (llhttp, the parser behind uvicorn and Node.js).

Why not aiohttp's client here: per request it builds a ``ClientRequest``, merges header multidicts,
consults cookie and tracing hooks and arms several timers; measured by ``bench/gateway_overhead.py``
that was about a third of the gateway's CPU per proxied request. This client does only what the
data plane needs: one ``POST`` with a prebuilt head, the status and headers, and the body as it
arrives (de-chunked by the parser), with back-pressure and a read timeout. Health checks, scrapes
and ``https://`` instances keep using aiohttp (:mod:`~tokenplane.gateway.transports.aiohttp_transport`).

The response offers the subset of ``aiohttp.ClientResponse`` the relays use: ``status``,
``headers`` (case-insensitive), ``read()``, ``content.read(n)``, ``content.readany()``, ``release()``
(back to the pool when the whole message arrived on a keep-alive connection, else closed) and
``close()`` (closes the connection: the instance sees the client go and aborts the request).

Errors are ``OSError`` subclasses (``ConnectionError``) or ``TimeoutError``, which the relays
already map to the gateway's upstream errors. A request on a *reused* connection that the instance
closed before sending a byte (an idle keep-alive timeout racing our send) is retried once on a new
connection; nothing else is retried here (that is the core retry budget's job).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from multidict import CIMultiDictProxy
from yarl import URL

from tokenplane.gateway.transports.httptools_connection import (
    HIGH_WATER_BYTES,
    SINK_DECLINED,
    SINK_TAKEN,
    SINK_TAKEN_WAKE,
    UpstreamConnectionError,
    _Connection,
)
from tokenplane.gateway.transports.tcp_connect import open_tcp
from tokenplane.gateway.upstreams import Upstream

__all__ = [
    "HIGH_WATER_BYTES",
    "SINK_DECLINED",
    "SINK_TAKEN",
    "SINK_TAKEN_WAKE",
    "HttptoolsTransport",
    "UpstreamClient",
    "UpstreamConnectionError",
    "UpstreamResponse",
]

MAX_IDLE_PER_HOST = 1024


class _Content:
    """``resp.content``: the body stream. It holds the connection, not the response: a reference
    back would make every response a reference cycle, left for the cyclic collector to find."""

    __slots__ = ("_conn", "read_timeout_s")

    def __init__(self, conn: _Connection, read_timeout_s: float | None) -> None:
        self._conn = conn
        self.read_timeout_s = read_timeout_s

    def readany(self) -> Coroutine[Any, Any, bytes]:
        # the connection's coroutine itself, not one wrapping it: one frame fewer per chunk
        return self._conn.readany(self.read_timeout_s)

    async def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            data = await self.readany()
            if not data:
                break
            out += data
        return bytes(out if n < 0 else out[:n])


class UpstreamResponse:
    __slots__ = ("_client", "_conn", "_done", "content", "status")

    def __init__(self, client: UpstreamClient, conn: _Connection, read_timeout_s: float | None) -> None:
        self._client = client
        self._conn = conn
        self._done = False
        self.status = conn.status
        self.content = _Content(conn, read_timeout_s)

    @property
    def read_timeout_s(self) -> float | None:
        """Per read of the body; a stream may shorten it."""
        return self.content.read_timeout_s

    @read_timeout_s.setter
    def read_timeout_s(self, value: float | None) -> None:
        self.content.read_timeout_s = value

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._conn.headers()

    async def read(self) -> bytes:
        conn = self._conn
        if conn.complete and conn._error is None:  # the usual JSON answer: all here already
            return conn.take_buffered()  # (resumes a connection the answer's last read paused)
        return await self.content.read()

    async def read_some(self, n: int) -> bytes:
        return await self.content.read(n)

    def readany(self) -> Coroutine[Any, Any, bytes]:
        # the connection's coroutine itself, not one wrapping it: one frame fewer per chunk
        return self._conn.readany(self.content.read_timeout_s)

    def limit_idle(self, idle_s: float) -> None:
        t = self.content.read_timeout_s
        self.content.read_timeout_s = idle_s if t is None else min(idle_s, t)

    def park(self, sink: Callable[[bytes], int]) -> asyncio.Future[None] | None:
        """:meth:`_Connection.park` with the read timeout."""
        return self._conn.park(sink, self.content.read_timeout_s)

    def unpark(self) -> None:
        self._conn.sink = None

    def release(self) -> None:
        """Back to the pool if the whole message arrived on a keep-alive connection; else close."""
        if self._done:
            return
        self._done = True
        conn = self._conn
        if conn.complete and conn.keep_alive and conn.transport is not None and not conn._body:
            self._client._put(conn)
        else:
            self._close_conn()

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        self._close_conn()

    def _close_conn(self) -> None:
        t = self._conn.transport
        if t is not None:
            t.close()


Connector = Callable[[asyncio.AbstractEventLoop, asyncio.Protocol, str, int, float | None], Awaitable[object]]
"""Opens a connection to ``(host, port)`` whose protocol is the given one, within the timeout
(TCP by default, :func:`~tokenplane.gateway.transports.tcp_connect.open_tcp`; a benchmark hands in
memory transports instead)."""


class UpstreamClient:
    """Keep-alive connections per ``(host, port)``; idle ones are reused most-recent first."""

    def __init__(
        self,
        *,
        connect_timeout_s: float | None,
        read_timeout_s: float | None,
        connector: Connector | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._closed = False
        self._connector = connector or open_tcp

    def _put(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if self._closed or len(idle) >= MAX_IDLE_PER_HOST:
            if conn.transport is not None:
                conn.transport.close()
            return
        conn._reset()  # its timer stays armed: firing while idle is a no-op, and the next request's
        idle.append(conn)  # wait only moves the deadline (no timer armed and cancelled per request)

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(loop, key)
        try:
            await self._connector(loop, conn, key[0], key[1], self.connect_timeout_s)
        except OSError as exc:  # TimeoutError included: the connector names what timed out
            raise UpstreamConnectionError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return conn

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def post(
        self,
        host: str,
        port: int,
        head: bytes,
        body: bytes,
        extra_headers: Mapping[str, str] | None = None,
        *,
        headers_timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send ``head`` (request line and fixed headers, each ending in CRLF, without the blank
        line and without Content-Length), ``extra_headers`` and ``body``; return once the status and
        headers have arrived (``TimeoutError`` after ``headers_timeout_s`` or the read timeout)."""
        wait_s = self.read_timeout_s
        if headers_timeout_s is not None:
            wait_s = headers_timeout_s if wait_s is None else min(wait_s, headers_timeout_s)
        if extra_headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in extra_headers.items()).encode("latin-1")
        message = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        key = (host, port)
        conn = self._take(key)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(key)
            assert conn.transport is not None
            conn.transport.write(message)
            try:
                while not conn.status:  # the headers (inline: a coroutine fewer per request)
                    if conn._error is not None:
                        conn.raise_error()
                    await conn._wait(wait_s)
            except UpstreamConnectionError:
                if reused and not conn.got_bytes:  # an idle connection closed as we sent: once more
                    reused = False
                    conn = None
                    continue
                if conn.transport is not None:
                    conn.transport.close()
                raise
            except BaseException:
                if conn.transport is not None:
                    conn.transport.close()
                raise
            return UpstreamResponse(self, conn, self.read_timeout_s)

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()


class HttptoolsTransport:
    """The hot-path :class:`~tokenplane.gateway.transports.base.UpstreamTransport`: plain
    ``http://`` instances through an :class:`UpstreamClient`, with each instance's prebuilt head."""

    __slots__ = ("client",)

    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    def post(
        self,
        upstream: Upstream,
        url: URL,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        first_byte_s: float | None,
    ) -> Coroutine[Any, Any, UpstreamResponse]:
        direct = upstream.direct
        assert direct is not None, "a plain http:// instance"
        # the completion URLs' heads by identity (hashing a yarl URL is a Python call)
        if url is upstream.chat_url:
            head = upstream.chat_head
        elif url is upstream.completions_url:
            head = upstream.completions_head
        else:
            head = upstream.heads[url]
        assert head is not None
        # the client's coroutine itself, not one wrapping it: one frame fewer per request
        host, port = direct
        return self.client.post(host, port, head, body, extra_headers, headers_timeout_s=first_byte_s)
