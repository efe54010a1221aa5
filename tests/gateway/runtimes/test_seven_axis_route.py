"""A seven-axis route taken through the gateway on views built from scraped metrics: the placement
router's KV-headroom filter and weights-ready scorer see what the emulators publish."""

from __future__ import annotations

import re

import aiohttp
import pytest

pytestmark = pytest.mark.anyio


async def _successes(url: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


async def _reasons(gw) -> dict[str, float]:
    text = await gw.get("/metrics", key=None)
    found = re.findall(r'^tokenplane_requests_total\{[^}]*reason="([^"]+)"[^}]*\} (\S+)$', text, re.M)
    return {reason: float(n) for reason, n in found}


async def test_the_kv_headroom_filter_avoids_an_instance_whose_scraped_cache_is_too_small(
    emulators, emu_gateway, wait, names
) -> None:
    small, big = await emulators(1, kv_capacity_tokens=256) + await emulators(1, kv_capacity_tokens=8192)
    gw = await emu_gateway([small, big], router="seven-axis", instance={"kv_capacity_tokens": 0})

    async def scraped() -> bool:
        inst = await gw.instances()
        return inst[small.name]["kv_capacity_tokens"] == 256 and inst[big.name]["kv_capacity_tokens"] == 8192

    await wait(scraped)
    for i in range(4):  # 16 + 300 tokens: more than the small cache holds at all
        status, body, _ = await gw.post(
            "/v1/completions", {"model": names.MODEL, "prompt": f"{i} hello", "max_tokens": 300}
        )
        assert status == 200, body
    assert await _successes(small.url) == 0 and await _successes(big.url) == 4
    assert (await _reasons(gw)).get("weighted_score") == 4


async def test_the_weights_ready_scorer_prefers_the_warm_instance(
    emulators, emu_gateway, wait, names
) -> None:
    warming, warm = await emulators(2)
    await warming.faults(unhealthy=True)  # health 503 (a runtime loading its weights)
    gw = await emu_gateway([warming, warm], router="seven-axis")

    async def states() -> bool:
        inst = await gw.instances()
        return inst[warming.name]["weights"] == "warming" and inst[warm.name]["weights"] == "warm"

    async def idle() -> bool:
        # Load outweighs readiness (tenant-priority 3, weights-ready 1): the last request's running
        # count, still in the warm instance's latest scrape on a loaded machine, would send the next
        # one to the warming instance. Compare them idle, as the claim is "all else equal".
        inst = await gw.instances()
        return all(inst[e.name]["running"] == 0 and inst[e.name]["kv_usage"] == 0.0 for e in (warming, warm))

    await wait(states)
    for i in range(4):
        await wait(idle)
        status, body, _ = await gw.post(
            "/v1/completions", {"model": names.MODEL, "prompt": f"{i} hello", "max_tokens": 4}
        )
        assert status == 200, body
    assert await _successes(warming.url) == 0 and await _successes(warm.url) == 4
    assert (await _reasons(gw)).get("weighted_score") == 4
