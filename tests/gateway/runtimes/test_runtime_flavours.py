"""The gateway reads load and KV from each runtime's metric names, scraped over HTTP from an
emulator speaking them (``tokenplane emulate --runtime``), and fills the seven-axis view fields."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from tokenplane.emulator import EmulatorSettings, start_emulator

pytestmark = pytest.mark.anyio

KV_TOKENS = 4096


@pytest.fixture
async def flavoured(anyio_backend: str) -> AsyncIterator[Callable[..., Awaitable[SimpleNamespace]]]:
    """One in-process emulator publishing ``runtime``'s metric names."""
    runners = []

    async def make(runtime: str, **settings: Any) -> SimpleNamespace:
        settings.setdefault("speed", 5.0)
        settings.setdefault("fixed_step_s", 0.02)
        name = f"emu-{len(runners)}"
        runner, url = await start_emulator(EmulatorSettings(**settings, instance_id=name), runtime=runtime)
        runners.append(runner)
        return SimpleNamespace(name=name, url=url)

    yield make
    for r in runners:
        await r.cleanup()


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "llamacpp"])
async def test_load_and_kv_are_read_in_each_runtimes_names(
    runtime: str, flavoured, emu_gateway, wait, names
) -> None:
    kind = runtime  # the gateway instance's kind is the runtime whose names it reads
    emu = await flavoured(runtime, max_num_seqs=1, kv_capacity_tokens=KV_TOKENS)
    async with aiohttp.ClientSession() as http, http.get(emu.url + "/metrics") as r:
        page = await r.text()
    assert all(line.startswith(("#", runtime)) for line in page.splitlines() if line)
    gw = await emu_gateway([emu], instance={"kind": kind, "kv_capacity_tokens": 0})

    async def warm() -> bool:
        return (await gw.instances())[emu.name]["weights"] == "warm"

    await wait(warm)
    body = {"model": names.MODEL, "prompt": "x " * 64, "max_tokens": 400, "stream": True}
    tasks = [asyncio.create_task(gw.post("/v1/completions", body)) for _ in range(3)]
    seen: list[dict[str, Any]] = []

    async def loaded() -> bool:
        view = (await gw.instances())[emu.name]
        seen.append(view)
        return view["running"] == 1 and view["waiting"] == 2 and view["kv_usage"] > 0

    await wait(loaded, timeout_s=20)
    view = seen[-1]
    cap = view["kv_capacity_tokens"]
    # vLLM: cache_config_info's labels; SGLang: max_total_num_tokens; llama.cpp: used / ratio.
    assert abs(cap - KV_TOKENS) <= KV_TOKENS * 0.02, view
    assert view["hbm_free_bytes"] > 0  # llama-3-8b is in the twin's catalogue
    assert all(status == 200 for status, _, _ in await asyncio.gather(*tasks))
    described = (await gw.instances())[emu.name]
    assert described["kind"] == kind
    if kind == "sglang":  # the prefix-cache counters (prompt and cached tokens)
        assert described["prefix_cache_queries"] > 0


async def test_an_instance_answering_health_with_503_is_warming(flavoured, emu_gateway, wait) -> None:
    """llama.cpp answers /health with 503 while it loads a model: up, not serving yet."""
    emu = await flavoured("llamacpp")
    gw = await emu_gateway([emu], instance={"kind": "llamacpp"})

    async def weights(state: str) -> bool:
        return (await gw.instances())[emu.name]["weights"] == state

    await wait(lambda: weights("warm"))
    async with aiohttp.ClientSession() as http:
        async with http.post(emu.url + "/admin/faults", json={"unhealthy": True}) as r:
            assert r.status == 200
        await wait(lambda: weights("warming"))
        async with http.post(emu.url + "/admin/faults", json={"clear": True}) as r:
            assert r.status == 200
    await wait(lambda: weights("warm"))
