"""The upstream-transport protocol: send one request to an instance, read its answer.

A transport's :meth:`UpstreamTransport.post` returns once the status and headers arrived (or
raises ``TimeoutError``, ``OSError`` or ``aiohttp.ClientError``, which
:func:`~tokenplane.gateway.proxy.open_upstream` maps to the gateway's upstream errors). The reply
is read whole (:meth:`UpstreamReply.read`), piece by piece (:meth:`UpstreamReply.readany`), or, on
the hot path, handed to a sink in the connection's own callback (:meth:`UpstreamReply.park`: a
transport that cannot answers ``None`` and the relay reads instead). The caller owns the reply:
:meth:`UpstreamReply.release` (the connection may be reused) or :meth:`UpstreamReply.close` (the
instance sees the client go and aborts the request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from yarl import URL

from tokenplane.gateway.upstreams import Upstream

Sink = Callable[[bytes], int]
"""Takes a piece of a parked body: ``SINK_DECLINED``, ``SINK_TAKEN`` or ``SINK_TAKEN_WAKE``."""


class UpstreamReply(Protocol):
    """An instance's answer: its status and headers arrived, its body is being read."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    async def read_some(self, n: int) -> bytes:
        """At most ``n`` bytes of the body (an error answer's)."""
        ...

    def readany(self) -> Awaitable[bytes]:
        """The next piece of the body (``b""`` at its end)."""
        ...

    def limit_idle(self, idle_s: float) -> None:
        """From now on at most ``idle_s`` of silence between pieces (``TimeoutError`` beyond)."""
        ...

    def park(self, sink: Sink) -> asyncio.Future[None] | None:
        """Hand the body to ``sink`` as it arrives until it declines a piece or asks to be woken;
        the future is done then (``TimeoutError`` on silence). ``None``: this transport cannot."""
        ...

    def unpark(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class UpstreamTransport(Protocol):
    """Sends requests to instances."""

    def post(
        self,
        upstream: Upstream,
        url: URL,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        first_byte_s: float | None,
    ) -> Awaitable[UpstreamReply]:
        """POST ``body`` to ``url`` on ``upstream`` (its own headers and ``extra_headers``);
        ``first_byte_s`` bounds the wait for the response headers."""
        ...


class Transports:
    """The transports in use: the hot path for plain ``http://`` instances (for the paths they have
    a prebuilt request head for) when there is one, the general one for the rest."""

    __slots__ = ("direct", "general")

    def __init__(self, general: UpstreamTransport, direct: UpstreamTransport | None) -> None:
        self.general = general
        self.direct = direct

    def for_upstream(self, upstream: Upstream, url: URL) -> UpstreamTransport:
        direct = self.direct
        if direct is None or upstream.direct is None:
            return self.general
        # the completion URLs by identity first: hashing a yarl URL is a Python call
        if url is upstream.chat_url or url is upstream.completions_url or url in upstream.heads:
            return direct
        return self.general


__all__ = ["Sink", "Transports", "UpstreamReply", "UpstreamTransport"]
