"""A client that goes away mid-stream cancels the upstream request."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.anyio


async def test_client_disconnect_cancels_upstream(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    ups[0].tokens, ups[0].token_delay_s = 500, 0.02
    gw = await gateway(ups)
    body = {"model": names.MODEL, "messages": [{"role": "user", "content": "long story"}], "stream": True}
    resp = await gw.http.post(
        gw.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {names.KEY}"}
    )
    assert resp.status == 200
    first = await resp.content.readuntil(b"\n\n")
    assert first.startswith(b"data: {")
    resp.close()  # the client goes away mid-stream
    await asyncio.wait_for(ups[0].disconnected.wait(), timeout=5)
    assert ups[0].disconnects == 1

    async def settled() -> bool:
        return (await gw.instances())["up-0"]["outstanding_requests"] == 0

    for _ in range(100):
        if await settled():
            break
        await asyncio.sleep(0.02)
    assert await settled()
    text = await gw.get("/metrics", key=None)
    assert 'outcome="client_disconnected"' in text
    # The instance stays healthy: a client leaving is not the instance's fault.
    assert (await gw.instances())["up-0"]["healthy"]
