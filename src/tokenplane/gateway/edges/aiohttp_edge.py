"""The aiohttp edge: a :class:`~tokenplane.gateway.edges.base.ClientStream` over ``web.Request``.

A whole answer is written at once (``prepare`` then ``write_eof``), before the bookkeeping that
follows it (breakers, ledger, metrics, admission release), so none of that is on the client's
latency; the handler then returns the response already sent, which aiohttp leaves as it is.

A stream's first chunk goes through aiohttp (which may send the headers with it); once the response
is known to be chunked, later chunks are framed here and written to the transport: aiohttp's writer
is two coroutines and a drain check per chunk, ~13 % of a relayed stream's CPU in
``bench/gateway_overhead.py``'s decode scenario. Back-pressure by the transport's own buffer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from tokenplane.gateway.edges.chunked import WRITE_HIGH_WATER_BYTES, ChunkedBody, drain
from tokenplane.gateway.edges.guard import EdgeHandler
from tokenplane.gateway.errors import BodyTooLarge, RequestTimeout, UnsupportedCoding


class AiohttpClient:
    """One aiohttp request as a client stream."""

    __slots__ = ("_chunked", "_out", "request")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self._out: web.StreamResponse | None = None
        self._chunked: ChunkedBody | None = None

    @property
    def method(self) -> str:
        return self.request.method

    @property
    def path(self) -> str:
        return self.request.path

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self.request.headers

    @property
    def gone(self) -> bool:
        t = self.request.transport
        return t is None or t.is_closing()

    def body_now(self, limit: int) -> bytes | None:
        request = self.request
        length = request.content_length
        if length is None:
            self._check_coding()
        elif length > limit:
            self._close_after_answer()  # rather than read (and drop) what may be a great deal
            raise BodyTooLarge(f"the request body is {length} bytes; the limit is {limit}")
        content = request.content
        if not content.is_eof():
            return None
        data = content.read_nowait(-1)  # the usual case: the whole body came with the headers
        if len(data) > limit:
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes")
        return data

    def _check_coding(self) -> None:
        """A transfer coding other than ``chunked`` alone is refused (501, RFC 9112 6.1): aiohttp's
        parser de-chunks ``gzip, chunked`` and would pass the gzip bytes on as the body."""
        coding = self.request.headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            self._close_after_answer()
            raise UnsupportedCoding(f"transfer coding {coding!r}: only 'chunked' is supported")

    def _close_after_answer(self) -> None:
        proto = self.request.protocol
        if isinstance(proto, EdgeHandler):
            proto.close_after_answer()

    async def read_body(self, limit: int) -> bytes:
        """The body, within ``limit`` bytes and, on a guarded connection, the edge's body timeout."""
        request = self.request
        if request.content_length is None:
            self._check_coding()
        proto = request.protocol
        guarded = proto if isinstance(proto, EdgeHandler) else None
        try:
            async with asyncio.timeout(None if guarded is None else guarded.edge.body_timeout_s):
                return await self.request.read()
        except web.HTTPRequestEntityTooLarge:
            self._close_after_answer()
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes") from None
        except TimeoutError:
            if guarded is not None:
                guarded.close_after_answer()
            raise RequestTimeout("the request body did not arrive in time") from None

    def note(self, key: Any, value: Any) -> None:
        self.request[key] = value

    async def send(self, resp: web.Response) -> bool:
        self._out = resp
        try:
            await resp.prepare(self.request)
            await resp.write_eof()
        except ConnectionResetError:
            return False
        return True

    async def send_json(self, body: bytes, headers: Mapping[str, str] | None = None) -> bool:
        return await self.send(web.Response(body=body, content_type="application/json", headers=headers))

    def send_json_now(self, body: bytes, headers: Mapping[str, str] | None = None) -> bool | None:
        return None  # aiohttp's response is prepared and written by coroutines

    async def open_stream(self, headers: Mapping[str, str]) -> None:
        if self._out is None:
            out = self._out = web.StreamResponse(headers=headers)
            await out.prepare(self.request)

    @property
    def streaming(self) -> bool:
        return self._out is not None

    async def write(self, chunk: bytes) -> None:
        body = self._chunked
        if body is None:
            out = self._out
            assert out is not None, "open_stream first"
            await out.write(chunk)
            t = self.request.transport
            if t is not None and out.headers.get("Transfer-Encoding") == "chunked":
                self._chunked = ChunkedBody(t)  # HTTP/1.1; 1.0 stays on aiohttp
            return
        await body.write(chunk)

    @property
    def chunks(self) -> ChunkedBody | None:
        return self._chunked

    def backlog(self) -> int:
        body = self._chunked
        return 0 if body is None else body.transport.get_write_buffer_size()

    async def drain(self) -> None:
        body = self._chunked
        if body is not None and body.transport.get_write_buffer_size() > WRITE_HIGH_WATER_BYTES:
            await drain(body.transport)

    async def end_stream(self) -> None:
        out = self._out
        assert out is not None, "open_stream first"
        await out.write_eof()

    def answer(self) -> web.StreamResponse:
        out = self._out
        assert out is not None, "nothing was sent"
        return out


__all__ = ["AiohttpClient"]
