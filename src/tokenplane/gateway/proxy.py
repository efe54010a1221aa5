"""Forwarding one request to its instance: a JSON answer, or an SSE stream relayed as it arrives.

The stream relay passes the instance's bytes through without parsing or re-serialising chunks: it
only finds event boundaries (``\\n\\n``) and checks each event's shape with a few byte comparisons
(``data: {...}``, ``data: [DONE]``, a ``:`` comment). Only whole events are written, so whatever
the instance does (malformed event, early close, reset, timeout) the client's stream can still be
ended cleanly with an OpenAI-style error event and ``data: [DONE]``. The last JSON event is decoded
once at the end for ``usage``; without one, output tokens are counted as token events.

A client that goes away mid-stream (the handler is cancelled, or a write fails) closes the upstream
response, which closes its connection: vLLM aborts the request in the engine when that happens.

Retries and stream continuation wrap :func:`open_upstream` and the stream relay
(:class:`~tokenplane.gateway.continuation.StreamSplicer`; an attempt = one call, and
:class:`~tokenplane.gateway.stages.context.RequestContext` carries what a continuation needs:
events already sent). Instances are reached through the transports
(:mod:`~tokenplane.gateway.transports`), whichever serves them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import aiohttp
import msgspec
from aiohttp import web
from yarl import URL

from tokenplane.gateway.errors import (
    GatewayError,
    InvalidRequest,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStalled,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from tokenplane.gateway.transports.base import Transports, UpstreamReply
from tokenplane.gateway.upstreams import Upstream
from tokenplane.gateway.wire import decode_usage

if TYPE_CHECKING:
    from tokenplane.gateway.stages.context import RequestContext

MAX_PENDING_EVENT_BYTES = 4 << 20
"""An upstream event longer than this without a terminating blank line is treated as malformed."""

MAX_ERROR_BODY_BYTES = 64 << 10

SSE_HEADERS: Mapping[str, str] = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

OUTCOME_OK = "ok"
OUTCOME_CLIENT_GONE = "client_disconnected"
OUTCOME_UPSTREAM_REJECTED = "upstream_rejected"


async def open_upstream(
    transports: Transports,
    upstream: Upstream,
    url: URL,
    body: bytes,
    extra_headers: Mapping[str, str] | None = None,
    *,
    first_byte_s: float | None = None,
) -> UpstreamReply:
    """Send the request on the transport that serves ``upstream``; the caller owns (and must close
    or release) the reply. ``extra_headers`` (trace context) are added to the instance's own
    headers. ``first_byte_s`` bounds the wait for the response headers."""
    cap = None if first_byte_s is None else max(0.0, first_byte_s)
    try:
        return await transports.for_upstream(upstream, url).post(upstream, url, body, extra_headers, cap)
    except TimeoutError:
        if cap is not None:
            raise UpstreamTimeout(f"instance {upstream.id} sent no response headers in time") from None
        raise UpstreamTimeout(f"instance {upstream.id} did not answer in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamUnavailable.caused_by(f"instance {upstream.id} is unreachable", exc) from None


async def rejection(resp: UpstreamReply, upstream: Upstream) -> web.Response:
    """Map a non-200 answer: an instance's own 4xx OpenAI error passes through; anything else raises."""
    try:
        data = await resp.read_some(MAX_ERROR_BODY_BYTES)
    except (TimeoutError, aiohttp.ClientError, OSError):
        data = b""
    status = resp.status
    if 400 <= status < 500:
        try:
            decoded = msgspec.json.decode(data)
        except msgspec.DecodeError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
            headers = {}
            if "Retry-After" in resp.headers:
                headers["Retry-After"] = resp.headers["Retry-After"]
            return web.Response(status=status, body=data, content_type="application/json", headers=headers)
        raise InvalidRequest(
            f"instance {upstream.id} rejected the request ({status}): "
            f"{data[:200].decode('utf-8', 'replace')}",
            code="upstream_rejected",
        )
    raise UpstreamUnavailable(f"instance {upstream.id} answered {status}")


