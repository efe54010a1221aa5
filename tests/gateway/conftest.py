"""Real servers on loopback ports: fake OpenAI-speaking upstreams, and the gateway in front of them.

A :class:`FakeUpstream` is a small aiohttp app that answers chat and text completions (JSON and SSE,
with ``stream_options.include_usage``), publishes vLLM-style ``/metrics`` and ``/health``, records
what it received, and can be told to fail, hang, drop a stream, send a malformed event, or go
unhealthy. It records a client disconnect (its handler is cancelled when the gateway closes the
connection). The gateway runs under :class:`~tokenplane.gateway.server.GatewayServer` (the fast front for the
completion routes, aiohttp behind it, handler cancellation on), as ``serve`` runs it; a few test
files start ``aiohttp.test_utils.TestServer`` themselves, which keeps aiohttp's own path covered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import msgspec
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tokenplane.gateway import create_app, hash_key, parse_config
from tokenplane.gateway.server import GatewayServer

KEY = "sk-test-acme"
BATCH_KEY = "sk-test-batch"
MODEL = "llama-3-8b"
ALIAS = "gpt-4o-mini"
OTHER_MODEL = "qwen-small"
UPSTREAM_MODEL = "served-llama"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def names() -> SimpleNamespace:
    """The fixed names the configs use (tests/ has no packages, so they travel as a fixture)."""
    return SimpleNamespace(
        KEY=KEY,
        BATCH_KEY=BATCH_KEY,
        MODEL=MODEL,
        ALIAS=ALIAS,
        OTHER_MODEL=OTHER_MODEL,
        UPSTREAM_MODEL=UPSTREAM_MODEL,
        gateway_config=gateway_config,
    )


@dataclass
class FakeMetrics:
    running: float = 0
    waiting: float = 0
    kv_usage: float = 0.0
    prefix_queries: float = 0
    prefix_hits: float = 0


@dataclass
class FakeUpstream:
    """One fake instance. ``mode``: ok | fail (500) | reject (400 JSON) | hang | drop | malformed."""

    name: str
    mode: str = "ok"
    tokens: int = 4
    token_text: str | None = None  # each streamed token's text is f"{i}:{token_text}" (default "tok ")
    token_delay_s: float = 0.0
    answer_delay_s: float = 0.0  # before the response headers (a plain answer's whole generation)
    plain_delay_s: float = 0.0  # the same, for plain (non-stream) answers only
    healthy: bool = True
    health_delay_s: float = 0.0  # a busy runtime's HTTP loop: slow to answer /health
    metrics_delay_s: float = 0.0  # ... and /metrics
    metrics: FakeMetrics = field(default_factory=FakeMetrics)
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw_requests: list[bytes] = field(default_factory=list)  # the bodies as they came
    disconnects: int = 0
    events_written: int = 0  # streamed token events whose write returned
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        return app

    async def start(self) -> None:
        self.server = TestServer(self.app(), host="127.0.0.1", port=0)
        await self.server.start_server()

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_delay_s:
            await asyncio.sleep(self.health_delay_s)
        return web.Response(status=200 if self.healthy else 503, text="ok" if self.healthy else "down")

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_delay_s:
            await asyncio.sleep(self.metrics_delay_s)
        m = self.metrics
        lab = f'{{engine="0",model_name="{UPSTREAM_MODEL}"}}'
        text = (
            "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{lab} {m.running}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{lab} {m.waiting}\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{lab} {m.kv_usage}\n"
            "# TYPE vllm:prefix_cache_queries counter\n"
            f"vllm:prefix_cache_queries_total{lab} {m.prefix_queries}\n"
            f"vllm:prefix_cache_queries_created{lab} 1.7e9\n"
            "# TYPE vllm:prefix_cache_hits counter\n"
            f"vllm:prefix_cache_hits_total{lab} {m.prefix_hits}\n"
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1"}} 3.0\n'
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf"}} 4.0\n'
            f'vllm:time_to_first_token_seconds_count{{engine="0"}} 4.0\n'
            f'vllm:time_to_first_token_seconds_sum{{engine="0"}} 0.5\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, chat=False)

    def _choice(self, chat: bool, text: str, finish: str | None, first: bool) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta["role"] = "assistant"
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

    async def _answer(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        raw = await request.read()
        self.raw_requests.append(raw)
        body = msgspec.json.decode(raw)
        self.requests.append(body)
        model = body.get("model")
        if self.mode == "fail":
            return web.json_response({"error": {"message": "engine dead"}}, status=500)
        if self.mode == "reject":
            err = {"message": "bad stop", "type": "BadRequestError", "param": "stop", "code": 400}
            return web.json_response({"error": err}, status=400)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.answer_delay_s:
            await asyncio.sleep(self.answer_delay_s)
        if self.plain_delay_s and not body.get("stream"):
            await asyncio.sleep(self.plain_delay_s)
        usage = {"prompt_tokens": 7, "completion_tokens": self.tokens, "total_tokens": 7 + self.tokens}
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            text = "tok " * self.tokens
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
            )
            return web.json_response(
                {
                    "id": f"{self.name}-1",
                    "object": kind,
                    "created": 0,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"
        try:
            for i in range(self.tokens):
                if self.mode == "drop" and i == 2:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if self.mode == "malformed" and i == 2:
                    await resp.write(b"data: {this is not json\n\n")
                    continue
                finish = "stop" if i == self.tokens - 1 else None
                text = "tok " if self.token_text is None else f"{i}:{self.token_text}"
                chunk = {
                    "id": f"{self.name}-1",
                    "object": chunk_kind,
                    "created": 0,
                    "model": model,
                    "choices": [self._choice(chat, text, finish, i == 0)],
                }
                await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
                self.events_written += 1
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
            if (body.get("stream_options") or {}).get("include_usage"):
                chunk = {
                    "id": f"{self.name}-1",
                    "object": chunk_kind,
                    "created": 0,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
                await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1
            self.disconnected.set()
            raise
        return resp


def gateway_config(
    upstreams: list[FakeUpstream],
    *,
    router: Any = "prefix-affinity",
    limits: dict[str, Any] | None = None,
    extra_model: bool = False,
    health: dict[str, Any] | None = None,
    scrape: dict[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A gateway config over ``upstreams``; ``sections`` (retry, breaker, admission...) go in as given."""
    models: list[dict[str, Any]] = [
        {"name": MODEL, "aliases": [ALIAS, "llama3"], "router": router, "upstream_model": UPSTREAM_MODEL}
    ]
    if extra_model:
        models.append({"name": OTHER_MODEL})
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "limits": {
            "max_body_bytes": 64 * 1024,
            "max_tokens": 4096,
            "max_prompt_tokens": 8192,
            **(limits or {}),
        },
        "tenants": [
            {"name": "acme", "priority": "interactive", "api_keys": [hash_key(KEY)], "max_concurrency": 64},
            {
                "name": "batchco",
                "priority": "batch",
                "api_keys": [hash_key(BATCH_KEY)],
                "max_concurrency": 1,
                "models": [MODEL],
            },
        ],
        "models": models,
        "instances": [
            {"id": u.name, "url": u.url, "model": MODEL, "kind": "vllm", "gpu": "H100", "price_per_hour": 2.5}
            for u in upstreams
        ],
        "scrape": {"interval_s": 0.05, **(scrape or {})},
        "health": {"interval_s": 0.05, "failures_to_down": 2, **(health or {})},
        **sections,
    }


