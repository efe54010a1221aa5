"""Connecting to an instance with a deadline: a handshake that finished while this process's event
loop was stalled is used, one that never finishes times out, and each resolved address is tried."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from tokenplane.gateway.transports.httptools_client import UpstreamClient, UpstreamConnectionError
from tokenplane.gateway.transports.tcp_connect import connected, open_tcp

pytestmark = pytest.mark.anyio

STALL_S = 0.5  # the loop blocked for this long, against a 0.1 s deadline
DEADLINE_S = 0.1


class Received(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.data = b""
        self.got = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.got.set()


@pytest.fixture
async def echo() -> AsyncIterator[int]:
    """A server on 127.0.0.1 that writes back what it reads; yields its port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def full_listener() -> Iterator[int]:
    """A port whose accept queue is full (``listen(0)``, one connection waiting, never accepted):
    the kernel drops further handshakes, so a connect there never finishes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=2.0)
    try:
        yield port
    finally:
        filler.close()
        srv.close()


async def test_connects_and_carries_bytes(echo: int) -> None:
    loop = asyncio.get_running_loop()
    p = Received()
    await open_tcp(loop, p, "127.0.0.1", echo, DEADLINE_S * 20)
    assert p.transport is not None
    p.transport.write(b"hello")
    await asyncio.wait_for(p.got.wait(), 2.0)
    assert p.data == b"hello"
    p.transport.close()


async def test_a_hostname_tries_each_address_until_one_answers(echo: int) -> None:
    """``localhost`` may resolve to ``::1`` first, where nothing listens: refused there, then
    ``127.0.0.1`` answers."""
    loop = asyncio.get_running_loop()
    p = Received()
    await open_tcp(loop, p, "localhost", echo, 2.0)
    assert p.transport is not None
    assert p.transport.get_extra_info("peername")[1] == echo
    p.transport.close()


async def test_a_refused_port_raises_its_error() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        await open_tcp(asyncio.get_running_loop(), Received(), "127.0.0.1", port, 2.0)


async def test_a_handshake_that_never_finishes_times_out(full_listener: int) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await open_tcp(asyncio.get_running_loop(), Received(), "127.0.0.1", full_listener, DEADLINE_S)
    assert time.monotonic() - t0 < 2.0


async def _stalled(coro: object) -> object:
    """Run ``coro`` as a task, let it start its connect, then block the loop past the deadline."""
    task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
    for _ in range(3):  # to the handshake's await (an IP literal: no resolver hop)
        await asyncio.sleep(0)
    time.sleep(STALL_S)  # the whole loop stops, as on a starved machine; the kernel completes the handshake
    return await task


async def test_a_handshake_finished_while_the_loop_was_stalled_is_used(echo: int) -> None:
    loop = asyncio.get_running_loop()
    # The premise: a plain wait_for over create_connection fails here, though the kernel connected.
    with pytest.raises(TimeoutError):
        await _stalled(asyncio.wait_for(loop.create_connection(Received, "127.0.0.1", echo), DEADLINE_S))
    p = Received()
    await _stalled(open_tcp(loop, p, "127.0.0.1", echo, DEADLINE_S))
    assert p.transport is not None
    p.transport.write(b"after a stall")
    await asyncio.wait_for(p.got.wait(), 2.0)
    assert p.data == b"after a stall"
    p.transport.close()


def test_connected_tells_a_finished_handshake_from_one_in_progress_or_refused(full_listener: int) -> None:
    """What the deadline asks when it fires: for an instance across a network the handshake is in
    progress when ``sock_connect`` starts, and may have finished while the loop was stalled."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname(), timeout=2.0) as done:
            assert connected(done)
    with socket.socket() as pending:
        pending.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            pending.connect(("127.0.0.1", full_listener))
        time.sleep(0.05)
        assert not connected(pending)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as refused:
        refused.setblocking(False)
        with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
            refused.connect(("127.0.0.1", port))
        time.sleep(0.05)
        assert not connected(refused)


async def test_the_client_names_a_handshake_timeout(full_listener: int) -> None:
    c = UpstreamClient(connect_timeout_s=DEADLINE_S, read_timeout_s=1.0)
    expected = rf"127\.0\.0\.1:{full_listener}: no handshake within 0\.1 s"
    with pytest.raises(UpstreamConnectionError, match=expected):
        await c.post("127.0.0.1", full_listener, b"POST / HTTP/1.1\r\nHost: t\r\n", b"{}")
    with contextlib.suppress(Exception):
        await c.close()
