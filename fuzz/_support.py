"""What the harnesses share: a transport that records what a protocol writes, and the corpus
of seeds each harness builds in code (nothing copied in)."""

from __future__ import annotations

import asyncio
from types import FunctionType, ModuleType
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


def instrument(*modules: ModuleType) -> None:
    """Coverage instrumentation for the code under test only: every Python function and method
    defined in ``modules`` (instrumenting every import, aiohttp's and the whole gateway's, would
    cost more than the inputs; a compiled module has no Python code and is left as it is)."""
    import atheris

    for module in modules:
        for value in vars(module).values():
            owners = [value] if isinstance(value, type) else []
            candidates = [value] + [v for cls in owners for v in vars(cls).values()]
            for f in candidates:
                if isinstance(f, FunctionType) and f.__module__ == module.__name__:
                    atheris.instrument_func(f)


def write_seeds(argv: list[str], seeds: list[bytes]) -> None:
    """Put the harness's seeds into the corpus folder libFuzzer is given (its first argument that
    is not a flag), once: the corpus starts from inputs built in code."""
    import hashlib
    from pathlib import Path

    folders = [a for a in argv[1:] if not a.startswith("-")]
    if not folders:
        return
    folder = Path(folders[0])
    folder.mkdir(parents=True, exist_ok=True)
    for s in seeds:
        (folder / ("seed-" + hashlib.sha1(s).hexdigest())).write_bytes(s)
