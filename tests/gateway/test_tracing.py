"""OpenTelemetry spans per request: the tree for a streamed, continued request, the trace context sent
to the instances and taken from the client, and export over OTLP/HTTP to a (fake) collector."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tokenplane.gateway import create_app, parse_config
from tokenplane.gateway.app import GATEWAY_KEY
from tokenplane.gateway.config import TracingConfig
from tokenplane.gateway.tracing import Tracing, otlp_traces_url

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello there"}]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"


def _conftest() -> Any:
    """The gateway tests' conftest module (tests/ has no packages; pytest loaded it already)."""
    for mod in list(sys.modules.values()):
        if hasattr(mod, "FakeUpstream") and hasattr(mod, "gateway_config") and hasattr(mod, "RunningGateway"):
            return mod
    raise AssertionError("the gateway tests' conftest is not loaded")


@pytest.fixture
async def traced(anyio_backend: str) -> AsyncIterator[Any]:
    """Fake upstreams that record ``traceparent``, and a gateway over them with an in-memory exporter."""
    conftest = _conftest()
    started: list[Any] = []
    servers: list[TestServer] = []
    http = aiohttp.ClientSession()

    async def make(modes: list[str], **sections: Any) -> tuple[Any, list[Any], InMemorySpanExporter, str]:
        ups = []
        for i, mode in enumerate(modes):
            u = _traced_upstream(conftest.FakeUpstream)(f"up-{i}", mode=mode, tokens=6)
            await u.start()
            started.append(u)
            ups.append(u)
        config = parse_config(conftest.gateway_config(ups, router="round-robin", **sections))
        app = create_app(config)
        exporter = InMemorySpanExporter()
        app[GATEWAY_KEY].tracing = Tracing(TracingConfig(service_name="test-gw"), exporter=exporter)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return server, ups, exporter, str(server.make_url("")).rstrip("/")

    yield make, http
    await http.close()
    for s in servers:
        with contextlib.suppress(Exception):
            await s.close()
    for u in started:
        await u.close()


def _traced_upstream(base: type) -> type:
    class TracedUpstream(base):  # type: ignore[misc,valid-type]
        async def _answer(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
            self.traceparents = [*getattr(self, "traceparents", []), request.headers.get("traceparent")]
            return await super()._answer(request, chat=chat)

    return TracedUpstream


async def _stream(http: aiohttp.ClientSession, url: str, key: str, headers: dict[str, str]) -> str:
    body = {"model": "llama-3-8b", "messages": MESSAGES, "stream": True, "max_tokens": 6}
    h = {"Authorization": f"Bearer {key}", **headers}
    async with http.post(url + "/v1/chat/completions", json=body, headers=h) as resp:
        assert resp.status == 200
        return (await resp.read()).decode()


async def test_span_tree_of_a_streamed_continued_request(traced, names) -> None:
    make, http = traced
    _server, ups, exporter, url = await make(["drop", "ok"])  # round-robin: up-0 first, drops at 2
    parent = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"
    text = await _stream(http, url, names.KEY, {"traceparent": parent, "x-tokenplane-workflow-id": "wf-t"})
    # 2 tokens from up-0, then the continuation's 6 (the fake ignores the shrunk max_tokens).
    assert text.count("tok ") == 8 and text.rstrip().endswith("data: [DONE]")

    spans = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (root,) = by_name["POST /v1/chat/completions"]
    assert root.kind is SpanKind.SERVER
    # The client's trace context is continued.
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_PARENT
    assert root.attributes["tokenplane.tenant"] == "acme"
    assert root.attributes["tokenplane.model"] == "llama-3-8b"
    assert root.attributes["tokenplane.workflow.id"] == "wf-t"
    assert root.attributes["tokenplane.outcome"] == "ok"
    assert root.resource.attributes["service.name"] == "test-gw"

    children = [s for s in spans if s is not root]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in children)
    assert all(s.context.trace_id == root.context.trace_id for s in children)
    names_in_order = [s.name for s in sorted(children, key=lambda s: s.start_time)]
    assert names_in_order == [
        "tokenplane.authenticate",
        "tokenplane.admission",
        "tokenplane.route",
        "tokenplane.upstream",
        "tokenplane.route",
        "tokenplane.continuation",
    ]
    (auth,) = by_name["tokenplane.authenticate"]
    assert auth.attributes["tokenplane.tenant"] == "acme"
    (adm,) = by_name["tokenplane.admission"]
    assert adm.attributes["tokenplane.queue_wait_s"] >= 0
    assert adm.attributes["tokenplane.priority"] == "interactive"
    r1, r2 = sorted(by_name["tokenplane.route"], key=lambda s: s.start_time)
    assert r1.attributes["tokenplane.instance"] == "up-0" and r1.attributes["tokenplane.route.reason"]
    assert r2.attributes["tokenplane.instance"] == "up-1"
    (first,) = by_name["tokenplane.upstream"]
    (cont,) = by_name["tokenplane.continuation"]
    assert first.kind is SpanKind.CLIENT and cont.kind is SpanKind.CLIENT
    assert first.attributes["tokenplane.instance"] == "up-0"
    assert first.attributes["tokenplane.attempt.kind"] == "first"
    assert first.attributes["tokenplane.attempt.number"] == 1
    assert first.attributes["tokenplane.tokens.output"] == 2
    assert first.status.status_code is StatusCode.ERROR
    assert cont.attributes["tokenplane.instance"] == "up-1"
    assert cont.attributes["tokenplane.attempt.kind"] == "continuation"
    assert cont.attributes["tokenplane.attempt.number"] == 2
    assert cont.attributes["tokenplane.tokens.output"] == 6
    assert cont.attributes["tokenplane.cost_usd"] > 0
    assert cont.status.status_code is not StatusCode.ERROR

    # Each instance got the trace context of its own attempt's span.
    for up, span in ((ups[0], first), (ups[1], cont)):
        (tp,) = up.traceparents
        assert tp == f"00-{CLIENT_TRACE}-{format(span.context.span_id, '016x')}-01"


