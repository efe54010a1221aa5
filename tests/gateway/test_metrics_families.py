"""After traffic, `/metrics` carries every family the control loop and people read, with sane values."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"
PROMPT = "the quick brown fox jumps over the lazy dog " * 4


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _values(fam: Any, suffix: str = "") -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for s in fam.samples if s.name.endswith(suffix)]


async def test_metrics_families_after_traffic(emulators, emu_gateway) -> None:
    emus = await emulators(2)
    gw = await emu_gateway(
        emus,
        breaker={"consecutive_failures": 2, "cooldown_s": 30},
        instance={"gpu": "H100", "price_per_hour": 2.99},
    )
    await emus[1].faults(error_status=500)  # every request it gets fails: retries and a breaker
    client = gw.client()
    for i in range(6):
        r = await client.completions.create(model=MODEL, prompt=f"{i} {PROMPT}", max_tokens=4)
        assert r.choices[0].text
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for _ in stream:
        pass
    fams = _families(await gw.get("/metrics"))

    requests = _values(fams["tokenplane_requests"], "_total")
    assert sum(v for labels, v in requests if labels["outcome"] == "ok") == 7
    assert {labels["reason"] for labels, _ in requests} <= {
        "round_robin", "least_requests", "prefix_match", "prefix_miss_least_loaded", "none",
    }  # fmt: skip
    for hist in ("tokenplane_ttft_seconds", "tokenplane_time_between_tokens_seconds"):
        counts = _values(fams[hist], "_count")
        assert counts and sum(v for _, v in counts) >= 1, hist
        sums = _values(fams[hist], "_sum")
        assert all(0 <= v < 60 for _, v in sums), hist
    e2e = _values(fams["tokenplane_request_e2e_seconds"], "_count")
    assert {labels["tenant"] for labels, _ in e2e} == {"acme"} and sum(v for _, v in e2e) == 7
    assert _values(fams["tokenplane_queue_depth"]) and all(
        v >= 0 for _, v in _values(fams["tokenplane_queue_depth"])
    )
    assert "tokenplane_queue_wait_seconds" in fams
    states = {labels["instance"]: v for labels, v in _values(fams["tokenplane_breaker_state"])}
    assert states["emu-0"] == 0.0 and states["emu-1"] == 2.0  # closed, open
    assert sum(v for _, v in _values(fams["tokenplane_retries"], "_total")) >= 1
    balance = _values(fams["tokenplane_retry_budget_balance"])
    assert balance and all(v > -1e6 for _, v in balance)
    assert "tokenplane_continuations" in fams
    kv = {labels["instance"]: v for labels, v in _values(fams["tokenplane_instance_kv_usage"])}
    assert set(kv) == {"emu-0", "emu-1"} and all(0.0 <= v <= 1.0 for v in kv.values())
    healthy = {labels["instance"]: v for labels, v in _values(fams["tokenplane_instance_healthy"])}
    assert set(healthy) == {"emu-0", "emu-1"}
    cost = _values(fams["tokenplane_cost_usd"], "_total")
    assert cost and sum(v for _, v in cost) > 0
    spd = _values(fams["tokenplane_success_per_dollar"])
    assert spd and all(v > 0 for _, v in spd)
    tasks = _values(fams["tokenplane_tasks"], "_total")
    assert sum(v for labels, v in tasks if labels["outcome"] == "succeeded") == 7


async def test_rejections_counted_by_reason(emulators, emu_gateway) -> None:
    """A full admission queue refuses with 429/503 and ``Retry-After``; ``/metrics`` counts each refusal
    under its reason and the queue gauges return to zero once the burst is served."""
    import asyncio

    import openai

    emus = await emulators(1, fixed_step_s=0.05)
    gw = await emu_gateway(
        emus, instance={"max_concurrency": 1}, admission={"queue": {"max_depth": 2, "max_per_tenant": 2}}
    )
    client = gw.client().with_options(max_retries=0)

    async def one(i: int) -> int:
        try:
            await client.completions.create(model=MODEL, prompt=f"{i} {PROMPT}", max_tokens=6)
        except openai.APIStatusError as e:
            assert e.response.headers.get("retry-after"), e
            assert e.body and e.body.get("code") in {"pool_saturated", "tenant_over_share"}, e.body
            return e.status_code
        return 200

    statuses = await asyncio.gather(*(one(i) for i in range(10)))
    refused = [s for s in statuses if s != 200]
    assert refused and set(refused) <= {429, 503} and statuses.count(200) >= 3
    fams = _families(await gw.get("/metrics"))
    rejected = _values(fams["tokenplane_rejected"], "_total")
    assert sum(v for _, v in rejected) == len(refused)
    assert {labels["reason"] for labels, v in rejected if v} <= {"queue_full", "tenant_queue_full"}
    assert "tokenplane_shed" in fams
    assert all(v == 0 for _, v in _values(fams["tokenplane_queue_depth"]))
    outcomes = {labels["outcome"] for labels, v in _values(fams["tokenplane_requests"], "_total") if v}
    assert "ok" in outcomes and outcomes - {"ok"}, outcomes
