"""Workflows through the gateway: hints in, spend and outcomes in the ledger, read back per tenant."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.gateway.app import GATEWAY_KEY
from tokenplane.gateway.config import InstanceConfig, LedgerConfig
from tokenplane.gateway.economics import CostModel
from tokenplane.gateway.workflows import has_hints, strip_hints

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "plan the next step of the task"}]


def _wf(workflow_id: str, step: int, total: int | None = 5) -> dict[str, str]:
    h = {"x-tokenplane-workflow-id": workflow_id, "x-tokenplane-step": str(step)}
    if total is not None:
        h["x-tokenplane-total-steps"] = str(total)
    return h


async def _raw(gw: Any, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    data = json.dumps(body).encode() if body is not None else None
    async with gw.http.request(method, gw.url + path, data=data, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def _metrics(gw: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = await gw.get("/metrics")
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_five_step_workflow_with_the_openai_client(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups)
    client = gw.client()
    for step in range(1, 6):
        if step % 2:
            r = await client.chat.completions.create(
                model=names.MODEL, messages=MESSAGES, max_tokens=16, extra_headers=_wf("wf-1", step)
            )
            assert r.choices[0].message.content
        else:
            stream = await client.chat.completions.create(
                model=names.MODEL,
                messages=MESSAGES,
                max_tokens=16,
                stream=True,
                extra_headers=_wf("wf-1", step),
            )
            async for _ in stream:
                pass
        if step < 5:
            status, w = await _raw(gw, "GET", "/v1/workflows/wf-1", names.KEY)
            assert status == 200 and w["outcome"] == "open" and w["max_step"] == step

    w = await gw.get("/v1/workflows/wf-1")
    assert w["object"] == "workflow" and w["id"] == "wf-1"
    assert w["outcome"] == "succeeded" and w["reason"] == "last_step"  # the last step completed
    assert w["attempts"] == 5 and w["failed_attempts"] == 0 and w["total_steps"] == 5
    log = w["attempt_log"]
    assert [a["step"] for a in log] == [1, 2, 3, 4, 5]
    assert all(a["ok"] and a["tokens_out"] == 4 and a["tokens_in"] > 0 for a in log)
    assert w["cost_usd"] > 0
    assert math.isclose(w["cost_usd"], math.fsum(a["cost_usd"] for a in log), rel_tol=1e-12)
    assert w["tokens_out"] == 20

    # The cost is the instances' price at the twin's H100 x llama-3-8b throughput.
    gateway_obj = gw.server.app[GATEWAY_KEY]
    inst = next(u.config for u in gateway_obj.pool.all())
    costs, source = gateway_obj.workflows.costs.costs(inst)
    assert source == "twin"
    expected = sum(a["tokens_in"] * costs.prefill_usd_per_token + 4 * costs.decode_usd_per_token for a in log)
    assert math.isclose(w["cost_usd"], expected, rel_tol=1e-9)

    # The client settles another workflow itself; its outcome and cost read back.
    await client.chat.completions.create(
        model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers=_wf("wf-2", 1)
    )
    status, body = await _raw(gw, "POST", "/v1/workflows/wf-2/outcome", names.KEY, {"outcome": "succeeded"})
    assert status == 200 and body["outcome"] == "succeeded" and body["reason"] == "client"
    w2 = await gw.get("/v1/workflows/wf-2")
    assert w2["outcome"] == "succeeded" and w2["attempts"] == 1 and w2["cost_usd"] > 0

    status, body = await _raw(gw, "POST", "/v1/workflows/wf-2/outcome", names.KEY, {"outcome": "won"})
    assert status == 400 and body["error"]["param"] == "outcome"
    status, body = await _raw(gw, "POST", "/v1/workflows/wf-2/outcome", "sk-wrong", {"outcome": "failed"})
    assert status == 401

    m = await _metrics(gw)
    tasks = {k[1]: v for k, v in m.items() if k[0] == "tokenplane_tasks_total"}
    ok_key = (("model", names.MODEL), ("outcome", "succeeded"), ("tenant", "acme"))
    assert tasks[ok_key] == 2
    cost = m[("tokenplane_cost_usd_total", (("model", names.MODEL), ("tenant", "acme")))]
    assert math.isclose(cost, w["cost_usd"] + w2["cost_usd"], rel_tol=1e-9)
    cpt = m[("tokenplane_cost_per_successful_task_usd", (("tenant", "acme"),))]
    assert math.isclose(cpt, (w["cost_usd"] + w2["cost_usd"]) / 2, rel_tol=1e-9)
    spd = m[("tokenplane_success_per_dollar", (("tenant", "acme"),))]
    assert math.isclose(spd, 1 / cpt, rel_tol=1e-9)
    assert any(k[0] == "tokenplane_time_between_tokens_seconds_count" for k in m)
    assert any(k[0] == "tokenplane_upstream_duration_seconds_count" for k in m)
    e2e = m[("tokenplane_request_e2e_seconds_count", (("model", names.MODEL), ("tenant", "acme")))]
    assert e2e == 6


async def test_sunk_cost_reaches_the_request(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    seen: list[Any] = []
    gateway_obj = gw.server.app[GATEWAY_KEY]
    served = gateway_obj.catalog.resolve(names.MODEL, gateway_obj.auth.authenticate(f"Bearer {names.KEY}"))
    router = served.router

    class Spy:
        """The model's router, seeing each request first (a wrapper: a compiled router's
        methods cannot be replaced on it)."""

        def select(self, info: Any, views: Any, now: float) -> Any:
            seen.append(info)
            return router.select(info, views, now=now)

        def __getattr__(self, name: str) -> Any:
            return getattr(router, name)

    served.router = Spy()
    client = gw.client()
    for step in (1, 2):
        await client.chat.completions.create(
            model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers=_wf("wf-s", step, total=3)
        )
    assert seen[0].workflow.workflow_id == "wf-s" and seen[0].workflow.sunk_cost_usd == 0
    w = await gw.get("/v1/workflows/wf-s")
    step1 = w["attempt_log"][0]["cost_usd"]
    assert seen[1].workflow.step == 2 and math.isclose(seen[1].workflow.sunk_cost_usd, step1)
    plain = await client.chat.completions.create(model=names.MODEL, messages=MESSAGES, max_tokens=4)
    assert plain.choices and seen[2].workflow is None


async def test_tenant_cannot_read_another_tenants_workflow(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    await gw.client().chat.completions.create(
        model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers=_wf("secret", 1)
    )
    status, body = await _raw(gw, "GET", "/v1/workflows/secret", names.KEY)
    assert status == 200 and body["attempts"] == 1

    status, body = await _raw(gw, "GET", "/v1/workflows/secret", names.BATCH_KEY)
    assert status == 404 and body["error"]["code"] == "workflow_not_found"
    status, unknown = await _raw(gw, "GET", "/v1/workflows/never-existed", names.BATCH_KEY)
    assert (
        status == 404
        and unknown["error"]["message"].replace("never-existed", "secret") == body["error"]["message"]
    )  # indistinguishable from a workflow that does not exist
    status, body = await _raw(
        gw, "POST", "/v1/workflows/secret/outcome", names.BATCH_KEY, {"outcome": "failed"}
    )
    assert status == 404
    status, body = await _raw(gw, "GET", "/v1/workflows/secret", names.KEY)
    assert body["outcome"] == "open"  # untouched by the other tenant

    # The same id under the other tenant is a different workflow.
    await gw.client(names.BATCH_KEY).chat.completions.create(
        model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers=_wf("secret", 1, total=1)
    )
    status, theirs = await _raw(gw, "GET", "/v1/workflows/secret", names.BATCH_KEY)
    assert status == 200 and theirs["outcome"] == "succeeded" and theirs["attempts"] == 1
    status, ours = await _raw(gw, "GET", "/v1/workflows/secret", names.KEY)
    assert ours["outcome"] == "open" and ours["attempts"] == 1
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/v1/workflows/secret") as resp:
        assert resp.status == 401


async def test_dynamo_vllm_and_metadata_hints(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    client = gw.client()
    await client.chat.completions.create(
        model=names.MODEL,
        messages=MESSAGES,
        max_tokens=4,
        extra_body={
            "nvext": {"agent_hints": {"priority": 0, "osl": 64}, "agent_context": {"session_id": "dyn-1"}}
        },
    )
    ctx = json.dumps({"session_id": "vllm-1", "step_index": 2, "expected_steps": 2})
    await client.chat.completions.create(
        model=names.MODEL,
        messages=MESSAGES,
        max_tokens=4,
        extra_body={"vllm_xargs": {"agentic_context": ctx}},
    )
    await client.chat.completions.create(
        model=names.MODEL,
        messages=MESSAGES,
        max_tokens=4,
        extra_body={"metadata": {"workflow_id": "md-1", "step": "1", "total_steps": "3", "tag": "x"}},
    )
    sent = ups[0].requests
    assert "nvext" not in sent[0]  # Dynamo's extension is not forwarded
    assert sent[1]["vllm_xargs"] == {"agentic_context": ctx}  # vLLM's own field stays
    assert sent[2]["metadata"] == {"tag": "x"}  # our keys removed, the client's own kept

    dyn = await gw.get("/v1/workflows/dyn-1")
    assert dyn["outcome"] == "open" and dyn["attempts"] == 1  # Dynamo has no step count
    v = await gw.get("/v1/workflows/vllm-1")
    assert v["outcome"] == "succeeded" and v["max_step"] == 2 and v["total_steps"] == 2
    md = await gw.get("/v1/workflows/md-1")
    assert md["outcome"] == "open" and md["total_steps"] == 3


async def test_bad_hints_are_400_with_an_error_body(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    client = gw.client()
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({"x-tokenplane-workflow-id": "w", "x-tokenplane-step": "zero"}, {}, "x-tokenplane-step"),
        ({"x-tokenplane-step": "2"}, {}, "x-tokenplane-step"),
        (_wf("w", 4, total=3), {}, "x-tokenplane-total-steps"),
        ({}, {"vllm_xargs": {"agentic_context": "{not json"}}, "vllm_xargs.agentic_context"),
        ({}, {"metadata": {"workflow_id": "w", "deadline_s": "-1"}}, "metadata.deadline_s"),
    ]
    for headers, body, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(
                model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers=headers, extra_body=body
            )
        assert err.value.status_code == 400
        e = err.value.body
        assert isinstance(e, dict) and e["param"] == param and e["code"] == "invalid_workflow_hint", e
        assert e["type"] == "invalid_request_error" and param in e["message"]
    assert ups[0].requests == []  # refused at the edge
    # The admission header keeps taking class names; it is not a workflow hint.
    r = await client.chat.completions.create(
        model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers={"X-Tokenplane-Priority": "batch"}
    )
    assert r.choices


async def test_terminal_failure_fails_the_workflow_and_costs_its_attempts(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    for u in ups:
        u.mode = "fail"
    gw = await gateway(ups, health={"failures_to_down": 1000})
    client = gw.client()
    with pytest.raises(openai.APIStatusError):
        await client.chat.completions.create(
            model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers=_wf("doomed", 1, total=2)
        )
    w = await gw.get("/v1/workflows/doomed")
    assert w["outcome"] == "failed" and w["reason"].startswith("step_failed:")
    assert w["attempts"] >= 2 and w["failed_attempts"] == w["attempts"]  # the retry is on the bill too
    log = w["attempt_log"]
    assert [a["terminal"] for a in log] == [False] * (len(log) - 1) + [True]
    assert w["cost_usd"] > 0 and math.isclose(w["cost_usd"], w["failed_attempt_cost_usd"])
    m = await _metrics(gw)
    assert (
        m[("tokenplane_tasks_total", (("model", names.MODEL), ("outcome", "failed"), ("tenant", "acme")))]
        == 1
    )


async def test_sqlite_ledger_and_sweep(upstreams, gateway, names, tmp_path) -> None:
    ups = await upstreams(1)
    path = tmp_path / "ledger.sqlite"
    gw = await gateway(ups, ledger={"path": str(path), "abandon_after_s": 0.05})
    await gw.client().chat.completions.create(
        model=names.MODEL, messages=MESSAGES, max_tokens=4, extra_headers=_wf("idle", 1)
    )
    assert path.exists()
    await asyncio.sleep(0.1)
    abandoned = await gw.server.app[GATEWAY_KEY].workflows.sweep()
    assert [w.workflow_id for w in abandoned] == ["idle"]
    w = await gw.get("/v1/workflows/idle")
    assert w["outcome"] == "abandoned" and w["cost_usd"] > 0


def test_hint_detection_and_stripping() -> None:
    assert not has_hints({"Authorization": "x"}, {"model": "m", "messages": []})
    assert not has_hints({"x-tokenplane-priority": "batch"}, {})
    assert has_hints({"x-tokenplane-priority": "-1"}, {})
    assert has_hints({"x-tokenplane-workflow-id": "w"}, {})
    body: dict[str, Any] = {
        "nvext": {},
        "metadata": {"workflow_id": "w"},
        "vllm_xargs": {"agentic_context": {"session_id": "w"}, "k": 1},
    }
    strip_hints(body)
    assert body == {"vllm_xargs": {"k": 1}}


def test_cost_model_sources() -> None:
    cfg = LedgerConfig(prefill_tokens_per_s=1000, decode_tokens_per_s=100)
    model = CostModel(cfg)
    base = {"url": "http://x", "model": "m", "price_per_hour": 3.6}
    own = InstanceConfig(id="a", gpu="H100", prefill_tokens_per_s=500, decode_tokens_per_s=50, **base)
    c, src = model.costs(own)
    assert src == "config" and math.isclose(c.prefill_usd_per_token, 0.001 / 500)
    unknown = InstanceConfig(id="b", gpu="TPU-v9", **base)
    c, src = model.costs(unknown)
    assert src == "default" and math.isclose(model.attempt_cost(unknown, 1000, 100), 0.001 + 0.001)
    twin = InstanceConfig(id="c", gpu="A100", **{**base, "model": "llama-3-8b"})
    assert model.costs(twin)[1] == "twin"


async def test_in_memory_ledger_forgets_old_settled_workflows_but_keeps_counting(
    upstreams, gateway, names
) -> None:
    """``ledger.memory_max_settled``: the gateway's default ledger stays bounded under endless
    traffic; an old workflow reads as 404, the economics on /metrics still count it."""
    ups = await upstreams(1)
    gw = await gateway(ups, ledger={"memory_max_settled": 2})
    client = gw.client()
    costs = []
    for i in range(5):  # prompts of growing length: each task costs more than the one before
        messages = [{"role": "user", "content": "plan the next step " * (1 + 20 * i)}]
        await client.chat.completions.create(
            model=names.MODEL, messages=messages, max_tokens=4, extra_headers=_wf(f"one-{i}", 1, 1)
        )
        status, w = await _raw(gw, "GET", f"/v1/workflows/one-{i}", names.KEY)
        assert status == 200 and w["outcome"] == "succeeded"
        costs.append(w["cost_usd"])
    assert costs == sorted(costs) and costs[0] < costs[-1]
    for i in range(3):
        status, _ = await _raw(gw, "GET", f"/v1/workflows/one-{i}", names.KEY)
        assert status == 404, i
    m = await _metrics(gw)
    cpt = m[("tokenplane_cost_per_successful_task_usd", (("tenant", "acme"),))]
    assert math.isclose(cpt, math.fsum(costs) / 5, rel_tol=1e-9)  # all five, not the two kept
    ok_key = (("model", names.MODEL), ("outcome", "succeeded"), ("tenant", "acme"))
    assert {k[1]: v for k, v in m.items() if k[0] == "tokenplane_tasks_total"}[ok_key] == 5
