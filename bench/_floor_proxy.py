"""The floor for ``gateway_overhead.py``: the least a Python reverse proxy can spend per request.

A raw asyncio protocol server (requests parsed by httptools) in front of tokenplane's own upstream
client (:class:`tokenplane.gateway.transports.httptools_client.UpstreamClient`), round-robin, no parsing, no
policy. It shows what the transport costs on this machine, so the gateway's figure splits into
server framework, client and tokenplane's own stages. It is a measuring stick, not a server: one
request at a time per connection (the load generator's pattern), no body limit, no errors mapped.

Usage: ``python bench/_floor_proxy.py --port 9100 --upstreams http://127.0.0.1:9001,...``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from urllib.parse import urlsplit

import httptools
import uvloop

from tokenplane.gateway.transports.httptools_client import UpstreamClient, UpstreamResponse

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Upstreams:
    """Round-robin over the upstreams through tokenplane's own client (also ``_bare_proxy.py
    --client tokenplane``'s upstream side)."""

    def __init__(self, upstreams: list[str]) -> None:
        parts = [urlsplit(u) for u in upstreams]
        self.ring = itertools.cycle([(p.hostname or "127.0.0.1", p.port or 80) for p in parts])
        self.client = UpstreamClient(connect_timeout_s=None, read_timeout_s=None)

    async def post(self, path: bytes, body: bytes) -> UpstreamResponse:
        host, port = next(self.ring)
        head = b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n" % (
            path, host.encode(), port
        )  # fmt: skip
        return await self.client.post(host, port, head, body, None, headers_timeout_s=None)


class _Proxy(Upstreams):
    async def handle(self, transport: asyncio.Transport, path: bytes, body: bytes) -> None:
        up = await self.post(path, body)
        ctype = up.headers.get("Content-Type", "application/json").encode()
        if b"event-stream" not in ctype:
            data = await up.read()
            up.release()
            transport.write(
                b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (up.status, ctype, len(data), data)
            )
            return
        transport.write(SSE_HEAD)
        while data := await up.content.readany():
            transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        transport.write(b"0\r\n\r\n")
        up.release()


class _Connection(asyncio.Protocol):
    def __init__(self, proxy: _Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.path = b""
        self.body: list[bytes] = []
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.path += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path, body = self.path, b"".join(self.body)
        self.path, self.body = b"", []
        self.task = asyncio.get_running_loop().create_task(self.proxy.handle(self.transport, path, body))


async def _main(port: int, upstreams: list[str]) -> None:
    proxy = _Proxy(upstreams)
    server = await asyncio.get_running_loop().create_server(
        lambda: _Connection(proxy), "127.0.0.1", port, backlog=4096
    )
    print("ready", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstreams", required=True)
    a = p.parse_args()
    uvloop.run(_main(a.port, a.upstreams.split(",")))
