"""One keep-alive HTTP/1.1 connection to an instance, as an asyncio protocol parsed by httptools
(the connection under :mod:`~tokenplane.gateway.transports.httptools_client`): the status and
headers, the body as it arrives (de-chunked by the parser) with back-pressure, a read timeout, and
a parked body handed to a sink in the protocol's own callback."""

from __future__ import annotations

import asyncio
import collections
import copy
from collections.abc import Callable
from typing import NoReturn, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from tokenplane.gateway.errors import UpstreamConnectionError as UpstreamConnectionError

HIGH_WATER_BYTES = 1 << 16
"""Buffered body bytes at which the connection stops reading until the relay catches up."""
SINK_DECLINED = 0
"""What a parked stream's sink answers: the piece is not taken (buffer it and wake the reader)..."""
SINK_TAKEN = 1
"""...taken: keep handing pieces over..."""
SINK_TAKEN_WAKE = 2
"""...taken, and wake the reader (a full write buffer to wait on)."""


class _NoCallbacks:
    """The callbacks of :data:`_DETACHED`: none."""


_DETACHED = httptools.HttpResponseParser(_NoCallbacks())
"""What a closed connection holds instead of its parser. The parser holds the connection's bound
callbacks (a reference cycle): dropping it on close lets reference counting free the connection at
once. Left to the collector, a closed connection that had lived long in the pool (promoted to an
old generation) waited, with its buffers, error and traceback, for a full collection: under
:data:`~tokenplane.runloop.GC_YOUNG_THRESHOLD` those come hours apart (the soak's RSS growth)."""


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_buffered",
        "_complete",
        "_deadline",
        "_error",
        "_headers",
        "_loop",
        "_parser",
        "_paused",
        "_raw_headers",
        "_timer",
        "_timer_at",
        "_wait_s",
        "_waiter",
        "got_bytes",
        "keep_alive",
        "key",
        "sink",
        "status",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int]) -> None:
        self._loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        # One timer per connection, re-armed lazily: a wait only moves the deadline (a stream's
        # every chunk would otherwise arm and cancel a timer of its own).
        self._deadline = 0.0
        self._wait_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._headers: CIMultiDictProxy[str] | None = None
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._complete = False
        self._error: BaseException | None = None
        self._paused = False
        self.got_bytes = False
        self.keep_alive = False
        self.sink: Callable[[bytes], int] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._parser = _DETACHED  # no data comes after this: the cycle through it ends here
        self._cancel_timer()
        if not self._complete and self._error is None:
            self._error = UpstreamConnectionError(
                "the instance closed the connection" if exc is None else f"connection lost: {exc!r}"
            )
        self._wake()

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - no upgrades are asked for
            self._fail(UpstreamConnectionError("the instance upgraded the connection"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectionError(f"the instance sent malformed HTTP: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    # -- httptools callbacks ------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._wake()

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            taken = sink(body)
            if taken == SINK_TAKEN:
                if self._deadline:  # a read: the silence allowed starts again
                    self._deadline = self._loop.time() + self._wait_s
                return
            self.sink = None
            if taken == SINK_TAKEN_WAKE:
                self._wake()
                return
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # -- the response's side ------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _wait(self, timeout_s: float | None) -> asyncio.Future[None]:
        """The future the next event (headers, body, end, error, timeout) completes; awaited by the
        caller directly, so a stream's every chunk resumes one frame fewer. A done or cancelled
        waiter left behind is harmless: :meth:`_wake` and the timer skip it."""
        loop = self._loop
        w = self._waiter = loop.create_future()
        if timeout_s is not None:
            self._wait_s = timeout_s
            self._deadline = deadline = loop.time() + timeout_s
            if self._timer is None or self._timer_at > deadline:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(deadline, self._on_timer)
                self._timer_at = deadline
        else:
            self._deadline = 0.0
        return w

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        w = self._waiter
        if w is None or w.done() or not self._deadline:
            return  # not waiting now: the next wait arms a new timer
        if self._loop.time() >= self._deadline:
            w.set_exception(TimeoutError())
            self._waiter = None  # its error's traceback will hold this connection: no cycle
        else:
            self._timer = self._loop.call_at(self._deadline, self._on_timer)
            self._timer_at = self._deadline

    def raise_error(self) -> NoReturn:
        """Raise a copy of the connection's error: the one raised carries a traceback whose frames
        hold this connection, which must not hold it back (a cycle left to the collector)."""
        assert self._error is not None
        raise copy.copy(self._error)

    def headers(self) -> CIMultiDictProxy[str]:
        if self._headers is None:
            self._headers = CIMultiDictProxy(
                CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in self._raw_headers)
            )
        return self._headers

    async def readany(self, timeout_s: float | None) -> bytes:
        while not self._body:
            if self._complete:
                return b""
            if self._error is not None:
                self.raise_error()
            await self._wait(timeout_s)
        return self.take_buffered()

    def park(self, sink: Callable[[bytes], int], timeout_s: float | None) -> asyncio.Future[None] | None:
        """Hand the body to ``sink`` as it arrives, in the protocol's callback, until it declines
        a piece; the future completes then (the piece is buffered for :meth:`readany`), or at the
        message's end, an error, ``timeout_s`` of silence, or when ``sink`` asks to be woken.
        ``None`` when something is buffered or ended already: read that first.

        This is a stream's usual chunk without a future, a task step and a coroutine resumed."""
        if self._body or self._complete or self._error is not None:
            return None
        self.sink = sink
        return self._wait(timeout_s)

    def take_buffered(self) -> bytes:
        """Every body byte buffered so far, and reading resumed if the buffer had paused it."""
        body = self._body
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    @property
    def complete(self) -> bool:
        return self._complete
