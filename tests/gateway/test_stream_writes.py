"""How a relayed stream is written to the client: chunk framing done by the gateway on HTTP/1.1,
aiohttp's own writer on HTTP/1.0, and back-pressure when the client stops reading."""

from __future__ import annotations

import asyncio
import socket

import msgspec
import pytest

from tokenplane.gateway.app import GATEWAY_KEY

pytestmark = pytest.mark.anyio


def _body(model: str) -> bytes:
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    return msgspec.json.encode(chat)


def _request(key: str, model: str, version: str = "1.1", *, close: bool = True) -> bytes:
    """A streamed chat request as raw HTTP bytes."""
    body = _body(model)
    connection = "Connection: close\r\n" if close else ""
    head = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{connection}\r\n"
    )
    return head.encode() + body


async def _raw_stream(port: int, key: str, model: str, version: str, read: bool) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(key, model, version))
    await writer.drain()
    data = await reader.read() if read else b""
    writer.close()
    head_part, _, rest = data.partition(b"\r\n\r\n")
    return head_part, rest


def _dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body, de-chunked by hand: every frame must be well formed."""
    parts, pos = [], 0
    while True:
        line_end = body.index(b"\r\n", pos)
        size = int(body[pos:line_end], 16)
        if size == 0:
            return b"".join(parts)
        parts.append(body[line_end + 2 : line_end + 2 + size])
        assert body[line_end + 2 + size : line_end + 4 + size] == b"\r\n"
        pos = line_end + 4 + size


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_streams_are_framed_for_the_clients_http_version(upstreams, gateway, names, version) -> None:
    ups = await upstreams(1)
    ups[0].tokens = 30
    gw = await gateway(ups)
    head, body = await _raw_stream(gw.server.port, names.KEY, names.MODEL, version, read=True)
    assert head.startswith(f"HTTP/{version} 200".encode()), head
    if version == "1.1":
        assert b"Transfer-Encoding: chunked" in head
        text = _dechunk(body)
    else:
        assert b"Transfer-Encoding" not in head  # HTTP/1.0: the body runs to the close
        text = body
    assert text.count(b"data: {") == 30 and text.endswith(b"data: [DONE]\n\n")


async def test_a_client_that_stops_reading_holds_the_relay_not_the_gateways_memory(
    upstreams, gateway, names
) -> None:
    """The client reads nothing: the relay stops at the client transport's high-water mark and the
    upstream is paused in turn, instead of buffering the whole answer in the gateway."""
    ups = await upstreams(1)
    ups[0].tokens = 150_000  # ~20 MB of events: over the kernel's socket buffers on the way
    gw = await gateway(ups)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.server.port, limit=1 << 10)
    writer.write(_request(names.KEY, names.MODEL, close=False))
    await writer.drain()
    await reader.readexactly(64)  # the stream started
    transport = writer.transport
    transport.pause_reading()  # and now the client reads nothing more
    await asyncio.sleep(2.0)
    up = gw.server.app[GATEWAY_KEY].pool.get("up-0")
    assert up is not None and up.in_flight == 1  # still relaying, not finished into a buffer
    writer.close()


async def test_a_client_that_pauses_a_paced_stream_holds_it_and_then_gets_every_event(
    upstreams, gateway, names
) -> None:
    """Events that arrive one at a time go from the instance's connection straight to the client's
    transport (the relay's parked path). A client that stops reading stops the relay at the
    transport's high-water mark and the instance's writes block; when it reads again, every event
    arrives, in order, and the stream ends with [DONE]."""
    ups = await upstreams(1)
    up = ups[0]
    up.tokens, up.token_text, up.token_delay_s = 1500, "x" * 32_000, 0.0005  # ~48 MB
    gw = await gateway(ups)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14)  # no receive window to hide in
    sock.connect(("127.0.0.1", gw.server.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    writer.write(_request(names.KEY, names.MODEL))
    await writer.drain()
    first = await reader.readexactly(64)  # the stream started
    writer.transport.pause_reading()
    await asyncio.sleep(2.0)
    pool_up = gw.server.app[GATEWAY_KEY].pool.get("up-0")
    assert pool_up is not None and pool_up.in_flight == 1
    held = up.events_written
    assert held < up.tokens, "the instance was not held back"
    writer.transport.resume_reading()
    raw = first + await asyncio.wait_for(reader.read(), 60)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    data = _dechunk(rest)
    texts = [
        msgspec.json.decode(e[6:])["choices"][0]["delta"]["content"]
        for e in data.split(b"\n\n")
        if e.startswith(b"data: {")
    ]
    assert [int(t.partition(":")[0]) for t in texts] == list(range(1500))
    assert all(t.endswith("x" * 32_000) for t in texts)
    assert data.endswith(b"data: [DONE]\n\n")
