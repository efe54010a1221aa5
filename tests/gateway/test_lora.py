"""LoRA adapters at the gateway: a request names an adapter as its model; instances publish the
adapters they run in vLLM's ``vllm:lora_requests_info``; ``lora-aware`` sends each request where its
adapter is loaded. Real emulators over HTTP, the official ``openai`` client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tokenplane.gateway.runtimes import runtime_for

pytestmark = pytest.mark.anyio


def test_vllm_lora_gauge_latest_label_set_wins() -> None:
    text = (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e9\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",'
        'waiting_lora_adapters="x"} 1.8e9\n'
    )
    m = runtime_for("vllm").parse_metrics(text)
    assert m.lora_adapters == {"sql", "chat", "x"} and m.max_lora == 2
    assert runtime_for("vllm").parse_metrics("").lora_adapters == frozenset()


async def test_requests_for_an_adapter_go_where_it_is_loaded(emulators, emu_gateway, wait, names) -> None:
    emus = await emulators(2, lora_modules=("sql", "chat"), max_loras=1, speed=10.0)
    gw = await emu_gateway(
        emus,
        router={"name": "lora-aware", "params": {"max_adapters": 1}},
        model={"adapters": ["sql", "chat"]},
    )
    http = emus[0].http

    async def hold(url: str, adapter: str) -> None:  # a long request sent past the gateway
        body = {"model": adapter, "prompt": "hold the slot", "max_tokens": 4000, "ignore_eos": True}
        async with http.post(url + "/v1/completions", json=body) as r:
            await r.read()

    holders = [asyncio.create_task(hold(emus[0].url, "chat")), asyncio.create_task(hold(emus[1].url, "sql"))]
    try:

        async def published() -> bool:
            inst = await gw.instances()
            return inst[emus[0].name]["adapters"] == ["chat"] and inst[emus[1].name]["adapters"] == ["sql"]

        await wait(published)
        client = gw.client()
        for adapter in ["sql", "chat", "sql", "sql", "chat", "chat", "sql"]:
            before = [await e.success_total() for e in emus]
            out = await client.completions.create(model=adapter, prompt="hello", max_tokens=2)
            assert out.choices[0].text
            after = [await e.success_total() for e in emus]
            went = [a - b for a, b in zip(after, before, strict=True)]
            assert went == ([0, 1] if adapter == "sql" else [1, 0]), (adapter, went)
        with pytest.raises(Exception, match="does not exist"):  # not an adapter this model serves
            await client.completions.create(model="nope", prompt="hello", max_tokens=2)
    finally:
        for t in holders:
            t.cancel()
        await asyncio.gather(*holders, return_exceptions=True)


async def test_the_emulator_publishes_running_adapters(emulators) -> None:
    (emu,) = await emulators(1, lora_modules=("sql",), max_loras=2)
    async with emu.http.get(emu.url + "/metrics") as r:
        text: Any = await r.text()
    assert 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}' in text
