"""Requests leave no reference cycles behind: the servers raise the collector's young threshold
(runloop.GC_YOUNG_THRESHOLD), which is only safe while requests free their objects by reference
counting. A cycle per request would otherwise hold each one's objects (bodies included) until a
collection, up to the threshold's worth."""

from __future__ import annotations

import asyncio
import gc

import pytest

pytestmark = pytest.mark.anyio

GOOD = b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}]}'
STREAM = b'{"model": "llama-3-8b", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
CASES = {
    "answer": (GOOD, True),
    "stream": (STREAM, True),
    "malformed JSON": (b"{not json" + b"x" * 30_000, True),
    "invalid key": (GOOD, False),
    "unknown model": (b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}', True),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_request_leaves_no_cyclic_garbage(upstreams, gateway, names, case: str) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    body, valid = CASES[case]
    headers = {"Authorization": f"Bearer {names.KEY if valid else 'sk-wrong'}"}

    async def send(n: int) -> None:
        for _ in range(n):
            async with gw.http.post(gw.url + "/v1/chat/completions", data=body, headers=headers) as r:
                await r.read()

    await send(5)  # connections, caches and metric children made once
    await asyncio.sleep(0.05)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await send(20)
        await asyncio.sleep(0.05)  # let the ledger's flusher run
        gc.collect()
        # the gateway's side: its own objects and aiohttp's server ones (the test's client shares
        # the process; its internals are not what this guards)
        garbage = [
            type(o).__qualname__
            for o in gc.garbage
            if type(o).__module__.startswith(("tokenplane", "aiohttp.web"))
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage == []
