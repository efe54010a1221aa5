"""Routing through the core's prefix-affinity router: shared prefixes stick, unrelated prompts spread."""

from __future__ import annotations

import asyncio
import collections

import pytest

pytestmark = pytest.mark.anyio

SYSTEM = "You are a meticulous assistant for the tokenplane project. " * 20  # about 300 tokens


def _served(ups) -> dict[str, int]:
    return {u.name: len(u.requests) for u in ups}


async def test_repeated_prefix_sticks_to_one_instance(upstreams, gateway, names) -> None:
    ups = await upstreams(3)
    gw = await gateway(ups, router={"name": "prefix-affinity"})
    client = gw.client()
    for i in range(12):
        await client.chat.completions.create(
            model=names.MODEL,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question {i}"}],
        )
    counts = _served(ups)
    assert sorted(counts.values()) == [0, 0, 12], counts
    text = await gw.get("/metrics", key=None)
    assert 'reason="prefix_match"' in text


async def test_unrelated_prompts_spread(upstreams, gateway, names) -> None:
    ups = await upstreams(3)
    gw = await gateway(ups, router={"name": "prefix-affinity"})
    client = gw.client()
    # Concurrent requests keep in-flight counts apart, so least-loaded misses go to different instances.
    for u in ups:
        u.token_delay_s = 0.02
    prompts = [f"{i:03d} " + chr(65 + i) * 400 for i in range(9)]
    await asyncio.gather(
        *(
            client.chat.completions.create(model=names.MODEL, messages=[{"role": "user", "content": p}])
            for p in prompts
        )
    )
    counts = _served(ups)
    assert all(c >= 2 for c in counts.values()), counts
    # A repeat of each prompt goes where that prompt went first.
    first = {}
    for u in ups:
        for body in u.requests:
            first[body["messages"][0]["content"]] = u.name
    for u in ups:
        u.requests.clear()
    for p in prompts:
        await client.chat.completions.create(model=names.MODEL, messages=[{"role": "user", "content": p}])
    again = {b["messages"][0]["content"]: u.name for u in ups for b in u.requests}
    assert again == first


async def test_round_robin_router_from_config(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups, router="round-robin")
    for _ in range(6):
        await gw.client().completions.create(model=names.MODEL, prompt="same prompt " * 40)
    assert collections.Counter(_served(ups).values()) == {3: 2}
