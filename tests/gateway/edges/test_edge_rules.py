"""The edge's HTTP/1.1 rules, over raw sockets, on both edges (the fast front and aiohttp alone).

A table of requests a proxy must refuse or treat with care (RFC 9112): each case sends bytes
(pauses between pieces where it says), and checks the statuses that come back, whether the
connection is then closed or kept alive, and how many requests the fake instance behind the
gateway received: a smuggling attempt must never reach it as a second request. Every 4xx body is
an OpenAI error object.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from tokenplane.gateway import create_app, parse_config
from tokenplane.gateway.server import GatewayServer

CHAT = "/v1/chat/completions"
KEY = "sk-test-acme"
HEADER_TIMEOUT_S = 0.4
BODY_TIMEOUT_S = 0.4
MAX_LINE = 2048
MAX_FIELD = 2048
MAX_HEADERS = 40
EDGE = {
    "header_timeout_s": HEADER_TIMEOUT_S,
    "body_timeout_s": BODY_TIMEOUT_S,
    "max_request_line_bytes": MAX_LINE,
    "max_field_bytes": MAX_FIELD,
    "max_headers": MAX_HEADERS,
}
BODY = json.dumps({"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}]}).encode()
N = len(BODY)


def head(*lines: str, version: str = "1.1", path: str = CHAT, method: str = "POST") -> bytes:
    """A request head: the request line, Host and the key, ``lines``, and the blank line."""
    out = [f"{method} {path} HTTP/{version}", "Host: gw", f"Authorization: Bearer {KEY}", *lines]
    return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")


def req(*lines: str, body: bytes = BODY, **kw: Any) -> bytes:
    """A whole, valid request with ``Content-Length``."""
    return head(f"Content-Length: {len(body)}", *lines, **kw) + body


def chunked(body: bytes = BODY, ext: str = "") -> bytes:
    return b"%x%s\r\n%s\r\n0\r\n\r\n" % (len(body), ext.encode(), body)


SMUGGLED = req()  # a whole second request hidden in the first one's body


@dataclass(frozen=True)
class Case:
    name: str
    send: tuple[bytes | float, ...]
    """Pieces to send; a float is a pause (seconds) between pieces."""
    statuses: tuple[int, ...]
    """The answers, in order (an interim 100 included)."""
    closed: bool
    """The connection is closed after the answers (otherwise it must stay open)."""
    upstream: int
    """Requests the instance received."""
    half_close: bool = False
    """Shut the write side down after sending (a client that gave up mid-request)."""
    on_aiohttp: tuple[tuple[int, ...], int] | None = None
    """(statuses, upstream) where the aiohttp edge differs, safely: its parser drops the requests
    it parsed from a read that ends in a malformed one, and answers that read with one 400."""


def byte_by_byte(data: bytes, pause: float) -> tuple[bytes | float, ...]:
    out: list[bytes | float] = []
    for i in range(len(data)):
        out += [data[i : i + 1], pause]
    return tuple(out)


CASES = [
    # -- framing: Content-Length and Transfer-Encoding (request smuggling) ---------------------
    Case(
        "cl-and-te",
        (head(f"Content-Length: {N}", "Transfer-Encoding: chunked") + chunked() + SMUGGLED,),
        (400,),
        True,
        0,
    ),
    Case(
        "te-and-cl-short",
        (head("Transfer-Encoding: chunked", "Content-Length: 4") + b"0\r\n\r\n" + SMUGGLED,),
        (400,),
        True,
        0,
    ),
    Case(
        "duplicate-cl-same", (head(f"Content-Length: {N}", f"Content-Length: {N}") + BODY,), (400,), True, 0
    ),
    Case(
        "duplicate-cl-conflicting",
        (head("Content-Length: 0", f"Content-Length: {N}") + BODY + SMUGGLED,),
        (400,),
        True,
        0,
    ),
    Case("cl-list", (head(f"Content-Length: {N}, {N}") + BODY,), (400,), True, 0),
    Case("cl-signed", (head(f"Content-Length: +{N}") + BODY,), (400,), True, 0),
    Case("cl-not-digits", (head("Content-Length: 1e3") + BODY,), (400,), True, 0),
    Case("te-chunked-not-final", (head("Transfer-Encoding: chunked, gzip") + chunked(),), (400,), True, 0),
    Case("te-unknown-coding", (head("Transfer-Encoding: gzip, chunked") + chunked(),), (501,), True, 0),
    Case("te-only-identity", (head("Transfer-Encoding: identity") + BODY,), (400,), True, 0),
    Case(
        "te-chunked-twice",
        (head("Transfer-Encoding: chunked", "Transfer-Encoding: chunked") + chunked(),),
        (400,),
        True,
        0,
    ),
    Case(
        "te-obfuscated",
        (head(f"Content-Length: {N}", "Transfer-Encoding: xchunked") + BODY + SMUGGLED,),
        (400,),
        True,
        0,
    ),
    Case(
        "te-in-http10",
        (head("Transfer-Encoding: chunked", version="1.0") + chunked() + SMUGGLED,),
        (400,),
        True,
        0,
    ),
    Case("chunked-ok", (head("Transfer-Encoding: chunked") + chunked(),), (200,), False, 1),
    Case(
        "chunk-extension-ok",
        (head("Transfer-Encoding: chunked") + chunked(ext=";name=value"),),
        (200,),
        False,
        1,
    ),
    Case(
        "chunk-size-not-hex",
        (head("Transfer-Encoding: chunked") + b"zz\r\n" + BODY + b"\r\n0\r\n\r\n",),
        (400,),
        True,
        0,
    ),
    Case(
        "chunk-size-0x",
        (head("Transfer-Encoding: chunked") + b"0x%x\r\n" % N + BODY + b"\r\n0\r\n\r\n",),
        (400,),
        True,
        0,
    ),
    Case(
        "chunk-size-overflow",
        (head("Transfer-Encoding: chunked") + b"f" * 20 + b"\r\n" + BODY,),
        (400,),
        True,
        0,
    ),
    Case(
        "chunk-size-negative",
        (head("Transfer-Encoding: chunked") + b"-1\r\n" + BODY + b"\r\n0\r\n\r\n",),
        (400,),
        True,
        0,
    ),
    Case(
        "chunk-extension-ctl", (head("Transfer-Encoding: chunked") + chunked(ext=";a=\x01"),), (400,), True, 0
    ),
    Case(
        "chunk-bare-lf",
        (head("Transfer-Encoding: chunked") + b"%x\n" % N + BODY + b"\n0\n\n" + SMUGGLED,),
        (400,),
        True,
        0,
    ),
    # -- the head's syntax ----------------------------------------------------------------------
    Case("obs-fold", (head("X-Folded: a", " b", f"Content-Length: {N}") + BODY,), (400,), True, 0),
    Case("space-before-colon", (head(f"Content-Length : {N}") + BODY + SMUGGLED,), (400,), True, 0),
    Case(
        "space-before-colon-te",
        (head(f"Content-Length: {N}", "Transfer-Encoding : chunked") + BODY,),
        (400,),
        True,
        0,
    ),
    Case("bare-lf", (req().replace(b"\r\n", b"\n"),), (400,), True, 0),
    Case("nul-in-value", (req("X-Nul: a\x00b"),), (400,), True, 0),
    Case("ctl-in-value", (req("X-Ctl: a\x01b"),), (400,), True, 0),
    Case("ctl-in-name", (req("X-C\x01tl: ab"),), (400,), True, 0),
    Case("missing-host", (req().replace(b"Host: gw\r\n", b""),), (400,), True, 0),
    # -- limits ---------------------------------------------------------------------------------
    Case("request-line-too-long", (req(path=CHAT + "?" + "a" * (MAX_LINE + 10)),), (414,), True, 0),
    Case("header-too-long", (req("X-Big: " + "a" * (MAX_FIELD + 10)),), (431,), True, 0),
    Case("too-many-headers", (req(*(f"X-H{i}: v" for i in range(MAX_HEADERS + 5))),), (431,), True, 0),
    Case("body-over-limit", (head("Content-Length: 70000") + b"x" * 70000,), (413,), True, 0),
    Case("body-over-limit-declared", (head("Content-Length: 99999999999"),), (413,), True, 0),
    # -- Expect, versions, keep-alive, pipelining ------------------------------------------------
    Case(
        "expect-100", (head("Expect: 100-continue", f"Content-Length: {N}"), 0.1, BODY), (100, 200), False, 1
    ),
    Case("expect-unknown", (head("Expect: something", f"Content-Length: {N}") + BODY,), (417,), False, 0),
    Case("http10-closes", (req(version="1.0"),), (200,), True, 1),
    Case("http10-keep-alive", (req("Connection: keep-alive", version="1.0"),), (200,), False, 1),
    # a body that came in pieces, then a keep-alive connection idle past the header timeout: no 408
    Case("body-in-pieces-then-idle", (head(f"Content-Length: {N}"), 0.05, BODY, 0.6), (200,), False, 1),
    Case("http11-close", (req("Connection: close"),), (200,), True, 1),
    # repeated Connection fields are one list: a close in the second closes (none served after it)
    Case(
        "close-in-second-field",
        (req("Connection: keep-alive", "Connection: close"), 0.2, req()),
        (200,),
        True,
        1,
    ),
    Case("pipelined", (req() + req() + req(),), (200, 200, 200), False, 3),
    Case("pipelined-then-bad", (req() + b"GARBAGE\r\n\r\n",), (200, 400), True, 1, on_aiohttp=((400,), 0)),
    Case(
        "body-longer-than-declared",
        (head(f"Content-Length: {N}") + BODY + b"}}}}\r\n\r\n",),
        (200, 400),
        True,
        1,
        on_aiohttp=((400,), 0),
    ),
    # -- slow and vanishing clients ---------------------------------------------------------------
    Case("body-shorter-than-declared", (head(f"Content-Length: {N + 10}") + BODY,), (408,), True, 0),
    Case("slowloris-head", byte_by_byte(head(f"Content-Length: {N}")[:40], 0.05), (408,), True, 0),
    Case(
        "slowloris-other-route",
        byte_by_byte(b"GET /health HTTP/1.1\r\nHost: gw\r\nX-A: b", 0.05),
        (408,),
        True,
        0,
    ),
    Case("stops-mid-head", (head(f"Content-Length: {N}")[:30],), (408,), True, 0),
    Case("stops-mid-body", (head(f"Content-Length: {N}") + BODY[:10],), (408,), True, 0),
    Case(
        "stops-mid-chunked-body",
        (head("Transfer-Encoding: chunked") + b"%x\r\n" % N + BODY[:10],),
        (408,),
        True,
        0,
    ),
    Case("half-close-mid-body", (head(f"Content-Length: {N}") + BODY[:10],), (), True, 0, half_close=True),
]


class Conn:
    """A raw client socket: a failed send (the gateway already closed) leaves what it answered
    readable, unlike a stream writer's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.eof = False
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, port: int) -> Conn:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return cls(sock)

    async def send(self, data: bytes) -> bool:
        try:
            await self.loop.sock_sendall(self.sock, data)
        except OSError:
            return False
        return True

    async def _more(self) -> bool:
        if self.eof:
            return False
        try:
            data = await self.loop.sock_recv(self.sock, 65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def until(self, sep: bytes) -> bytes | None:
        while (i := self.buf.find(sep)) < 0:
            if not await self._more():
                assert not self.buf, f"a partial answer: {bytes(self.buf)!r}"
                return None
        out = bytes(self.buf[: i + len(sep)])
        del self.buf[: i + len(sep)]
        return out

    async def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            assert await self._more(), "the answer was cut short"
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def closed(self, wait_s: float) -> bool:
        """The gateway closes the connection within ``wait_s`` (with nothing more sent)."""
        try:
            more = await asyncio.wait_for(self._more(), wait_s)
        except TimeoutError:
            return False
        assert not more, f"unexpected bytes after the answers: {bytes(self.buf)!r}"
        return True


async def _read_answer(conn: Conn) -> tuple[int, dict[str, str], bytes] | None:
    """One response (``None`` at the end of the connection)."""
    raw = await conn.until(b"\r\n\r\n")
    if raw is None:
        return None
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if status == 100:
        return status, headers, b""
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size_line = await conn.until(b"\r\n")
            assert size_line is not None
            size = int(size_line[:-2], 16)
            data = await conn.exactly(size + 2)
            if size == 0:
                return status, headers, body
            body += data[:-2]
    return status, headers, await conn.exactly(int(headers["content-length"]))


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _conftest() -> Any:
    """The gateway tests' conftest module (tests/ has no packages; pytest loaded it already)."""
    for mod in list(sys.modules.values()):
        if hasattr(mod, "FakeUpstream") and hasattr(mod, "gateway_config") and hasattr(mod, "RunningGateway"):
            return mod
    raise AssertionError("the gateway tests' conftest is not loaded")


@pytest.fixture(scope="module", params=["fast", "aiohttp"])
async def edge_gateway(request: pytest.FixtureRequest, anyio_backend: str) -> Any:
    """One gateway per edge for the whole table (each case opens its own connection and counts
    what the instance received meanwhile)."""
    conftest = _conftest()
    up = conftest.FakeUpstream("up-edge")
    await up.start()
    raw = conftest.gateway_config([up], edge=EDGE)
    raw["listen"]["fast_front"] = request.param == "fast"
    config = parse_config(raw)
    server = GatewayServer(create_app(config), "127.0.0.1", 0, fast=config.listen.fast_front)
    await server.start()
    yield server, up, request.param
    await server.close()
    await up.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_edge_rule(edge_gateway: Any, case: Case) -> None:
    server, up, edge = edge_gateway
    statuses, upstream = case.statuses, case.upstream
    if edge == "aiohttp" and case.on_aiohttp is not None:
        statuses, upstream = case.on_aiohttp
    before = len(up.requests)
    conn = await Conn.open(server.port)
    try:
        for piece in case.send:
            if isinstance(piece, float):
                await asyncio.sleep(piece)
            elif not await conn.send(piece):
                break  # the gateway closed the connection before the client finished
        if case.half_close:
            conn.sock.shutdown(socket.SHUT_WR)
        answers = []
        for _ in statuses:
            answer = await asyncio.wait_for(_read_answer(conn), 5)
            if answer is None:
                break
            answers.append(answer)
        assert [a[0] for a in answers] == list(statuses), answers
        for status, _headers, body in answers:
            if 400 <= status < 500:
                error = json.loads(body)["error"]
                assert set(error) == {"message", "type", "param", "code"}, error
                assert KEY not in body.decode("utf-8", "replace")  # the parser's quote never echoes a key
        assert await conn.closed(3.0 if case.closed else 0.3) is case.closed
        await asyncio.sleep(0.05)  # anything the gateway forwarded has reached the instance
        assert len(up.requests) - before == upstream, up.requests[before:]
    finally:
        conn.sock.close()


def test_the_readme_edge_section_is_the_defaults() -> None:
    """The README's ``edge:`` block is valid and says what the defaults are."""
    import re
    from pathlib import Path

    import yaml

    from tokenplane.gateway.config import EdgeConfig

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)]
    edge = next(b["edge"] for b in blocks if isinstance(b, dict) and "edge" in b)
    assert EdgeConfig.model_validate(edge) == EdgeConfig()
