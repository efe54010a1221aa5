"""The fast front, on raw sockets: what it serves itself, what it hands to aiohttp, and that the two
agree on where a request ends.

Every other gateway test also goes through it (the ``gateway`` fixture starts a ``GatewayServer``);
these pin down the connection-level behaviour those cannot see.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.gateway.edges.fast_front import MAX_HEAD_BYTES, _parse_head

CHAT = "/v1/chat/completions"


def _request(
    names: Any, *, path: str = CHAT, extra: str = "", stream: bool = False, version: str = "1.1"
) -> bytes:
    body = json.dumps(
        {"model": names.MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()
    head = (
        f"POST {CHAT} HTTP/{version}\r\nHost: gw\r\nAuthorization: Bearer {names.KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response: status, headers (lower-case names), body (de-chunked)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    if status == 100:  # an interim answer to Expect: the final one follows
        return await _read_response(reader)
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
        return status, headers, body
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    return status, headers, await reader.read()  # to the close


async def _connect(gw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", gw.server.port)


async def test_a_connection_moves_to_aiohttp_at_its_first_other_route(upstreams, gateway, names) -> None:
    gw = await gateway(await upstreams(1))
    reader, writer = await _connect(gw)
    try:
        for _ in range(2):  # keep-alive, served by the front
            writer.write(_request(names))
            status, headers, body = await _read_response(reader)
            assert status == 200 and headers["server"] == "tokenplane", headers
            assert json.loads(body)["choices"][0]["message"]["content"]
        writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")  # not a completion: handed over
        status, headers, body = await _read_response(reader)
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert headers["server"] != "tokenplane"  # aiohttp's own
        writer.write(_request(names))  # the connection stays with aiohttp, and still works
        status, headers, body = await _read_response(reader)
        assert status == 200 and headers["server"] != "tokenplane"
        assert json.loads(body)["choices"]
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    reader, writer = await _connect(gw)
    good = _request(names)
    bad = good.replace(names.KEY.encode(), b"sk-wrong-key")
    writer.write(good + bad + _request(names, stream=True))  # one write: three requests
    try:
        first = await _read_response(reader)
        second = await _read_response(reader)
        third = await _read_response(reader)
    finally:
        writer.close()
    assert first[0] == 200 and json.loads(first[2])["object"] == "chat.completion"
    assert second[0] == 401 and json.loads(second[2])["error"]["type"] == "authentication_error"
    assert third[0] == 200 and third[1]["content-type"] == "text/event-stream"
    events = [e for e in third[2].split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and all(e.startswith(b"data: {") for e in events[:-1])


async def test_a_request_arriving_byte_by_byte_is_served(upstreams, gateway, names) -> None:
    gw = await gateway(await upstreams(1))
    reader, writer = await _connect(gw)
    try:
        for b in _request(names):
            writer.write(bytes([b]))
            await writer.drain()
        status, headers, _ = await _read_response(reader)
    finally:
        writer.close()
    assert status == 200 and headers["server"] == "tokenplane"


async def test_connection_close_is_honoured(upstreams, gateway, names) -> None:
    gw = await gateway(await upstreams(1))
    reader, writer = await _connect(gw)
    writer.write(_request(names, extra="Connection: TE, Close\r\n"))
    status, headers, _ = await _read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""  # and the gateway closed it
    writer.close()


async def test_unusual_requests_are_answered_by_aiohttp(upstreams, gateway, names) -> None:
    """HTTP/1.0, a malformed head, Expect: each handed over before anything is consumed."""
    gw = await gateway(await upstreams(1))
    cases = [
        (_request(names, version="1.0"), 200),
        (_request(names, extra="Bad Header: x\r\n"), 400),  # a space in a header name
        (_request(names, extra="Expect: 100-continue\r\n"), 200),
    ]
    for raw, want in cases:
        reader, writer = await _connect(gw)
        try:
            writer.write(raw)
            status, headers, _ = await _read_response(reader)
        finally:
            writer.close()
        assert status == want, (raw[:40], status)
        assert headers.get("server") != "tokenplane"


async def test_a_body_over_the_limit_gets_aiohttps_413(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups, limits={"max_body_bytes": 1000})
    reader, writer = await _connect(gw)
    body = json.dumps({"model": names.MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (names.KEY.encode(), len(body), body)
    )
    try:
        status, _, data = await _read_response(reader)
    finally:
        writer.close()
    assert status == 413 and json.loads(data)["error"]["type"] == "invalid_request_error"
    assert not ups[0].requests  # nothing forwarded


async def test_idle_keep_alive_connections_are_closed(upstreams, gateway, names) -> None:
    gw = await gateway(await upstreams(1))
    assert gw.server.front is not None
    gw.server.front.keepalive_timeout_s = 0.2
    reader, writer = await _connect(gw)
    writer.write(_request(names))
    assert (await _read_response(reader))[0] == 200
    # The sweep runs every few seconds (at most every 5 s; this front started with 75 s).
    assert await asyncio.wait_for(reader.read(), 15) == b""
    writer.close()


# --- the head parser agrees with a full HTTP parser on every head it accepts ------------------------

_names = st.sampled_from(["Host", "Content-Type", "Authorization", "X-Thing", "Connection", "x-b3"])
_weird = st.sampled_from(["", " ", "\t", ":", "\r", "\n", "\x00", "é", "a b", "-", "Transfer-Encoding"])


def _mostly(good: list[str], bad: list[str]) -> Any:
    """A valid choice four times in five."""
    good_ = st.sampled_from(good)
    return st.one_of(good_, good_, good_, good_, st.sampled_from(bad))


@st.composite
def _heads(draw: Any) -> bytes:
    method = draw(_mostly(["POST"], ["GET", "post", "POST ", " POST"]))
    path = draw(_mostly([CHAT, "/v1/completions"], [CHAT + "?x=1", "/v1/models", "/v1//completions", "*"]))
    version = draw(_mostly(["HTTP/1.1"], ["HTTP/1.0", "HTTP/1.10", "http/1.1", "HTTP/2"]))
    lines = [f"{method} {path} {version}"]
    for _ in range(draw(st.integers(0, 6))):
        odd = draw(st.integers(0, 9)) == 0  # one header in ten is odd somewhere
        name = draw(st.builds(lambda a, b: a + b, _names, _weird) if odd else _names)
        value = draw(st.one_of(st.sampled_from(["x", "a, b", "Bearer sk-1", "", "close"]), _weird) if odd else
                     st.sampled_from(["x", "a, b", "Bearer sk-1", "", "keep-alive", "close"]))  # fmt: skip
        space = draw(st.sampled_from(["", " ", "  "]))
        lines.insert(draw(st.integers(1, len(lines))), f"{name}:{space}{value}")
    length = draw(_mostly(["12", "0", "7"], [" 7 ", "1,2", "-1", "+3", "", "0x1", "99999999999999999999"]))
    if draw(st.integers(0, 9)):  # one head in ten has none
        lines.insert(draw(st.integers(1, len(lines))), f"Content-Length: {length}")
    if draw(st.integers(0, 19)) == 0:
        lines.insert(1, "Content-Length: 3")  # a second one
    return "\r\n".join(lines).encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(_heads())
def test_an_accepted_head_means_what_httptools_says(head: bytes) -> None:
    parsed = _parse_head(head)
    if parsed is None:
        return  # aiohttp's parser gets it
    endpoint, path, headers, length = parsed
    seen: dict[str, Any] = {"headers": [], "complete": False}

    class Sink:
        def on_url(self, url: bytes) -> None:
            seen["url"] = url

        def on_header(self, name: bytes, value: bytes) -> None:
            seen["headers"].append((name.decode("latin-1"), value.decode("latin-1")))

        def on_message_complete(self) -> None:
            seen["complete"] = True

    p = httptools.HttpRequestParser(Sink())
    p.feed_data(head + b"\r\n\r\n" + b"x" * min(length, 100))  # raises on anything it refuses
    assert seen["complete"] == (length <= 100), "httptools reads another body length"
    assert p.get_method() == b"POST" and p.get_http_version() == "1.1"
    assert seen["url"].decode() == path and path in (CHAT, "/v1/completions")
    assert endpoint == ("chat" if path == CHAT else "completions")
    strip = " \t"  # trailing whitespace is not part of a value (RFC 9110 5.5); llhttp keeps it
    assert [(k.lower(), v) for k, v in headers] == [(k.lower(), v.strip(strip)) for k, v in seen["headers"]]
    assert len(head) <= MAX_HEAD_BYTES


async def test_without_the_front_aiohttp_serves_everything(upstreams, names) -> None:
    """``listen.fast_front: false``: the escape hatch."""
    from tokenplane.gateway import create_app, parse_config
    from tokenplane.gateway.server import GatewayServer

    ups = await upstreams(1)
    config = parse_config(names.gateway_config(ups, listen={"fast_front": False}))
    assert config.listen.fast_front is False
    server = GatewayServer(create_app(config), fast=config.listen.fast_front)
    await server.start()
    try:
        assert server.front is None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_request(names))
        status, headers, _ = await _read_response(reader)
        writer.close()
    finally:
        await server.close()
    assert status == 200 and headers["server"] != "tokenplane"


def test_serialized_heads_are_kept_per_kind_of_answer() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    from tokenplane.gateway.edges.fast_request import FastRequest, serialize

    def request(connection: str | None = None) -> FastRequest:
        headers = CIMultiDict({"Connection": connection} if connection else {})
        return FastRequest("POST", CHAT, CIMultiDictProxy(headers), b"", None)  # type: ignore[arg-type]

    def head_of(raw: bytes) -> dict[str, str]:
        lines = raw.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        return {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}

    from aiohttp import web

    a = serialize(web.Response(status=503, body=b"{}", headers={"Retry-After": "1"}), request())
    b = serialize(web.Response(status=503, body=b"{1}", headers={"Retry-After": "7"}), request("close"))
    c = serialize(web.Response(body=b"abc", content_type="application/json"), request(), {"x-extra": "m"})
    assert a.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and a.endswith(b"\r\n\r\n{}")
    assert head_of(a)["retry-after"] == "1" and "connection" not in head_of(a)
    assert head_of(b)["retry-after"] == "7" and head_of(b)["connection"] == "close"
    assert head_of(b)["content-length"] == "3" and b.endswith(b"{1}")
    assert head_of(c)["content-type"] == "application/json" and head_of(c)["x-extra"] == "m"
    assert c.startswith(b"HTTP/1.1 200 OK\r\n") and "date" in head_of(c)
