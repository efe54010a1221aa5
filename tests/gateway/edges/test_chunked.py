"""The chunked body both edges write a stream through: framing, backlog, a client gone."""

from __future__ import annotations

import asyncio

import pytest

from tokenplane.gateway.edges.chunked import WRITE_HIGH_WATER_BYTES, ChunkedBody, frame


class _Transport:
    """What ChunkedBody uses of a transport: writes kept, a backlog that can be set."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False
        self.unsent = 0

    def write(self, data: bytes) -> None:
        self.written += data
        self.unsent += len(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.unsent


def test_put_frames_each_piece_and_reports_the_backlog() -> None:
    t = _Transport()
    body = ChunkedBody(t)  # type: ignore[arg-type]
    piece = b'data: {"x": 1}\n\n'
    assert body.put(piece) == len(frame(piece))
    assert body.put(b"a" * 300) == len(frame(piece)) + len(frame(b"a" * 300))
    assert bytes(t.written) == b'10\r\ndata: {"x": 1}\n\n\r\n' + b"12c\r\n" + b"a" * 300 + b"\r\n"


def test_put_to_a_client_gone_writes_nothing() -> None:
    t = _Transport()
    t.closing = True
    assert ChunkedBody(t).put(b"data: x\n\n") == -1  # type: ignore[arg-type]
    assert t.written == b""


def test_write_waits_for_a_slow_client_and_fails_once_it_left() -> None:
    async def main() -> None:
        t = _Transport()
        body = ChunkedBody(t)  # type: ignore[arg-type]
        t.unsent = WRITE_HIGH_WATER_BYTES + 1
        writing = asyncio.ensure_future(body.write(b"piece"))
        await asyncio.sleep(0.02)
        assert not writing.done()  # above the high-water mark: it waits
        t.unsent = 0
        await asyncio.wait_for(writing, 1)
        assert t.written.endswith(frame(b"piece"))
        t.closing = True
        with pytest.raises(ConnectionResetError):
            await body.write(b"more")

    asyncio.run(main())
