"""Found by ``fuzz/fuzz_request_parser.py`` (the fast front against aiohttp's parser): the front
served an HTTP/1.1 request with no ``Host`` (RFC 9112 3.2: 400), and requests repeating a header
aiohttp takes once (``Content-Type``, ``Host``...), which aiohttp answers 400. Such a request now
goes to aiohttp like any other the front does not read, so both edges answer it the same, and no
instance ever sees it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytestmark = pytest.mark.anyio


def _request(names: Any, head_lines: str) -> bytes:
    body = json.dumps({"model": names.MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\n{head_lines}Authorization: Bearer {names.KEY}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _status(port: int, raw: bytes) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        server = next(
            (line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("server:")), ""
        )
        return int(lines[0].split(" ")[1]), server
    finally:
        writer.close()


@pytest.mark.parametrize(
    "head_lines",
    [
        "",  # no Host
        "Host: gw\r\nHost: other\r\n",
        "Host: gw\r\nContent-Type: application/json\r\nContent-Type: text/plain\r\n",
        "Host: gw\r\nUser-Agent: a\r\nuser-agent: b\r\n",
    ],
    ids=["no-host", "two-hosts", "two-content-types", "two-user-agents"],
)
async def test_the_edges_agree_on_a_head_aiohttp_refuses(upstreams, gateway, names, head_lines: str) -> None:
    [up] = await upstreams(1)
    gw = await gateway([up])
    status, server = await _status(gw.server.port, _request(names, head_lines))
    assert status == 400
    assert server != "tokenplane"  # aiohttp's answer, not the front's
    assert up.requests == []
    # the same request in the fast shape is served by the front
    ok = "Host: gw\r\nContent-Type: application/json\r\nUser-Agent: a\r\n"
    status, server = await _status(gw.server.port, _request(names, ok))
    assert (status, server) == (200, "tokenplane")
    assert len(up.requests) == 1
