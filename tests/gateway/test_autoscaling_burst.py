"""Live, emulated fleet: a burst makes the control loop add instances, which serve after their
warm-up; when the load falls they drain and stop, and no request fails."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"
EMULATOR_ARGS = [
    "--served-model-name",
    MODEL,
    "--speed",
    "1",
    "--fixed-step-ms",
    "20",
    "--max-num-seqs",
    "4",
]


async def _actions(gw: Any) -> dict[str, float]:
    text = await gw.get("/metrics")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "tokenplane_autoscaler_actions":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[s.labels["action"]] = out.get(s.labels["action"], 0.0) + s.value
    return out


async def test_burst_scales_out_then_drains_with_no_failed_request(emulators, emu_gateway, wait) -> None:
    (first,) = await emulators(1, speed=1.0, fixed_step_s=0.02, max_num_seqs=4)
    autoscaling = {
        "enabled": True,
        "interval_s": 0.5,
        "scaler": {
            "name": "tokenplane",
            "params": {
                "cooldown_s": 2.0,
                "stabilisation_s": 2.0,
                "scale_down_step_fraction": 1.0,
                "learn_capacity": False,
                "park_drained": False,
                "queue_drain_s": 2.0,
            },
        },
        "pool": {
            "min_instances": 1,
            "max_instances": 3,
            "warm_pool_size": 0,
            "cold_start_s": 1.0,
            "warm_activation_s": 0.1,
            "capacity_rps": 3.0,
        },
        "signals": {"bucket_s": 0.5, "slo_window_s": 2.0},
        "max_drain_s": 10.0,
        "actuator": {"kind": "emulated", "args": EMULATOR_ARGS, "warmup_s": 0.5},
    }
    gw = await emu_gateway([first], autoscaling=autoscaling, instance={"max_concurrency": 4})
    client = gw.client()
    results: list[str] = []
    stop = asyncio.Event()

    async def user(i: int) -> None:
        n = 0
        while not stop.is_set():
            r = await client.completions.create(model=MODEL, prompt=f"user {i} call {n} " * 8, max_tokens=10)
            results.append(r.choices[0].finish_reason or "")
            n += 1

    users = [asyncio.create_task(user(i)) for i in range(12)]

    async def scaled_out() -> bool:
        ready = [v for v in (await gw.instances()).values() if v["ready"] and v["healthy"]]
        return len(ready) >= 2

    await wait(scaled_out, timeout_s=60)
    served_by = {}
    await asyncio.sleep(2.0)  # the new instances take traffic
    for iid, v in (await gw.instances()).items():
        served_by[iid] = v["url"]
    stop.set()
    await asyncio.gather(*users)
    assert len(served_by) >= 2

    async def drained() -> bool:
        return len(await gw.instances()) == 1

    await wait(drained, timeout_s=60)
    actions = await _actions(gw)
    assert actions.get("start_cold", 0) >= 1 and actions.get("activate_warm", 0) >= 1, actions
    assert actions.get("drain", 0) >= 1, actions
    assert results and all(r in ("length", "stop") for r in results), "no request failed"
