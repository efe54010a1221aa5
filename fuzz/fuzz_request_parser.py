"""Fuzz the fast front's HTTP/1.1 request reading (``gateway/edges/fast_front.py``).

Each input is a byte stream a client sends on one connection (the first byte picks how it is cut
into reads). Three properties:

1. **Agreement with aiohttp**: a head the front accepts (:func:`_parse_head`) is parsed by aiohttp's
   own parser (the one every other request goes to) into the same method, path and headers, and the
   message ends at the same byte: the two parsers never disagree about where a request ends.
2. **The front against a model**: :class:`FrontProtocol`, fed the stream through a recording
   transport, serves exactly the requests a straight reading of the stream finds, with the bodies
   their ``Content-Length`` says, and hands aiohttp exactly the bytes from the first request not in
   the fast shape on (none lost, none read twice).
3. No exception escapes the protocol.

Run: ``python fuzz/run.py --seconds 600 request_parser``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import atheris
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser

from tokenplane.gateway.edges import fast_front, fast_request
from tokenplane.gateway.edges.fast_front import MAX_HEAD_BYTES, FastFront, _parse_head

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _support import RecordingProtocol, RecordingTransport, instrument, write_seeds

instrument(fast_front, fast_request)

MAX_BODY = 4096
LOOP = asyncio.new_event_loop()
asyncio.set_event_loop(LOOP)
SERVED: list[Any] = []
HANDOVERS: list[RecordingProtocol] = []


async def _handler(request: Any, endpoint: str) -> web.StreamResponse:
    SERVED.append(request)
    return web.Response(body=b"ok")


def _aiohttp_protocol() -> asyncio.Protocol:
    p = RecordingProtocol()
    HANDOVERS.append(p)
    return p


async def _make_front() -> FastFront:
    return FastFront(_handler, _aiohttp_protocol, MAX_BODY)


FRONT = LOOP.run_until_complete(_make_front())


def _closes(headers: list[tuple[str, str]]) -> bool:
    """A close token in any Connection field (repeated fields are one list, RFC 9110 5.3)."""
    values = (v for k, v in headers if k.lower() == "connection")
    return any("close" in (t.strip() for t in v.lower().split(",")) for v in values)


def check_against_aiohttp(head: bytes, parsed: tuple[str, str, list[tuple[str, str]], int]) -> None:
    _endpoint, path, headers, length = parsed
    if length > MAX_BODY:
        return
    body = bytes(range(256)) * (length // 256) + bytes(range(length % 256))
    close = _closes(headers)
    tail = b"" if close else b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n"
    parser = HttpRequestParser(BaseProtocol(LOOP), LOOP, 2**16, max_line_size=8190, max_field_size=8190)
    try:
        messages, upgraded, _ = parser.feed_data(head + b"\r\n\r\n" + body + tail)
    except HttpProcessingError as exc:
        raise AssertionError(f"the fast front accepts a head aiohttp rejects ({exc!r}): {head!r}") from None
    assert not upgraded, head
    assert len(messages) == 2 - close, (
        f"aiohttp read {len(messages)} messages, not one and the next: {head!r}"
    )
    msg, payload = messages[0]
    assert msg.method == "POST" and msg.path == path, (msg.method, msg.path, head)
    assert not msg.chunked, head
    theirs = [(k.decode("latin-1"), v.decode("latin-1").strip(" \t")) for k, v in msg.raw_headers]
    assert theirs == headers, (theirs, headers, head)
    got = b"".join(getattr(payload, "_buffer", ()))
    assert got == body, f"aiohttp read a body of {len(got)} bytes, the front {length}: {head!r}"
    assert close or messages[1][0].path == "/next", head


def model(data: bytes) -> tuple[list[bytes], bytes | None]:
    """The bodies of the fast requests a straight reading finds, and the bytes aiohttp gets (None:
    no hand-over)."""
    bodies: list[bytes] = []
    pos = 0
    while pos < len(data):
        rest = data[pos:]
        end = rest.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        if end < 0:
            if (
                len(rest) > MAX_HEAD_BYTES
                or not rest.startswith(b"POST "[: len(rest)])
                or rest.count(b"\n") != rest.count(b"\r\n")  # a bare LF: aiohttp refuses it
            ):
                return bodies, rest
            return bodies, None
        parsed = _parse_head(rest[:end])
        if parsed is None or parsed[3] > MAX_BODY:
            return bodies, rest
        check_against_aiohttp(rest[:end], parsed)
        length = parsed[3]
        if len(rest) < end + 4 + length:
            return bodies, None
        bodies.append(rest[end + 4 : end + 4 + length])
        pos += end + 4 + length
        if _closes(parsed[2]):
            return bodies, None  # the front closes after answering; the rest is never read
    return bodies, None


def _settle() -> None:
    for _ in range(4):
        LOOP.run_until_complete(asyncio.sleep(0))


def drive(data: bytes, cut: int) -> tuple[list[bytes], bytes | None]:
    SERVED.clear()
    HANDOVERS.clear()
    t = RecordingTransport()
    proto = FRONT.protocol()
    proto.connection_made(t)
    t.set_protocol(proto)
    pos = 0
    while pos < len(data) and not t.closed:
        piece = data[pos : pos + cut] if cut else data[pos:]
        pos += len(piece)
        t.get_protocol().data_received(piece)
        _settle()
    if t.get_protocol() is proto:
        proto.connection_lost(None)
        _settle()
    FRONT.connections.clear()
    for r in SERVED:
        assert len(r.body) == int(r.headers["Content-Length"]), r.headers
    answers = bytes(t.written).count(b"HTTP/1.1 200 OK\r\n")
    assert answers == len(SERVED), (answers, len(SERVED))
    handed = bytes(HANDOVERS[0].received) if HANDOVERS else None
    return [r.body for r in SERVED], handed


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    cut, stream = data[0] % 48, data[1:]
    want_bodies, want_handed = model(stream)
    bodies, handed = drive(stream, cut)
    assert bodies == want_bodies, (bodies, want_bodies, stream)
    if want_handed is not None or handed is not None:
        assert handed == want_handed, (handed, want_handed, stream)


def seeds() -> list[bytes]:
    """Requests in the fast shape and out of it, built here (the corpus starts from these)."""
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    base = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    ok = base + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    out = [
        ok,
        ok + ok,
        ok.replace(b"/v1/chat/completions", b"/v1/completions"),
        base + b"Content-Length: 3\r\nConnection: close\r\n\r\nabc" + ok,
        base + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        base + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        base + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        base + b"Content-Length: +3\r\n\r\nabc",
        base + b"Content-Length: 3 \r\n\r\nabc",
        base + b"Content-Length: 99999\r\n\r\n",
        base + b"X-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n",
        base + b"Bad Name: x\r\nContent-Length: 0\r\n\r\n",
        base.replace(b"\r\n", b"\n") + b"Content-Length: 0\n\n",
        b"GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
        base + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
        base + b"X: \x00\r\nContent-Length: 0\r\n\r\n",
        base + b"X: \xff\xfe\r\nContent-Length: 0\r\n\r\n",
        base + b"Content-Length: 2\r\n\r\nhiPOST /v1/completions HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",
    ]
    return [bytes([i % 48]) + s for i, s in enumerate(out)]


if __name__ == "__main__":
    # The harness's own checks too: coverage to steer by even where the gateway is compiled.
    instrument(sys.modules[__name__])
    write_seeds(sys.argv, seeds())
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