async def test_failed_request_ends_its_spans_with_error(traced, names) -> None:
    make, http = traced
    _server, ups, exporter, url = await make(["fail"], health={"failures_to_down": 1000})
    body = {"model": "llama-3-8b", "messages": MESSAGES, "max_tokens": 4}
    async with http.post(
        url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {names.KEY}"}
    ) as resp:
        assert resp.status >= 500
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "POST /v1/chat/completions")
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["http.response.status_code"] == resp.status
    attempts = [s for s in spans if s.name == "tokenplane.upstream"]
    assert attempts and all(s.status.status_code is StatusCode.ERROR for s in attempts)
    assert [s.attributes["tokenplane.attempt.number"] for s in attempts] == list(range(1, len(attempts) + 1))
    assert all(tp is not None and tp.startswith("00-") for tp in ups[0].traceparents)
    # A request without a client traceparent starts a new trace; every span belongs to it.
    assert len({s.context.trace_id for s in spans}) == 1 and root.parent is None

    # Unauthenticated: the request span and an ended authenticate span, with error status.
    exporter.clear()
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 401
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["POST /v1/chat/completions", "tokenplane.authenticate"]
    assert all(s.status.status_code is StatusCode.ERROR for s in spans)


async def test_tracing_off_by_default_and_no_traceparent_sent(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    assert gw.server.app[GATEWAY_KEY].tracing is None
    await gw.client().chat.completions.create(model=names.MODEL, messages=MESSAGES, max_tokens=4)
    assert len(ups[0].requests) == 1


def test_otlp_url() -> None:
    assert otlp_traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert otlp_traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert otlp_traces_url("http://c:4318/custom/path") == "http://c:4318/custom/path"


async def test_otlp_export_to_a_collector(upstreams, names) -> None:
    received: list[tuple[str, str, int]] = []
    got = asyncio.Event()

    async def traces(request: web.Request) -> web.Response:
        data = await request.read()
        received.append((request.path, request.headers.get("Content-Type", ""), len(data)))
        got.set()
        return web.Response(status=200, body=b"", content_type="application/x-protobuf")

    collector_app = web.Application()
    collector_app.router.add_post("/v1/traces", traces)
    collector = TestServer(collector_app, host="127.0.0.1", port=0)
    await collector.start_server()
    conftest = _conftest()
    ups = await upstreams(1)
    endpoint = str(collector.make_url("")).rstrip("/")
    config = parse_config(
        conftest.gateway_config(ups, tracing={"otlp_endpoint": endpoint, "service_name": "gw-otlp"})
    )
    app = create_app(config)
    assert app[GATEWAY_KEY].tracing is not None
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                str(server.make_url("/v1/chat/completions")),
                json={"model": names.MODEL, "messages": MESSAGES, "max_tokens": 4},
                headers={"Authorization": f"Bearer {names.KEY}"},
            ) as resp,
        ):
            assert resp.status == 200
    finally:
        await server.close()  # shuts the tracer down: the batch is flushed to the collector
    await asyncio.wait_for(got.wait(), 10)
    await collector.close()
    assert received[0][0] == "/v1/traces"
    assert received[0][1] == "application/x-protobuf" and received[0][2] > 0
