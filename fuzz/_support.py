"""What the harnesses share: a transport that records what a protocol writes, and the corpus
of seeds each harness builds in code (nothing copied in)."""

from __future__ import annotations

import asyncio
from typing import Any


class RecordingTransport(asyncio.Transport):
    """A connection's transport with no socket under it: writes are kept, reads are flags."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.protocol: asyncio.BaseProtocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise AssertionError("a write after close")
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def abort(self) -> None:
        self.closed = True


class RecordingProtocol(asyncio.Protocol):
    """Stands for aiohttp's protocol after a hand-over: keeps every byte it is given."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.made = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.received += data
