"""`tokenplane serve` with the control loop on: the autoscaler starts a real emulator process and
the gateway routes to it once it is warm; on shutdown the loop stops what it started."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"


async def _instances(gw: Any) -> list[dict[str, Any]]:
    return list((await gw.instances()).values())


async def test_control_loop_adds_an_emulated_instance_and_routes_to_it(emulators, emu_gateway, wait) -> None:
    (first,) = await emulators(1)
    autoscaling = {
        "enabled": True,
        "interval_s": 0.2,
        "scaler": {"name": "static", "params": {"instances": 2}},
        "pool": {
            "min_instances": 1,
            "max_instances": 2,
            "warm_pool_size": 0,
            "cold_start_s": 1.0,
            "warm_activation_s": 0.1,
            "capacity_rps": 5.0,
        },
        "actuator": {
            "kind": "emulated",
            "args": ["--served-model-name", MODEL, "--speed", "50", "--fixed-step-ms", "20"],
            "warmup_s": 0.3,
        },
    }
    gw = await emu_gateway([first], autoscaling=autoscaling)

    async def two_ready() -> bool:
        ready = [i for i in await _instances(gw) if i["ready"] and i["healthy"]]
        return len(ready) == 2

    await wait(two_ready, timeout_s=60)
    added = next(i for i in await _instances(gw) if i["instance_id"] != first.name)
    assert added["url"].startswith("http://127.0.0.1:")

    client = gw.client()
    for n in range(6):
        r = await client.completions.create(model=MODEL, prompt=f"distinct prompt {n} " * 5, max_tokens=4)
        assert r.choices[0].text
    async with gw.http.get(added["url"] + "/metrics") as r:
        text = await r.text()
    served = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )
    assert served >= 1, "the added instance took traffic"
    async with gw.http.get(gw.url + "/metrics") as r:
        metrics = await r.text()
    assert "tokenplane_autoscaler_decisions_total" in metrics
