"""The general transport: aiohttp's client (``https://`` instances; the hot path serves the rest)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping

import aiohttp
from multidict import CIMultiDictProxy
from yarl import URL

from tokenplane.gateway.transports.base import Sink, UpstreamReply
from tokenplane.gateway.upstreams import Upstream


class AiohttpReply:
    """An ``aiohttp.ClientResponse`` as an :class:`~tokenplane.gateway.transports.base.UpstreamReply`.
    Its read timeout was fixed when it was sent, so a shorter idle limit wraps each read."""

    __slots__ = ("_idle_s", "resp")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self._idle_s: float | None = None

    @property
    def status(self) -> int:
        return self.resp.status

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self.resp.headers

    async def read(self) -> bytes:
        return await self.resp.read()

    async def read_some(self, n: int) -> bytes:
        return await self.resp.content.read(n)

    async def readany(self) -> bytes:
        if self._idle_s is None:
            return await self.resp.content.readany()
        async with asyncio.timeout(self._idle_s):
            return await self.resp.content.readany()

    def limit_idle(self, idle_s: float) -> None:
        self._idle_s = idle_s

    def park(self, sink: Sink) -> asyncio.Future[None] | None:
        return None  # the relay reads

    def unpark(self) -> None:
        pass

    def release(self) -> None:
        self.resp.release()

    def close(self) -> None:
        self.resp.close()


class AiohttpTransport:
    """Requests through the gateway's shared ``aiohttp.ClientSession``."""

    __slots__ = ("session",)

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    def post(
        self,
        upstream: Upstream,
        url: URL,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        first_byte_s: float | None,
    ) -> Awaitable[UpstreamReply]:
        return self._post(upstream, url, body, extra_headers, first_byte_s)

    async def _post(
        self,
        upstream: Upstream,
        url: URL,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        first_byte_s: float | None,
    ) -> UpstreamReply:
        headers = upstream.headers if not extra_headers else {**upstream.headers, **extra_headers}
        async with asyncio.timeout(first_byte_s):
            return AiohttpReply(await self.session.post(url, data=body, headers=headers))


__all__ = ["AiohttpReply", "AiohttpTransport"]
