"""The fast front's request: a :class:`~tokenplane.gateway.edges.base.ClientStream` over the
connection the front read it from, and the HTTP/1.1 answers it writes there (a whole answer with
its head built once per kind, or a chunked event stream)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from tokenplane.gateway.edges.chunked import WRITE_HIGH_WATER_BYTES, ChunkedBody, drain, frame

SERVER_HEADER = "tokenplane"
_REASONS = {s.value: s.phrase for s in HTTPStatus}


class _Date:
    """The ``Date`` header, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = formatdate(now, usegmt=True).encode("ascii")
        return self._value


_date = _Date()


ExtraHeaders = Callable[["FastRequest"], "dict[str, str] | None"]
"""Headers an answer gets from its request's values (the fast front's counterpart of an aiohttp
``on_response_prepare`` signal): the server's one rule, applied by every way an answer goes out."""


def _no_extra(_request: FastRequest) -> dict[str, str] | None:
    return None


class FastRequest:
    """A request the front read whole, as a :class:`~tokenplane.gateway.edges.base.ClientStream`:
    headers, method, path, the body, and the transport its answer goes to. Like an aiohttp request,
    it also holds per-request values under keys (``request[KEY] = value``)."""

    __slots__ = (
        "_chunked",
        "_ended",
        "_pending_head",
        "_values",
        "body",
        "done",
        "extra_headers",
        "headers",
        "keep_alive",
        "method",
        "path",
        "started",
        "streaming",
        "transport",
    )

    def __init__(
        self,
        method: str,
        path: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        transport: asyncio.Transport,
        extra_headers: ExtraHeaders = _no_extra,
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.transport = transport
        self.extra_headers = extra_headers
        # Every Connection field counts (RFC 9110 7.6.1: repeated fields are one list), as aiohttp
        # reads them: a close in the second one must close here too (fuzz_request_parser found it).
        self.keep_alive = True
        for conn in headers.getall("Connection", ()):
            if "close" in (t.strip() for t in conn.lower().split(",")):
                self.keep_alive = False
        self.started = False  # the answer's head has been written
        self.done = False  # and all of it
        self._values: dict[Any, Any] = {}
        self.streaming = False  # open_stream was called (an attribute: the front reads it per request)
        self._pending_head = b""  # a stream's head, sent with its first chunk (one write)
        self._ended = False
        self._chunked: ChunkedBody | None = None  # once the stream's head went out

    def __setitem__(self, key: Any, value: Any) -> None:
        self._values[key] = value

    def get(self, key: Any, default: Any = None) -> Any:
        return self._values.get(key, default)

    # -- the client-stream protocol -----------------------------------------------------------
    @property
    def gone(self) -> bool:
        return self.transport.is_closing()

    def body_now(self, limit: int) -> bytes | None:
        return self.body  # the front read it whole, within the limit

    async def read_body(self, limit: int) -> bytes:
        return self.body

    def note(self, key: Any, value: Any) -> None:
        self._values[key] = value

    async def send(self, resp: web.Response) -> bool:
        return self.send_now(resp)

    async def send_json(self, body: bytes, headers: Mapping[str, str] | None = None) -> bool:
        return self.send_json_now(body, headers)

    async def open_stream(self, headers: Mapping[str, str]) -> None:
        """The head is made here and goes out with the first chunk (one write, as aiohttp does)."""
        if self.streaming:
            return
        if self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.streaming = True
        close = b"" if self.keep_alive else b"Connection: close\r\n"
        head = _head(200, headers.items(), self.extra_headers(self))
        self._pending_head = b"%sTransfer-Encoding: chunked\r\nDate: %s\r\n%s\r\n" % (
            head,
            _date.get(),
            close,
        )
        self.started = True  # committed: no other answer can follow

    async def write(self, chunk: bytes) -> None:
        """One chunk; back-pressure as the relay's: above the high-water mark, wait for the client."""
        body = self._chunked
        if body is None:
            assert self.streaming, "open_stream first"
            if not chunk:
                return
            t = self.transport
            if t.is_closing():
                raise ConnectionResetError("the client closed the connection")
            t.write(self._pending_head + frame(chunk))
            self._pending_head = b""
            self._chunked = ChunkedBody(t)
            await drain(t)
            return
        await body.write(chunk)

    @property
    def chunks(self) -> ChunkedBody | None:
        return self._chunked

    def backlog(self) -> int:
        return self.transport.get_write_buffer_size()

    async def drain(self) -> None:
        await drain(self.transport)

    async def end_stream(self) -> None:
        self.end_now()

    def end_now(self) -> None:
        """The stream's last chunk (once; the front ends a stream its handler left open)."""
        if self._ended or not self.streaming:
            return
        self._ended = True
        t = self.transport
        if not t.is_closing():
            t.write(self._pending_head + b"0\r\n\r\n")
            self._pending_head = b""
            self.done = True

    def answer(self) -> web.StreamResponse:
        return ANSWERED

    # -- whole answers --------------------------------------------------------------------------
    def send_now(self, resp: web.Response) -> bool:
        """Write a whole answer (see :func:`serialize`); ``False`` if the client had already gone."""
        if self.transport.is_closing():
            return False
        self.transport.write(serialize(resp, self, self.extra_headers(self)))
        self.started = self.done = True
        return True

    def send_json_now(self, body: bytes, headers: Mapping[str, str] | None = None) -> bool:
        """Write a 200 JSON answer of ``body`` with no ``web.Response`` made for it (an instance's
        answer relayed as it came); ``False`` if the client had already gone."""
        if self.transport.is_closing():
            return False
        items = _JSON_HEADERS if not headers else _JSON_HEADERS + tuple(headers.items())
        self.transport.write(_message(200, items, self.extra_headers(self), self.keep_alive, body))
        self.started = self.done = True
        return True


_SKIP = frozenset(("content-length", "transfer-encoding", "connection", "date", "server"))


def _head(status: int, headers: Iterable[tuple[str, str]], extra: dict[str, str] | None) -> bytes:
    """The status line, ``headers`` and ``extra``, and Server, each line ending in CRLF."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
    lines.extend(f"{k}: {v}" for k, v in headers if k.lower() not in _SKIP)
    if extra:
        lines.extend(f"{k}: {v}" for k, v in extra.items())
    lines.append(f"Server: {SERVER_HEADER}")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


_HEADS: dict[tuple[Any, ...], bytes] = {}
_MAX_HEADS = 256  # answers' heads repeat (status, content type, Retry-After): a few dozen kinds
_JSON_HEADERS = (("Content-Type", "application/json"),)

ANSWERED = web.Response()
"""What the completion handler returns for an answer :meth:`FastRequest.send_json` already wrote:
a placeholder nothing reads (the front sees the request started and sends nothing more)."""


def _message(
    status: int,
    items: tuple[tuple[str, str], ...],
    extra: dict[str, str] | None,
    keep_alive: bool,
    body: bytes | bytearray,
) -> bytes:
    """A whole answer as HTTP/1.1 bytes. The head is built once per kind of answer (status and
    headers) and kept; Date, Connection and Content-Length are added."""
    key = (status, items, tuple(extra.items()) if extra else None)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) >= _MAX_HEADS:
            _HEADS.clear()
        head = _HEADS[key] = _head(status, items, extra)
    close = b"" if keep_alive else b"Connection: close\r\n"
    return b"%sDate: %s\r\n%sContent-Length: %d\r\n\r\n%s" % (head, _date.get(), close, len(body), body)


def serialize(resp: web.Response, request: FastRequest, extra: dict[str, str] | None = None) -> bytes:
    """An aiohttp ``web.Response`` with a bytes body, as HTTP/1.1 bytes (see :func:`_message`)."""
    body = resp.body
    if body is None:
        body = b""
    if not isinstance(body, bytes | bytearray):
        raise TypeError(f"the fast front sends bytes bodies only, not {type(body).__name__}")
    return _message(resp.status, tuple(resp.headers.items()), extra, request.keep_alive, body)


__all__ = ["ANSWERED", "WRITE_HIGH_WATER_BYTES", "FastRequest", "drain", "serialize"]
