"""Found by ``fuzz/fuzz_sse_scanner.py``: a continuation whose instance sends an event that looks
like a JSON object to the scanner (``data: {...}``) but is not JSON made the splicer's rewrite
raise (``msgspec.DecodeError``) out of the relay. The stream must instead end like any other
malformed upstream stream: the delivered text, then an OpenAI-style error event, and the gateway
goes on serving."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

pytestmark = pytest.mark.anyio


@dataclass
class SplicingUpstream:
    """The first stream request breaks off after two tokens; every later one (the continuations)
    sends one token, then an event whose braces hold no JSON."""

    name: str
    shared: dict[str, int]
    server: TestServer | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._health)
        self.server = TestServer(app, host="127.0.0.1", port=0)
        await self.server.start_server()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.shared["n"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        def event(content: str) -> bytes:
            choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
            obj = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
            return b"data: " + json.dumps({**obj, "choices": [choice]}).encode() + b"\n\n"

        if self.shared["n"] == 1:
            await resp.write(event("one ") + event("two "))
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(event("three "))
        await resp.write(b'data: {"choices": [,]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def test_a_continuation_with_a_non_json_event_ends_with_an_error_event(gateway, names) -> None:
    shared = {"n": 0}
    ups = [SplicingUpstream(f"up-{i}", shared) for i in range(2)]
    for u in ups:
        await u.start()
    try:
        gw = await gateway(ups, router="round-robin")
        body = {"model": names.MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {names.KEY}"}
        async with gw.http.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
            raw = await r.read()
        events = [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
        assert events, raw
        decoded = [json.loads(e) for e in events if e != b"[DONE]"]
        text = "".join(
            c["delta"].get("content", "") for d in decoded for c in d.get("choices", ()) if "delta" in c
        )
        assert text.startswith("one two three "), text
        assert "error" in decoded[-1], decoded[-1]
        assert decoded[-1]["error"]["message"], decoded[-1]
        assert shared["n"] >= 2  # the continuation did run
        # and the gateway goes on serving
        async with gw.http.get(gw.url + "/v1/models", headers=headers) as r:
            assert r.status == 200
    finally:
        for u in ups:
            assert u.server is not None
            await u.server.close()
