"""The baseline for ``gateway_overhead.py``: a bare aiohttp reverse proxy with no parsing at all.

Round-robin over the upstreams, the body passed through as bytes, a JSON answer read and returned,
an SSE answer relayed chunk by chunk as it arrives. Same server and client settings as the gateway
(uvloop, no access log, handler cancellation, unbounded pool, no decompression), so the difference
between the two is the gateway's own work: auth, parsing, routing, accounting, metrics.

With ``--client tokenplane`` the upstream side is tokenplane's own client
(:class:`~tokenplane.gateway.transports.httptools_client.UpstreamClient`, as in the gateway and
the floor), so the
server framework's share of the gateway's cost can be read off: this proxy minus the floor is
aiohttp's server, the gateway minus this proxy is the gateway's own work.

Usage: ``python bench/_bare_proxy.py --port 9100 --upstreams http://127.0.0.1:9001,... [--client tokenplane]``
"""

from __future__ import annotations

import argparse
import itertools
import os

import aiohttp
import uvloop
from _floor_proxy import Upstreams
from aiohttp import web


def make_app(upstreams: list[str]) -> web.Application:
    ring = itertools.cycle(upstreams)
    state: dict[str, aiohttp.ClientSession] = {}

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        url = next(ring) + request.path
        async with state["s"].post(url, data=body, headers={"Content-Type": "application/json"}) as up:
            if up.content_type != "text/event-stream":
                return web.Response(status=up.status, body=await up.read(), content_type=up.content_type)
            out = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            async for data in up.content.iter_any():
                await out.write(data)
            await out.write_eof()
            return out

    async def start(app: web.Application) -> None:
        state["s"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def stop(app: web.Application) -> None:
        await state["s"].close()

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/{tail:.*}", proxy)
    return app


def make_app_own_client(upstreams: list[str]) -> web.Application:
    ups = Upstreams(upstreams)  # the floor's upstream side

    async def proxy(request: web.Request) -> web.StreamResponse:
        up = await ups.post(request.path.encode(), await request.read())
        ctype = up.headers.get("Content-Type", "application/json")
        if "event-stream" not in ctype:
            data = await up.read()
            up.release()
            return web.Response(status=up.status, body=data, content_type="application/json")
        out = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        while data := await up.content.readany():
            await out.write(data)
        up.release()
        await out.write_eof()
        return out

    app = web.Application()
    app.router.add_post("/v1/{tail:.*}", proxy)
    return app


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstreams", required=True)
    p.add_argument("--cpu", type=int, default=None)
    p.add_argument("--client", choices=("aiohttp", "tokenplane"), default="aiohttp")
    a = p.parse_args()
    if a.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {a.cpu})
    web.run_app(
        (make_app if a.client == "aiohttp" else make_app_own_client)(a.upstreams.split(",")),
        host="127.0.0.1",
        port=a.port,
        loop=uvloop.new_event_loop(),
        handler_cancellation=True,
        access_log=None,
        print=lambda *_: print("ready", flush=True),
    )
