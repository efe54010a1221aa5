"""The KV working-set limit at the gateway: a new task waits while the tasks in progress fill the
pool's KV cache; steps of started tasks always go; a task leaves when its last step completes, when
its outcome is posted, or when a step fails."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.core.task_admission import KvWorkingSetLimit
from tokenplane.core.views import RequestInfo, WorkflowContext
from tokenplane.gateway.app import GATEWAY_KEY, create_app
from tokenplane.gateway.config import parse_config
from tokenplane.gateway.working_set import InMemoryWorkingSet

pytestmark = pytest.mark.anyio

PROMPT = "x" * 2400  # about 600 tokens: with max_tokens 50, one task's context is about 650


def _wf(workflow_id: str, step: int, total: int = 3) -> dict[str, str]:
    return {
        "x-tokenplane-workflow-id": workflow_id,
        "x-tokenplane-step": str(step),
        "x-tokenplane-total-steps": str(total),
    }


@pytest.fixture
async def limited(upstreams, names):
    servers: list[TestServer] = []

    async def make(kv_tokens: int = 1000, fraction: float = 0.5) -> Any:
        ups = await upstreams(2)
        raw = names.gateway_config(ups)
        raw["models"][0]["kv_working_set_fraction"] = fraction
        for inst in raw["instances"]:
            inst["kv_capacity_tokens"] = kv_tokens
        app = create_app(parse_config(raw))
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return server, app[GATEWAY_KEY]

    yield make
    for s in servers:
        await s.close()


async def _post(server: TestServer, names: Any, headers: dict[str, str]) -> Any:
    body = {"model": names.MODEL, "prompt": PROMPT, "max_tokens": 50}
    auth = {"Authorization": f"Bearer {names.KEY}", **headers}
    async with (
        aiohttp.ClientSession() as http,
        http.post(server.make_url("/v1/completions"), json=body, headers=auth) as r,
    ):
        return r.status, dict(r.headers), await r.json(content_type=None)


async def test_new_tasks_wait_while_started_ones_fill_the_cache(limited, names) -> None:
    server, gw = await limited()  # budget: 0.5 x (2 x 1000) = 1000 tokens, one task is about 650
    assert (await _post(server, names, _wf("a", 1)))[0] == 200
    status, headers, body = await _post(server, names, _wf("b", 1))
    assert status == 429 and body["error"]["code"] == "kv_working_set" and "Retry-After" in headers
    assert body["error"]["type"] == "rate_limit_error"
    assert (await _post(server, names, _wf("a", 2)))[0] == 200  # a started task is never refused
    async with aiohttp.ClientSession() as http, http.get(server.make_url("/metrics")) as r:
        gauges = {
            s.name: s.value
            for f in text_string_to_metric_families(await r.text())
            if f.name.startswith("tokenplane_working_set")
            for s in f.samples
        }
    assert (
        gauges["tokenplane_working_set_tasks"] == 1 and gauges["tokenplane_working_set_budget_tokens"] == 1000
    )
    assert 600 < gauges["tokenplane_working_set_tokens"] <= 1000
    no_hints = await _post(server, names, {})
    assert no_hints[0] == 200  # a request with no workflow reuses nothing: not limited
    assert (await _post(server, names, _wf("a", 3)))[0] == 200  # the last step: a leaves
    assert gw.working_set.active(names.MODEL) == 0
    assert (await _post(server, names, _wf("b", 1)))[0] == 200
    assert (await _post(server, names, _wf("c", 1)))[0] == 429
    async with aiohttp.ClientSession() as http:
        url = server.make_url("/v1/workflows/b/outcome")
        auth = {"Authorization": f"Bearer {names.KEY}"}
        async with http.post(url, data=json.dumps({"outcome": "abandoned"}), headers=auth) as r:
            assert r.status == 200, await r.text()
        assert (await _post(server, names, _wf("c", 1)))[0] == 200  # b's outcome freed its share
        async with http.get(server.make_url("/metrics")) as r:
            text = await r.text()
    rejected = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "tokenplane_rejected"
        for s in f.samples
        if s.name.endswith("_total")
    }
    assert rejected.get("kv_working_set") == 2


async def test_unknown_capacity_fails_open(limited, names) -> None:
    server, _ = await limited(kv_tokens=0)
    for wid in ("a", "b", "c"):
        assert (await _post(server, names, _wf(wid, 1)))[0] == 200


def _req(wid: str, step: int, prompt: int, tenant: str = "t") -> RequestInfo:
    return RequestInfo(
        f"{wid}-{step}",
        "m",
        prompt_tokens=prompt,
        max_output_tokens=100,
        tenant=tenant,
        workflow=WorkflowContext(wid, step=step, total_steps=5),
    )


def test_in_memory_working_set_learns_growth_and_expires() -> None:
    ws = InMemoryWorkingSet(idle_ttl_s=60)
    limit = KvWorkingSetLimit(0.8)
    ws.observe("m", _req("a", 1, 1000), limit, now=0)
    assert ws.total("m", now=0) == 1100 and ws.growth("m") == 0
    ws.observe("m", _req("a", 2, 2000), limit, now=10)  # the context grew by 1000 in one step
    assert ws.growth("m") == 1000
    assert ws.total("m", now=10) == 2100 + 3 * 1000  # re-projected: 3 steps still to come
    ws.observe("m", _req("a", 1, 1000, tenant="u"), limit, now=10)  # another tenant's "a"
    assert ws.active("m") == 2
    ws.drop("m", "t", "a")
    assert ws.active("m") == 1 and ws.total("m", now=10) == 1100 + 4 * 1000
    assert ws.total("m", now=100) == 0  # idle past the TTL: dropped
    assert ws.total("other", now=0) == 0
    with pytest.raises(ValueError):
        InMemoryWorkingSet(idle_ttl_s=0)


def test_a_task_seen_again_outlives_one_seen_later_but_idle_since() -> None:
    ws = InMemoryWorkingSet(idle_ttl_s=60)
    limit = KvWorkingSetLimit(0.8)
    ws.observe("m", _req("a", 1, 1000), limit, now=0)
    ws.observe("m", _req("b", 1, 1000), limit, now=10)
    ws.observe("m", _req("a", 2, 1000), limit, now=50)  # "a" is back; "b" has been idle since 10
    a_only = ws.total("m", now=50) - 1100
    assert ws.total("m", now=75) == a_only and ws.active("m") == 1
    assert ws.total("m", now=111) == 0


async def test_limit_reads_the_cache_size_the_instances_publish(emulators, emu_gateway, names, wait) -> None:
    """No ``kv_capacity_tokens`` in config: the pool's size comes from each emulated instance's
    ``vllm:cache_config_info`` (2 x 1024 tokens, budget 1024), and a second new task waits."""
    emus = await emulators(2, kv_capacity_tokens=1024)
    gw = await emu_gateway(emus, models=[{"name": names.MODEL, "kv_working_set_fraction": 0.5}])

    async def scraped() -> bool:
        return all(i["kv_capacity_tokens"] == 1024 for i in (await gw.instances()).values())

    await wait(scraped)
    client = gw.client().with_options(max_retries=0)

    async def start(wid: str) -> int:
        try:
            await client.completions.create(
                model=names.MODEL, prompt=PROMPT, max_tokens=50, extra_headers=_wf(wid, 1)
            )
        except openai.APIStatusError as e:
            return e.status_code
        return 200

    assert await start("a") == 200
    assert await start("b") == 429
