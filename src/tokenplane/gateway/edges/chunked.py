"""A chunked HTTP/1.1 answer body on a client's connection: the framing both edges share.

Once a stream's head went out, each edge hands its pieces to a :class:`ChunkedBody` over the
connection's transport. The relay's hot path calls :meth:`ChunkedBody.put` from the upstream
connection's callback: one call that frames, writes and reports the backlog, where the relay used to
make two through the edge (``write_now``, then ``backlog``) for each of a stream's pieces.
Compiled with mypyc, that call is a direct one.
"""

from __future__ import annotations

import asyncio

WRITE_HIGH_WATER_BYTES = 1 << 16
"""Unsent bytes to a client above which a stream waits for the client to read (back-pressure)."""
DRAIN_POLL_S = 0.005


def frame(chunk: bytes) -> bytes:
    """One chunk of a ``Transfer-Encoding: chunked`` body (a non-empty ``chunk``: an empty one
    would end the body)."""
    return b"%x\r\n%s\r\n" % (len(chunk), chunk)


async def drain(t: asyncio.Transport) -> None:
    """Wait while more than :data:`WRITE_HIGH_WATER_BYTES` to the client are unsent; a client
    that closed meanwhile is a ``ConnectionResetError``."""
    while t.get_write_buffer_size() > WRITE_HIGH_WATER_BYTES:
        if t.is_closing():
            raise ConnectionResetError("the client closed the connection")
        await asyncio.sleep(DRAIN_POLL_S)


class ChunkedBody:
    """The body of a chunked answer whose head has gone out, written piece by piece."""

    __slots__ = ("transport",)

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def put(self, chunk: bytes) -> int:
        """Frame ``chunk`` onto the connection now; the bytes still unsent after it (compare with
        :data:`WRITE_HIGH_WATER_BYTES`), or -1 when the client has gone (nothing written)."""
        t = self.transport
        if t.is_closing():
            return -1
        t.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))  # frame()'s, inline: one call less per piece
        return t.get_write_buffer_size()

    async def write(self, chunk: bytes) -> None:
        """One piece, waiting while the client is slow to read; ``ConnectionResetError`` when it
        has gone."""
        t = self.transport
        if t.is_closing():
            raise ConnectionResetError("the client closed the connection")
        t.write(frame(chunk))
        await drain(t)


__all__ = ["DRAIN_POLL_S", "WRITE_HIGH_WATER_BYTES", "ChunkedBody", "drain", "frame"]
