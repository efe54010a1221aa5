"""LoRA in the twin: adapter slots (LRU, pinned by running requests), load stalls, adapter_loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.sim.lora import AdapterSlots, LoraSettings
from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import load_scenario, parse_scenario
from tokenplane.sim.workloads.factory import WorkloadConfigError, build_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_slots_are_lru_and_never_evict_an_adapter_in_use() -> None:
    slots = AdapterSlots(2, load_s=0.25)
    assert slots.admit("a") == 0.25 and slots.admit("b") == 0.25
    assert slots.admit("a") == 0.0  # resident: no load, and now the most recent
    assert not slots.can_admit("c")  # both slots are used by running requests
    slots.release("a")
    slots.release("a")
    assert slots.can_admit("c")
    assert slots.admit("c") == 0.25  # evicts a (idle), not b (running)
    assert slots.view == frozenset({"b", "c"}) and slots.loads == 3


def test_load_time_is_size_over_bandwidth() -> None:
    assert LoraSettings(adapter_mb=500, load_gb_per_s=2.0, load_fixed_s=0.05).load_s == pytest.approx(0.3)


def _one_instance(max_adapters: int, count: int) -> dict[str, Any]:
    return {
        "name": "lora-test",
        "seed": 3,
        "fleet": {
            "instances": 1,
            "gpu": "H100",
            "model": "llama-3-8b",
            "engine": {"lora": {"max_adapters": max_adapters, "adapter_mb": 1000, "load_gb_per_s": 1.0}},
        },
        "workload": {
            "type": "synthetic",
            "rate_rps": 0.5,  # one request at a time: each TTFT is its own prefill plus any load
            "num_requests": 40,
            "prompt": 200,
            "output": 5,
            "adapters": {"count": count, "zipf_s": 0.0},
        },
        "runs": [{"name": "rr", "router": "round-robin"}],
    }


def test_a_missing_adapter_costs_its_load_before_the_first_token() -> None:
    many = run_scenario(parse_scenario(_one_instance(1, 8)))["rr"].report
    one = run_scenario(parse_scenario(_one_instance(1, 1)))["rr"].report
    assert one["adapter_loads"] == 1  # loaded once, then resident
    assert many["adapter_loads"] > 20  # one slot, eight adapters drawn uniformly: mostly misses
    assert one["ttft_p50_s"] < 0.2 < 1.0 <= many["ttft_p50_s"]  # a 1 GB adapter at 1 GB/s


def test_adapters_option_is_validated_and_tags_every_request() -> None:
    with pytest.raises(WorkloadConfigError, match="count"):
        build_workload({"type": "synthetic", "rate_rps": 1, "adapters": {"zipf_s": 1}}, traces=None, seed=0)
    w = build_workload(
        {"type": "synthetic", "rate_rps": 5, "num_requests": 500, "adapters": {"count": 8, "zipf_s": 1.2}},
        traces=None,
        seed=0,
    )
    tags = [s.adapter for s in w.arrivals()]
    assert tags == [s.adapter for s in w.arrivals()]  # replays the same stream
    assert set(tags) <= {f"adapter-{k}" for k in range(8)}
    assert tags.count("adapter-0") > 2 * tags.count("adapter-7")  # Zipf: the head is hot


def test_lora_example_lora_aware_halves_loads_and_lowers_ttft_p99() -> None:
    out = run_scenario(load_scenario(EXAMPLES / "lora.yaml"))
    for suffix in ("", "-seed2", "-64"):
        rr, aware = out["round-robin" + suffix].report, out["lora-aware" + suffix].report
        assert rr["requests_completed"] == aware["requests_completed"] == rr["requests_total"]
        assert aware["ttft_p99_s"] < rr["ttft_p99_s"], suffix
        # 64 adapters over 16 slots: misses are inevitable, the gain smaller (see the example)
        assert rr["adapter_loads"] >= (1.5 if suffix == "-64" else 2.0) * aware["adapter_loads"] > 0, suffix


@given(st.integers(1, 4), st.lists(st.tuples(st.booleans(), st.sampled_from("abcdefg")), max_size=60))
def test_slots_invariants(limit: int, ops: list[tuple[bool, str]]) -> None:
    """Never more than ``limit`` resident; an adapter a running request uses is never evicted; a
    load happens exactly when the adapter was not resident."""
    slots = AdapterSlots(limit, load_s=1.0)
    running: list[str] = []
    for start, adapter in ops:
        if start:
            if not slots.can_admit(adapter):
                assert len(set(running)) == limit and adapter not in running
                continue
            was = adapter in slots.view
            loads = slots.loads
            assert slots.admit(adapter) == (0.0 if was else 1.0)
            assert slots.loads == loads + (0 if was else 1)
            running.append(adapter)
        elif running:
            slots.release(running.pop(0))
        assert len(slots.view) <= limit
        assert set(running) <= slots.view