@dataclass
class RunningGateway:
    server: GatewayServer
    http: aiohttp.ClientSession
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def client(self, key: str = KEY) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=10)
        self.clients.append(client)
        return client

    async def post(
        self, path: str, body: Any = None, *, key: str | None = KEY, raw: bytes | None = None
    ) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        data = raw if raw is not None else msgspec.json.encode(body)
        async with self.http.post(self.url + path, data=data, headers=headers) as resp:
            text = await resp.read()
            try:
                parsed = msgspec.json.decode(text)
            except msgspec.DecodeError:
                parsed = text
            return resp.status, parsed, resp.headers

    async def get(self, path: str, *, key: str | None = KEY) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        async with self.http.get(self.url + path, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            if resp.content_type == "application/json":
                return await resp.json()
            return await resp.text()

    async def instances(self) -> dict[str, dict[str, Any]]:
        data = await self.get("/v1/instances")
        return {d["instance_id"]: d for d in data["data"]}


@pytest.fixture
async def upstreams(anyio_backend: str) -> AsyncIterator[Callable[[int], Awaitable[list[FakeUpstream]]]]:
    started: list[FakeUpstream] = []

    async def make(n: int) -> list[FakeUpstream]:
        out = []
        for _ in range(n):
            u = FakeUpstream(f"up-{len(started)}")
            await u.start()
            started.append(u)
            out.append(u)
        return out

    yield make
    for u in started:
        await u.close()


@pytest.fixture
async def gateway(anyio_backend: str) -> AsyncIterator[Callable[..., Awaitable[RunningGateway]]]:
    running: list[RunningGateway] = []

    async def make(upstreams: list[FakeUpstream], **kwargs: Any) -> RunningGateway:
        config = parse_config(gateway_config(upstreams, **kwargs))
        server = GatewayServer(create_app(config), "127.0.0.1", 0)
        await server.start()
        gw = RunningGateway(server, aiohttp.ClientSession())
        running.append(gw)
        return gw

    yield make
    for gw in running:
        for client in gw.clients:
            await client.close()
        await gw.http.close()
        with contextlib.suppress(Exception):
            await gw.server.close()


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` until true (the gateway's background loops run every 50 ms here)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def wait() -> Callable[..., Awaitable[None]]:
    return wait_for


# --- Emulated instances (tokenplane.emulator, in-process) for the resilience tests ------------------


@dataclass
class EmulatedUpstream:
    """One in-process emulator: ``name`` is its instance id in the gateway config."""

    name: str
    url: str
    runner: Any
    http: aiohttp.ClientSession
    settings: Any

    async def faults(self, **body: Any) -> dict[str, Any]:
        async with self.http.post(self.url + "/admin/faults", json=body) as r:
            assert r.status == 200, await r.text()
            data: dict[str, Any] = await r.json()
            return data

    async def success_total(self) -> float:
        """``vllm:request_success_total`` over every finish reason (abort included)."""
        async with self.http.get(self.url + "/metrics") as r:
            text = await r.text()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:request_success_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def emulated_config(emus: list[EmulatedUpstream], *, router: Any = "round-robin", **sections: Any) -> dict:
    tenants = sections.pop("tenants", None) or [
        {"name": "acme", "priority": "interactive", "api_keys": [hash_key(KEY)]},
        {"name": "batchco", "priority": "batch", "api_keys": [hash_key(BATCH_KEY)]},
    ]
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "tenants": tenants,
        "models": [{"name": MODEL, "router": router, **sections.pop("model", {})}],
        "instances": [
            {"id": e.name, "url": e.url, "model": MODEL, "kind": "emulated", **sections.pop("instance", {})}
            for e in emus
        ],
        "scrape": {"interval_s": 0.05},
        "health": {"interval_s": 0.05, "failures_to_down": 1000},
        **sections,
    }


@pytest.fixture
async def emulators(anyio_backend: str) -> AsyncIterator[Callable[..., Awaitable[list[EmulatedUpstream]]]]:
    from tokenplane.emulator import EmulatorSettings, start_emulator

    started: list[EmulatedUpstream] = []
    http = aiohttp.ClientSession()

    async def make(n: int, **settings: Any) -> list[EmulatedUpstream]:
        settings.setdefault("speed", 50.0)
        settings.setdefault("fixed_step_s", 0.02)
        out = []
        for _ in range(n):
            s = EmulatorSettings(**settings, instance_id=f"emu-{len(started)}")
            runner, url = await start_emulator(s)
            e = EmulatedUpstream(f"emu-{len(started)}", url, runner, http, s)
            started.append(e)
            out.append(e)
        return out

    yield make
    for e in started:
        await e.runner.cleanup()
    await http.close()


@pytest.fixture
async def emu_gateway(anyio_backend: str) -> AsyncIterator[Callable[..., Awaitable[RunningGateway]]]:
    running: list[RunningGateway] = []

    async def make(emus: list[EmulatedUpstream], **kwargs: Any) -> RunningGateway:
        config = parse_config(emulated_config(emus, **kwargs))
        server = GatewayServer(create_app(config), "127.0.0.1", 0)
        await server.start()
        gw = RunningGateway(server, aiohttp.ClientSession())
        running.append(gw)
        return gw

    yield make
    for gw in running:
        for client in gw.clients:
            await client.close()
        await gw.http.close()
        with contextlib.suppress(Exception):
            await gw.server.close()
