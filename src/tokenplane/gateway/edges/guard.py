"""The aiohttp edge's connection: aiohttp's request handler with the edge's rules added.

aiohttp's parser (llhttp, strict mode) already refuses the message shapes that smuggle requests:
``Content-Length`` with ``Transfer-Encoding``, duplicate or listed lengths, a ``Transfer-Encoding``
whose last coding is not ``chunked``, invalid chunk sizes, obs-fold, whitespace before a colon,
bare LF, control characters. :class:`EdgeHandler` adds what it leaves out:

* a header timeout: a head not complete within ``edge.header_timeout_s`` of its first byte gets
  408 and the connection closed (a slowloris client holds nothing for long). The body's timeout is
  the client stream's (:meth:`~tokenplane.gateway.edges.aiohttp_edge.AiohttpClient.read_body`);
* the statuses RFC 9112 and RFC 9110 name for what the parser refused: 414 for a request line over
  the limit, 431 for a header line over it or too many headers, 501 for an unknown transfer coding,
  400 otherwise; always followed by closing the connection;
* every such answer in the OpenAI error shape. The parser's own message quotes the bytes it
  refused (perhaps an ``Authorization`` header): it is neither sent back nor logged.

It is an interpreted subclass of aiohttp's interpreted ``RequestHandler``; it reads two of its
attributes (``_messages``, ``_request_in_progress``), checked by the edge's test suite on each
aiohttp release.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler

from tokenplane.gateway.config import EdgeConfig
from tokenplane.gateway.errors import (
    BadHttp,
    ExpectationFailed,
    GatewayError,
    HeadersTooLarge,
    RequestLineTooLong,
    RequestTimeout,
    error_body,
    error_message,
    error_response,
)

log = logging.getLogger(__name__)


def handler_kwargs(edge: EdgeConfig) -> dict[str, Any]:
    """aiohttp's own limits, from the edge's config (the request handler's keyword arguments)."""
    return {
        "max_line_size": edge.max_request_line_bytes,
        "max_field_size": edge.max_field_bytes,
        "max_headers": edge.max_headers,
        "keepalive_timeout": edge.keepalive_timeout_s,
    }


def refusal_for(exc: BaseException | None, line_done: bool) -> BadHttp:
    """The answer to a message aiohttp's parser refused (``line_done``: its request line had ended)."""
    if isinstance(exc, http_exceptions.LineTooLong):
        if line_done:
            return HeadersTooLarge("a header line is over the edge's limit")
        return RequestLineTooLong("the request line is over the edge's limit")
    text = str(exc) if exc is not None else ""
    if "Too many headers" in text:
        return HeadersTooLarge("too many header lines")
    return BadHttp(f"the request is not valid HTTP/1.1 ({type(exc).__name__ if exc else 'unknown'})")


async def expect_handler(request: web.Request) -> None:
    """``Expect: 100-continue`` gets its interim answer; any other expectation a 417 in the
    OpenAI error shape (aiohttp's own would be plain text)."""
    expect = request.headers.get("Expect", "")
    if request.version != (1, 1):
        return  # HTTP/1.0 has no Expect (RFC 9110 10.1.1: ignore it)
    if expect.strip().lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer itself has not begun (as aiohttp's own)
        return
    error = ExpectationFailed(f"unsupported expectation {expect[:64]!r}: only '100-continue'")
    raise web.HTTPExpectationFailed(text=error_body(error).decode(), content_type="application/json")


class EdgeHandler(RequestHandler):
    """aiohttp's per-connection protocol with the header timeout and the edge's refusals."""

    __slots__ = ("_closing", "_head_prefix", "_head_timer", "edge")

    def __init__(self, manager: web.Server, edge: EdgeConfig, **kwargs: Any) -> None:
        super().__init__(manager, **handler_kwargs(edge), **kwargs)
        self.edge = edge
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_prefix = b""  # the current head's first bytes: where its request line ends
        self._closing = False  # the answer now being made is the connection's last

    # -- the header timeout ---------------------------------------------------------------------
    def _idle(self) -> bool:
        """No request is parsed and waiting or being handled: bytes now belong to a new head."""
        return not self._messages and not self._request_in_progress

    def data_received(self, data: bytes) -> None:
        idle = self._idle()
        cap = self.edge.max_request_line_bytes + 2
        if idle and len(self._head_prefix) < cap:
            self._head_prefix += data[: cap - len(self._head_prefix)]
        super().data_received(data)
        if not self._idle():
            self._disarm()
        elif self._head_timer is None and data:
            # A head began (bytes that came while a request was in flight are its body, or a
            # pipelined head that aiohttp's keep-alive timeout bounds).
            self._arm()

    def _arm(self) -> None:
        self._head_timer = self._loop.call_later(self.edge.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        t = self.transport
        if not self._idle() or t is None or t.is_closing():
            return
        t.write(error_message(RequestTimeout("the request head did not arrive in time")))
        self.force_close()

    def close_after_answer(self) -> None:
        """Close once this request's answer is out, without reading what is left of its body
        (which aiohttp would otherwise do for ``lingering_time``): a body that stopped coming, or
        one the gateway refused unread."""
        self._closing = True
        self._lingering_time = 0.0
        self.close()

    async def finish_response(self, request: Any, resp: web.StreamResponse, start_time: Any) -> Any:
        if self._closing and not resp.prepared:
            resp.force_close()  # its head says so (Connection: close): the client must not reuse it
        return await super().finish_response(request, resp, start_time)

    async def _handle_request(self, request: Any, start_time: Any, request_handler: Any) -> Any:
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._head_prefix = b""  # the next head starts afresh

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # -- refusals -------------------------------------------------------------------------------
    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The parser's refusals (and a handler's unexpected failure) as OpenAI errors, closing."""
        if request.writer.output_size > 0:
            raise ConnectionError("an answer is already under way")
        error: GatewayError
        if status == 400:
            error = refusal_for(exc, b"\n" in self._head_prefix)
            log.debug("edge refused a request: %s (%s)", error.status, type(exc).__name__)
        elif status == 417:
            error = ExpectationFailed("only 'Expect: 100-continue' is supported")
        else:
            log.error("error handling a request (%s)", status, exc_info=exc)
            error = GatewayError("internal error")
        self._disarm()
        resp = error_response(error)
        resp.force_close()
        return resp


__all__ = ["EdgeHandler", "expect_handler", "handler_kwargs", "refusal_for"]