async def read_json(resp: UpstreamReply, ex: RequestContext, upstream: Upstream) -> bytes:
    """An instance's whole JSON answer, as it came (its usage counted into ``ex``)."""
    try:
        data = await resp.read()
    except TimeoutError:
        raise UpstreamTimeout(f"instance {upstream.id} did not finish in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamUnavailable.caused_by(f"instance {upstream.id} broke off", exc) from None
    upstream.heard_at = time.monotonic()
    try:
        usage = decode_usage(data).usage
    except msgspec.DecodeError:
        raise UpstreamProtocolError(f"instance {upstream.id} answered with a body that is not JSON") from None
    if usage is not None:
        ex.completion_tokens = usage.completion_tokens
    return data


def scan_events(buf: bytes, end: int) -> tuple[int, bool, int, tuple[int, int] | None, bool]:
    """Check the whole events in ``buf[:end]`` (``end`` just past a ``\\n\\n``).

    Returns (bytes to forward, saw [DONE], JSON events, span of the last JSON payload, malformed).
    Forwarding stops after ``[DONE]`` or before the first malformed event.
    """
    if (
        end == len(buf) > 9
        and buf[end - 3] == 0x7D
        and buf.find(b"\n\n") == end - 2
        and buf.startswith(b"data: {")
    ):
        return end, False, 1, (6, end - 2), False  # the usual batch: one whole token event
    pos = 0
    n = 0
    last: tuple[int, int] | None = None
    while pos < end:
        nxt = buf.find(b"\n\n", pos, end)
        if nxt < 0:  # what is left after an odd newline ("\n\n\n": the last pair overlapped)
            nxt = end  # (never ``end - 2`` < pos: compiled, a negative slice raises SystemError)
        if buf.startswith(b"data: {", pos) and buf[nxt - 1] == 0x7D:  # the usual token event
            n += 1
            last = (pos + 6, nxt)
        elif buf.startswith(b"data:", pos):
            p = pos + 5
            while p < nxt and buf[p] in b" \t":
                p += 1
            q = nxt
            while q > p and buf[q - 1] in b"\r ":
                q -= 1
            if q > p and buf[p] == 0x7B and buf[q - 1] == 0x7D:  # { ... }
                n += 1
                last = (p, q)
            elif buf.startswith(b"[DONE]", p) and q - p == 6:
                return nxt + 2, True, n, last, False
            else:
                return pos, False, n, last, True
        elif not (buf.startswith(b":", pos) or nxt == pos or buf[pos:nxt].strip() == b""):
            return pos, False, n, last, True
        pos = nxt + 2
    return end, False, n, last, False


class SseReader:
    """Whole server-sent events from an upstream response, one batch per read.

    ``next_batch`` returns ``(buf, end)`` where ``buf[:end]`` holds complete events (a partial one
    at the end stays for the next read), or the error that ended the stream.
    """

    __slots__ = ("_pending", "_resp", "_upstream", "last_at")

    def __init__(self, resp: UpstreamReply, upstream: Upstream) -> None:
        self._resp = resp
        self._upstream = upstream
        self._pending = b""
        self.last_at = time.monotonic()  # the headers just came: when the instance last sent bytes

    def arm(self, idle_s: float) -> None:
        """From now on at most ``idle_s`` of silence between reads (the relay arms it at the first
        token: before that a queued or prefilling request is rightly silent, and a runtime may
        send a role chunk first)."""
        self._resp.limit_idle(idle_s)

    def _stalled(self) -> UpstreamStalled:
        upstream = self._upstream
        return UpstreamStalled(
            f"instance {upstream.id} stalled mid-stream ({time.monotonic() - self.last_at:.1f} s silent)",
            busy=upstream.answered_since(self.last_at),
        )

    def heard(self) -> None:
        """The instance sent something (a sink took it)."""
        self.last_at = self._upstream.heard_at = time.monotonic()

    async def park(self, sink: Callable[[bytes], int]) -> UpstreamStalled | None:
        """Let ``sink`` take the body as it arrives, in the connection's callback (see
        :meth:`UpstreamReply.park <tokenplane.gateway.transports.base.UpstreamReply.park>`),
        until it declines a piece, asks to be woken, or the body ends. Returns the stall that
        ended it, else ``None``: then :meth:`next_batch` reads on (the declined piece, the end or
        the error). On a transport that cannot park, or with a partial event pending, returns at once."""
        if self._pending:
            return None
        resp = self._resp
        w = resp.park(sink)
        if w is None:
            return None
        try:
            await w
        except TimeoutError:
            return self._stalled()
        finally:
            resp.unpark()
        return None

    async def next_batch(self) -> tuple[bytes, int] | GatewayError:
        upstream = self._upstream
        while True:
            try:
                data = await self._resp.readany()
            except TimeoutError:
                return self._stalled()
            except (aiohttp.ClientError, OSError) as exc:
                return UpstreamUnavailable.caused_by(f"instance {upstream.id} broke the stream", exc)
            if not data:
                return UpstreamProtocolError(f"instance {upstream.id} closed the stream before [DONE]")
            self.heard()
            pending = self._pending
            buf = pending + data if pending else data
            end = buf.rfind(b"\n\n") + 2
            if end < 2:
                if len(buf) > MAX_PENDING_EVENT_BYTES:
                    return UpstreamProtocolError(f"instance {upstream.id} sent an unterminated event")
                self._pending = buf
                continue
            self._pending = buf[end:]
            return buf, end


__all__ = [
    "OUTCOME_CLIENT_GONE",
    "OUTCOME_OK",
    "OUTCOME_UPSTREAM_REJECTED",
    "SseReader",
    "UpstreamError",
    "open_upstream",
    "read_json",
    "rejection",
    "scan_events",
]
