"""A fast front for the two completion routes, with aiohttp's server behind it for everything else.

aiohttp's server costs about 0.075 ms of CPU per request on these machines
(``bench/gateway_overhead.py --server-split``: aiohttp's server over tokenplane's client, against a
raw protocol over the same client), a third of the gateway's whole cost per request. Every
connection starts on :class:`FrontProtocol`. A request in the simple, common shape:

* ``POST /v1/chat/completions`` or ``POST /v1/completions`` (no query string), ``HTTP/1.1``;
* exactly one ``Content-Length`` of digits, within the body limit; exactly one ``Host`` and no
  other header aiohttp allows once given twice; no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``;
* a head of ``CRLF``-terminated lines, under :data:`MAX_HEAD_BYTES` and the edge's line limits,
  with token header names, no folded lines and no more lines than the edge allows;

goes straight to the request pipeline as a :class:`FastRequest`, and its answer is written
to the transport here. At the first request that is not in that shape (a scrape of ``/metrics``, a
chunked body, HTTP/1.0, a malformed head, a body over the limit), the connection is handed to
aiohttp's own protocol with every byte not yet consumed, and stays there: aiohttp's parser, routes
and errors answer it exactly as they would without this front. Only well-formed, unambiguous
requests are read here, so the two parsers cannot disagree about where a message ends.

The semantics follow aiohttp's server as ``tokenplane serve`` runs it: keep-alive with an idle
timeout, pipelined requests answered in order, and a client that disconnects cancels its handler
(``handler_cancellation``), which closes the upstream request. A head that does not complete within
the edge's header timeout, or a body within its body timeout, is answered 408 and the connection
closed (checked by the same sweep as idle connections, not by a timer per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from tokenplane.gateway.config import EdgeConfig
from tokenplane.gateway.edges.fast_request import (
    ANSWERED,
    WRITE_HIGH_WATER_BYTES,
    ExtraHeaders,
    FastRequest,
    _no_extra,
    drain,
    serialize,
)
from tokenplane.gateway.errors import RequestTimeout, error_message

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
"""A longer head goes to aiohttp (whose own limits answer it)."""
KEEPALIVE_TIMEOUT_S = 75.0
"""An idle keep-alive connection is closed after this long (aiohttp's default)."""
CLOSE_TIMEOUT_S = 5.0
"""How long closing waits for the requests it cancelled before it lets them go."""
SWEEP_INTERVAL_S = 5.0
SWEEPS_PER_TIMEOUT = 4
"""The sweep runs at least this often per header or body timeout (a late 408 is at most a quarter
of the timeout late)."""

Handler = Callable[[Any, Any], Awaitable[web.StreamResponse]]

_HEAD = re.compile(
    rb"POST (/v1/chat/completions|/v1/completions) HTTP/1\.1"
    # header lines: a token, a colon, field-value characters (HTAB, SP, VCHAR, obs-text); no folding
    rb"((?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*)*)"
)
# These three read the header lines lowered once (``bytes.lower``: ASCII only, as ``re.IGNORECASE``
# is for bytes): a case-blind pattern costs far more per byte scanned than a case-sensitive one.
_REFUSED = re.compile(rb"\r\n(?:transfer-encoding|expect|upgrade):")
_LENGTH = re.compile(rb"\r\ncontent-length:([^\r]*)")
_SINGLETONS = re.compile(
    rb"\r\n(host|content-type|content-location|content-range|etag|max-forwards|server|user-agent):"
)
"""Headers aiohttp refuses to see twice (its ``SINGLETON_HEADERS``; the length is checked apart)."""
_ENDPOINTS = {b"/v1/chat/completions": "chat", b"/v1/completions": "completions"}


def _parse_head(head: bytes, max_headers: int = 100) -> tuple[str, str, list[tuple[str, str]], int] | None:
    """(endpoint, path, headers, content length) of a request in the fast shape, else ``None``.

    The shape is checked by regular expressions (in C, one pass each) rather than line by line."""
    m = _HEAD.fullmatch(head)
    if m is None:
        return None
    fields = m.group(2)
    lowered = fields.lower()  # header names are case-blind
    if _REFUSED.search(lowered) is not None:
        return None
    lengths = _LENGTH.findall(lowered)
    if len(lengths) != 1:
        return None
    # Exactly one Host (RFC 9112 3.2) and no repeated singleton: aiohttp answers those 400, and
    # the two parsers must agree (both found by fuzz/fuzz_request_parser.py).
    singletons = _SINGLETONS.findall(lowered)
    if singletons.count(b"host") != 1 or len(set(singletons)) != len(singletons):
        return None
    digits = lengths[0].lstrip(b" \t")
    if not digits.isdigit() or len(digits) > 15:  # no sign, no trailing space, no list
        return None
    headers = []
    for line in fields.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers.append((name, value.strip(" \t")))
    if len(headers) > max_headers:
        return None
    path = m.group(1)
    return _ENDPOINTS[path], path.decode("ascii"), headers, int(digits)


class FrontProtocol(asyncio.Protocol):
    """One client connection: fast requests here, the rest (from the first one on) to aiohttp."""

    def __init__(self, front: FastFront) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.idle_since = 0.0
        self.waiting_since = 0.0  # when the request now in the buffer began to wait for bytes
        self.waiting_for_body = False
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.idle_since = self.front.loop.time()
        self.front.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.connections.discard(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its handler (and the upstream request) ends

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._next()
        elif len(self.buf) > self.front.max_body_bytes + self.front.max_head_bytes and not self.paused:
            assert self.transport is not None
            self.transport.pause_reading()  # pipelined beyond one request: wait for this one
            self.paused = True

    def _next(self) -> None:
        """Start the next whole request in the buffer, or hand the connection over."""
        buf = self.buf
        if not buf:
            return
        front = self.front
        max_head = front.max_head_bytes
        end = buf.find(b"\r\n\r\n", 0, max_head + 4)
        if end < 0:
            if (
                len(buf) > max_head
                or not buf.startswith(b"POST "[: len(buf)])
                or buf.count(b"\n") != buf.count(b"\r\n")  # a bare LF: aiohttp refuses it
            ):
                self._hand_over()
            elif not self.waiting_since:
                self.waiting_since = front.loop.time()
            return
        parsed = _parse_head(bytes(buf[:end]), front.max_headers)
        if parsed is None:
            self._hand_over()
            return
        endpoint, path, headers, length = parsed
        if length > self.front.max_body_bytes:
            self._hand_over()  # aiohttp's route answers 413 exactly as without this front
            return
        start = end + 4
        if len(buf) < start + length:
            if not self.waiting_for_body:  # the rest of the body is on its way
                self.waiting_for_body = True
                self.waiting_since = front.loop.time()
            return
        self.waiting_since = 0.0
        self.waiting_for_body = False
        body = bytes(buf[start : start + length])
        del buf[: start + length]
        assert self.transport is not None
        request = FastRequest(
            "POST", path, CIMultiDictProxy(CIMultiDict(headers)), body, self.transport, front.extra_headers
        )
        self.task = front.loop.create_task(self._serve(request, endpoint))

    async def _serve(self, request: FastRequest, endpoint: str) -> None:
        t = request.transport
        try:
            out = await self.front.handler(request, endpoint)
            if request.streaming:
                request.end_now()  # what aiohttp does with a returned stream
            elif not request.started and not t.is_closing():
                if not isinstance(out, web.Response):
                    raise TypeError(f"an unsent {type(out).__name__} from the completion handler")
                request.send_now(out)
        except asyncio.CancelledError:
            return
        except Exception:  # the handler maps its own errors; this is a bug, and the answer is lost
            log.exception("unexpected error in the fast front")
            t.close()
            return
        finally:
            self.task = None
        if not request.done or not request.keep_alive or t.is_closing():
            t.close()  # an answer cut short (its head already sent) cannot be followed by another
            return
        self.idle_since = self.front.loop.time()
        if self.paused:
            self.paused = False
            t.resume_reading()
        self._next()

    def timed_out(self) -> None:
        """The request in the buffer waited past its timeout: 408, and the connection closes."""
        t = self.transport
        if t is None or t.is_closing():
            return
        part = "body" if self.waiting_for_body else "head"
        t.write(error_message(RequestTimeout(f"the request {part} did not arrive in time")))
        t.close()

    def _hand_over(self) -> None:
        """From now on aiohttp's protocol owns the connection, beginning with the unread bytes."""
        t = self.transport
        assert t is not None
        self.front.connections.discard(self)
        if self.paused:
            self.paused = False
            t.resume_reading()
        proto = self.front.aiohttp_protocol()
        data = bytes(self.buf)
        self.buf = bytearray()
        t.set_protocol(proto)
        proto.connection_made(t)
        if data:
            proto.data_received(data)


class FastFront:
    """The listening side: a protocol per connection, the idle sweep, and the way to aiohttp."""

    def __init__(
        self,
        handler: Handler,
        aiohttp_protocol: Callable[[], asyncio.Protocol],
        max_body_bytes: int,
        extra_headers: ExtraHeaders = _no_extra,
        keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
        edge: EdgeConfig | None = None,
    ) -> None:
        edge = edge if edge is not None else EdgeConfig(keepalive_timeout_s=keepalive_timeout_s)
        self.header_timeout_s = edge.header_timeout_s
        self.body_timeout_s = edge.body_timeout_s
        self.max_headers = edge.max_headers
        # A longer head goes to aiohttp, whose parser answers it with the edge's limits: every line
        # of a head within this is within them.
        self.max_head_bytes = min(MAX_HEAD_BYTES, edge.max_request_line_bytes, edge.max_field_bytes)
        self.handler = handler
        self.aiohttp_protocol = aiohttp_protocol
        self.max_body_bytes = max_body_bytes
        self.extra_headers = extra_headers
        self.keepalive_timeout_s = keepalive_timeout_s
        self.connections: set[FrontProtocol] = set()
        self.loop = asyncio.get_running_loop()
        self._sweeper = self.loop.create_task(self._sweep())

    def protocol(self) -> FrontProtocol:
        return FrontProtocol(self)

    async def _sweep(self) -> None:
        """Close keep-alive connections idle past the timeout, and answer 408 to requests whose
        head or body is late (one pass every few seconds, rather than a timer armed and cancelled
        per request)."""
        shortest = min(self.header_timeout_s, self.body_timeout_s) / SWEEPS_PER_TIMEOUT
        while True:
            await asyncio.sleep(min(SWEEP_INTERVAL_S, self.keepalive_timeout_s, shortest))
            now = self.loop.time()
            horizon = now - self.keepalive_timeout_s
            head_horizon = now - self.header_timeout_s
            body_horizon = now - self.body_timeout_s
            for c in list(self.connections):
                if c.task is not None or c.transport is None:
                    continue
                since = c.waiting_since
                if since:
                    if since < (body_horizon if c.waiting_for_body else head_horizon):
                        c.timed_out()
                elif c.idle_since < horizon:
                    c.transport.close()

    async def close(self) -> None:
        """Stop the sweep; cancel requests in flight and close every connection still here."""
        self._sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper
        tasks = [c.task for c in self.connections if c.task is not None]
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.close()
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a request that holds out against its cancellation must not hold the close
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            if pending:
                log.warning(
                    "fast front: %d requests still running %.0f s after close", len(pending), CLOSE_TIMEOUT_S
                )


__all__ = [
    "ANSWERED",
    "WRITE_HIGH_WATER_BYTES",
    "FastFront",
    "FastRequest",
    "FrontProtocol",
    "drain",
    "serialize",
]
