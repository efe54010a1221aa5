"""The client-stream protocol: what the pipeline and the upstream relay may do with a client.

A request's stages read its head (``method``, ``path``, ``headers``) and body, note per-request
values an answer's headers depend on (:meth:`ClientStream.note`), and answer it in one of two ways:

* a whole answer at once: :meth:`ClientStream.send` (any ``web.Response``) or
  :meth:`ClientStream.send_json` (an instance's 200 JSON body as it came, with no response object
  made for it on the fast front; :meth:`ClientStream.send_json_now` first, which the fast front
  does without a coroutine);
* an event stream: :meth:`ClientStream.open_stream`, then events with :meth:`ClientStream.write`
  (a coroutine, with back-pressure) or, on the relay's hot path, through :attr:`ClientStream.chunks`
  (framed straight onto the connection from the upstream connection's callback, once the stream's
  head went out; before, the caller awaits :meth:`ClientStream.write`), and
  :meth:`ClientStream.end_stream`.

An answer that is returned rather than sent (an error, a cache hit) is sent by the edge itself;
:meth:`ClientStream.answer` is what the edge's handler returns once the answer went out here.
A client that went away shows as ``False`` from the sends and ``ConnectionResetError`` from the
stream's writes (and :attr:`ClientStream.gone`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from tokenplane.gateway.edges.chunked import ChunkedBody


class ClientStream(Protocol):
    """One client request and its answer, whichever server it came through."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def gone(self) -> bool:
        """The client closed its connection."""
        ...

    def body_now(self, limit: int) -> bytes | None:
        """The whole body if it is already here (``None``: await :meth:`read_body`); raises
        :class:`~tokenplane.gateway.errors.BodyTooLarge` over ``limit`` bytes."""
        ...

    async def read_body(self, limit: int) -> bytes: ...

    def note(self, key: Any, value: Any) -> None:
        """Keep a per-request value (e.g. the model a fallback moved the request to)."""
        ...

    async def send(self, resp: web.Response) -> bool:
        """Write a whole answer now; ``False`` when the client had gone."""
        ...

    async def send_json(self, body: bytes, headers: Mapping[str, str] | None = None) -> bool:
        """Write a 200 JSON answer of ``body`` now; ``False`` when the client had gone."""
        ...

    def send_json_now(self, body: bytes, headers: Mapping[str, str] | None = None) -> bool | None:
        """:meth:`send_json` without a coroutine, where the edge can write it without waiting;
        ``None`` where it cannot (then await :meth:`send_json`)."""
        ...

    async def open_stream(self, headers: Mapping[str, str]) -> None:
        """Commit to a chunked event stream (its head goes out with the first event)."""
        ...

    @property
    def streaming(self) -> bool:
        """:meth:`open_stream` was called."""
        ...

    async def write(self, chunk: bytes) -> None:
        """One piece of the stream, waiting while the client is slow to read."""
        ...

    @property
    def chunks(self) -> ChunkedBody | None:
        """Once the stream's head went out and its pieces are framed here: the body, whose
        :meth:`~tokenplane.gateway.edges.chunked.ChunkedBody.put` writes a piece at once (the
        relay's hot path, from the upstream connection's callback); ``None`` before (then
        :meth:`write` it)."""
        ...

    def backlog(self) -> int:
        """Bytes written to the client and not yet sent."""
        ...

    async def drain(self) -> None:
        """Wait while the backlog is above the high-water mark."""
        ...

    async def end_stream(self) -> None:
        """The stream's last chunk."""
        ...

    def answer(self) -> web.StreamResponse:
        """What the edge's handler returns once the answer went out through this stream."""
        ...


__all__ = ["ClientStream"]
