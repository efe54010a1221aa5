"""The hot-path upstream client against a raw asyncio server that says exactly what each case needs:
keep-alive reuse, chunked bodies, an idle connection the server closed, timeouts, refusals,
back-pressure, and a close that the server sees."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from tokenplane.gateway.transports.httptools_client import (
    HIGH_WATER_BYTES,
    SINK_DECLINED,
    SINK_TAKEN,
    SINK_TAKEN_WAKE,
    UpstreamClient,
    UpstreamConnectionError,
)

pytestmark = pytest.mark.anyio

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), b"".join(extra), body)


class Server:
    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self.disconnected = asyncio.Event()
        self.port = 0


@pytest.fixture
async def serve(anyio_backend: str) -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def make(handler: Handler) -> Server:
        state = Server()

        async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            try:
                await handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                state.disconnected.set()
            finally:
                writer.close()

        srv = await asyncio.start_server(on_conn, "127.0.0.1", 0)
        servers.append(srv)
        state.port = srv.sockets[0].getsockname()[1]
        return state

    yield make
    for srv in servers:
        srv.close()
        with contextlib.suppress(Exception):
            await srv.wait_closed()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.contextmanager
def _cyclic_garbage() -> Iterator[list[str]]:
    """The tokenplane objects that only the cyclic collector would free, made inside the block."""
    import gc

    leaked: list[str] = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield leaked
        gc.collect()
        leaked.extend(type(o).__name__ for o in gc.garbage if type(o).__module__.startswith("tokenplane"))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def client(**kw: float | None) -> UpstreamClient:
    kw.setdefault("connect_timeout_s", 2.0)
    kw.setdefault("read_timeout_s", 2.0)
    return UpstreamClient(**kw)  # type: ignore[arg-type]


async def test_keep_alive_reuses_one_connection_and_sends_the_body(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            req = await read_request(reader)
            state.requests.append(req)
            writer.write(ok(b'{"n": %d}' % len(state.requests), b"X-Id: a\r\n"))
            await writer.drain()

    state = await serve(handler)
    c = client()
    for i in range(3):
        resp = await c.post("127.0.0.1", state.port, HEAD, b'{"i": %d}' % i, {"traceparent": "00-x"})
        assert resp.status == 200 and resp.headers["x-id"] == "a"
        assert await resp.read() == b'{"n": %d}' % (i + 1)
        resp.release()
    assert state.connections == 1
    assert state.requests[2].endswith(b'\r\n\r\n{"i": 2}') and b"traceparent: 00-x\r\n" in state.requests[2]
    assert b"Content-Length: 8\r\n" in state.requests[0]
    await c.close()


async def test_chunked_body_is_dechunked_and_read_in_pieces(serve) -> None:
    state = await serve(paced([b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"], 0.01))
    c = client()
    resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
    got = []
    while data := await resp.content.readany():
        got.append(data)
    assert b"".join(got) == b"data: a\n\ndata: b\n\ndata: [DONE]\n\n" and len(got) >= 2
    resp.release()
    await c.close()


def paced(parts: list[bytes], gap_s: float, *, end: bool = True, then_s: float = 0.0) -> Handler:
    """A chunked answer: one part per chunk, ``gap_s`` apart (so that each arrives by itself)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in parts:
            await asyncio.sleep(gap_s)
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        await asyncio.sleep(then_s)
        if end:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        await reader.read()

    return handler


