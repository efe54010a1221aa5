"""Two replicas share their in-flight work per instance through the real Redis
(``state.share_in_flight``): what one has sent shows in the other's instance view
(``peer_outstanding_*``, read by the KV survival estimate), and leaves it when the request ends,
whether answered, failed or abandoned by its client. Checked through ``GET /v1/instances``."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from redis_server import SHARED_URL

pytestmark = pytest.mark.anyio


async def _pair(gateway: Any, ups: list[Any], prefix: str, share: bool = True) -> list[Any]:
    state = {
        "backend": "redis", "url": SHARED_URL, "key_prefix": prefix, "sync_interval_s": 0.02,
        "share_in_flight": share,
    }  # fmt: skip
    return [await gateway(ups, state=state, retry={"max_attempts": 1}) for _ in range(2)]


async def _peer(gw: Any, instance: str) -> tuple[int, int]:
    view = (await gw.instances())[instance]
    return view["peer_outstanding_requests"], view["peer_outstanding_tokens"]


def _body(names: Any) -> dict[str, Any]:
    return {"model": names.MODEL, "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 20}


async def test_one_replicas_work_shows_in_the_others_view_until_it_ends(
    upstreams: Any, gateway: Any, key_prefix: str, names: Any, wait: Any
) -> None:
    (up,) = await upstreams(1)
    up.answer_delay_s = 0.5
    a, b = await _pair(gateway, [up], key_prefix)

    async def b_sees(requests: int) -> bool:
        n, tokens = await _peer(b, up.name)
        return n == requests and (tokens > 20) == (requests > 0)

    answered = asyncio.create_task(a.post("/v1/chat/completions", _body(names)))
    await wait(lambda: b_sees(1))
    assert await _peer(a, up.name) == (0, 0)  # its own work is its own, not a peer's
    assert (await answered)[0] == 200
    await wait(lambda: b_sees(0))

    up.mode = "drop"  # a stream the instance breaks off ends the attempt as well
    failing = asyncio.create_task(a.post("/v1/chat/completions", {**_body(names), "stream": True}))
    await wait(lambda: b_sees(1))
    await failing
    # the break was counted (last_error stays; consecutive_failures does not: a continuation that
    # the instance then answers resets it, which made this check flaky)
    assert up.requests[-1]["stream"] and (await a.instances())[up.name]["last_error"]
    await wait(lambda: b_sees(0))

    up.mode = "hang"  # the client leaves: the abandoned attempt ends too
    hanging = asyncio.create_task(a.post("/v1/chat/completions", _body(names)))
    await wait(lambda: b_sees(1))
    hanging.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await hanging
    await wait(lambda: b_sees(0))
    assert (await a.instances())[up.name]["outstanding_requests"] == 0


async def test_nothing_is_shared_when_switched_off(
    upstreams: Any, gateway: Any, key_prefix: str, names: Any
) -> None:
    (up,) = await upstreams(1)
    up.answer_delay_s = 0.4
    a, b = await _pair(gateway, [up], key_prefix, share=False)
    answered = asyncio.create_task(a.post("/v1/chat/completions", _body(names)))
    await asyncio.sleep(0.3)  # fifteen sync periods
    assert await _peer(b, up.name) == (0, 0)
    assert (await answered)[0] == 200