class Sink:
    """Takes pieces until ``answers`` runs out of SINK_TAKEN."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.taken: list[bytes] = []

    def __call__(self, data: bytes) -> int:
        answer = self.answers.pop(0) if self.answers else SINK_TAKEN
        if answer != SINK_DECLINED:
            self.taken.append(data)
        return answer


async def _rest(resp) -> bytes:
    out = b""
    while data := await resp.content.readany():
        out += data
    return out


async def test_a_parked_body_goes_to_the_sink_until_it_declines_then_is_read_in_order(serve) -> None:
    parts = [b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10]
    state = await serve(paced(parts, 0.05))
    c = client()
    resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
    sink = Sink(SINK_TAKEN, SINK_TAKEN, SINK_DECLINED)
    w = resp.park(sink)
    assert w is not None
    await asyncio.wait_for(w, 2.0)  # woken by the declined piece
    resp.unpark()
    assert sink.taken == parts[:2]
    assert await _rest(resp) == b"c" * 10 + b"d" * 10  # the declined piece first, nothing lost
    assert sink.taken == parts[:2]  # the sink was not called after it declined
    resp.release()
    assert state.connections == 1 and len(c._idle[("127.0.0.1", state.port)]) == 1
    await c.close()


async def test_a_parked_body_wakes_the_reader_when_the_sink_asks_and_at_the_end(serve) -> None:
    state = await serve(paced([b"a", b"b", b"c"], 0.05))
    c = client()
    resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
    sink = Sink(SINK_TAKEN_WAKE)
    w = resp.park(sink)
    assert w is not None
    await asyncio.wait_for(w, 2.0)
    resp.unpark()
    assert sink.taken == [b"a"]
    w = resp.park(sink)  # nothing buffered yet: parks again
    assert w is not None
    await asyncio.wait_for(w, 2.0)  # the end of the body wakes it
    resp.unpark()
    assert sink.taken == [b"a", b"b", b"c"] and resp.park(sink) is None  # ended: read that
    assert await resp.content.readany() == b""
    resp.release()
    assert len(c._idle[("127.0.0.1", state.port)]) == 1  # a whole message: the connection is reused
    await c.close()


async def test_parking_with_something_buffered_returns_none(serve) -> None:
    state = await serve(paced([b"a", b"b"], 0.05, end=False, then_s=5))
    c = client()
    resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
    await asyncio.sleep(0.3)  # both pieces buffered
    assert resp.park(Sink()) is None
    assert await resp.content.readany() == b"ab"
    resp.close()
    await c.close()


async def test_a_parked_body_times_out_after_silence_and_each_piece_resets_the_wait(serve) -> None:
    """Pieces 0.1 s apart for 1 s under a 0.5 s read timeout: no timeout while they come; then
    silence, and the wait fails with TimeoutError."""
    state = await serve(paced([b"x"] * 10, 0.1, end=False, then_s=5))
    c = client(read_timeout_s=0.5)
    resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
    sink = Sink()
    w = resp.park(sink)
    assert w is not None
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(w, 3.0)
    resp.unpark()
    assert sink.taken == [b"x"] * 10
    resp.close()
    await c.close()


async def test_an_idle_connection_the_server_closed_is_replaced_once(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"{}"))  # keep-alive by HTTP/1.1 default, then the server drops it anyway
        await writer.drain()

    state = await serve(handler)
    c = client()
    for _ in range(3):
        resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
        assert await resp.read() == b"{}"
        resp.release()
        await asyncio.sleep(0.05)  # the close reaches the client, or races the next send
    assert state.connections == 3
    await c.close()


async def test_a_reused_connection_dropped_before_any_answer_is_retried_on_a_new_one(serve) -> None:
    async def one_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"{}"))
        await writer.drain()
        await read_request(reader)  # the second request on this connection: dropped unanswered

    state = await serve(one_each)
    c = client()
    for _ in range(2):
        resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
        assert await resp.read() == b"{}"
        resp.release()
    assert state.connections == 2  # the retry went out on a fresh connection
    await c.close()


async def test_connection_close_is_not_pooled_and_close_aborts(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await reader.readexactly(1)  # blocks until the client closes: IncompleteReadError

    state = await serve(handler)
    c = client()
    resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
    assert await resp.content.readany() == b"hello"
    resp.close()
    await asyncio.wait_for(state.disconnected.wait(), 2)
    resp.release()  # after close: a no-op

    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"{}", b"Connection: close\r\n"))
        await writer.drain()
        await reader.read()

    other = await serve(closing)
    for _ in range(2):
        resp = await c.post("127.0.0.1", other.port, HEAD, b"{}")
        await resp.read()
        resp.release()
    assert other.connections == 2
    await c.close()


async def test_refused_timeouts_and_a_stream_cut_short(serve) -> None:
    c = client(read_timeout_s=0.2)
    with pytest.raises(UpstreamConnectionError):
        await c.post("127.0.0.1", 1, HEAD, b"{}")  # nothing listens on port 1

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    slow = await serve(silent)
    with pytest.raises(TimeoutError):
        await c.post("127.0.0.1", slow.port, HEAD, b"{}")
    with pytest.raises(TimeoutError):
        await client(read_timeout_s=5).post("127.0.0.1", slow.port, HEAD, b"{}", headers_timeout_s=0.1)

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(5)

    stalled = await serve(stall)
    resp = await c.post("127.0.0.1", stalled.port, HEAD, b"{}")
    assert await resp.content.readany() == b"partial"
    with pytest.raises(TimeoutError):
        await resp.content.readany()
    resp.close()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    broken = await serve(cut)
    resp = await c.post("127.0.0.1", broken.port, HEAD, b"{}")
    with pytest.raises(UpstreamConnectionError):
        await resp.read()
    resp.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"this is not http\r\n\r\n")
        await writer.drain()
        await reader.read()

    bad = await serve(garbage)
    with pytest.raises(UpstreamConnectionError, match="malformed"):
        await c.post("127.0.0.1", bad.port, HEAD, b"{}")
    await c.close()


async def test_a_slow_reader_pauses_the_connection(serve) -> None:
    size = 4 * HIGH_WATER_BYTES
    sent = asyncio.Event()

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()  # blocks while the client has stopped reading
        sent.set()
        await reader.read()

    state = await serve(big)
    c = client()
    resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
    await asyncio.sleep(0.3)
    buffered = resp._conn._buffered
    assert resp._conn._paused and buffered <= HIGH_WATER_BYTES + 65536 * 4
    total = 0
    while data := await resp.content.readany():
        total += len(data)
    assert total == size and sent.is_set()
    resp.release()
    await c.close()


async def test_a_big_answer_read_whole_leaves_the_reused_connection_reading(serve) -> None:
    """An answer over the high-water mark that ends in one read pauses the connection; reading it
    whole must resume it, or the next request on the pooled connection would never be answered."""
    big = b"x" * (HIGH_WATER_BYTES + HIGH_WATER_BYTES // 2)  # over the mark, within one read

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(ok(big))
            await writer.drain()

    state = await serve(handler)
    c = client()
    for _ in range(3):
        resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
        await asyncio.sleep(0.05)  # let the whole answer arrive before it is read
        assert await resp.read() == big
        resp.release()
    assert state.connections == 1
    await c.close()


async def test_a_response_is_freed_without_the_cyclic_collector(serve) -> None:
    """Responses are made per request: none may sit in a reference cycle (the collector would then
    walk every in-flight request's objects to free them; it cost ~10 µs of CPU a request)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(ok(b"{}"))
            await writer.drain()

    state = await serve(handler)
    c = client()
    with _cyclic_garbage() as leaked:
        for _ in range(5):
            resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
            assert await resp.read() == b"{}"
            resp.release()
        del resp
    assert leaked == []
    await c.close()


async def test_a_closed_connection_is_freed_without_the_cyclic_collector(serve) -> None:
    """A connection ends (the instance closed it while idle in the pool, answered with
    ``Connection: close``, or cut a body short): nothing of it may wait for the collector. The
    servers raise the young threshold, so a connection that had lived long in the pool would wait
    for a full collection, hours apart under steady load (the soak's RSS growth)."""

    async def idle_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"{}"))  # keep-alive by default, then dropped while idle
        await writer.drain()

    async def says_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"{}", b"Connection: close\r\n"))
        await writer.drain()

    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")
        await writer.drain()

    async def goes_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")
        await writer.drain()
        await asyncio.sleep(1)

    servers = [await serve(h) for h in (idle_close, says_close, cut_short, goes_silent)]
    c = client(read_timeout_s=0.1)
    with _cyclic_garbage() as leaked:
        for _ in range(3):
            for state in servers:
                resp = await c.post("127.0.0.1", state.port, HEAD, b"{}")
                with contextlib.suppress(UpstreamConnectionError, TimeoutError):
                    await resp.read()
                resp.close()
                del resp
            await asyncio.sleep(0.05)  # each close reaches the client
    assert leaked == []
    await c.close()
