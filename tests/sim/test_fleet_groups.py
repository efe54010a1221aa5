"""Heterogeneous fleets: ``fleet: {groups: [...]}`` builds the right instances; the single form stays."""

from __future__ import annotations

from typing import Any

import pytest

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import ScenarioError, parse_scenario


def _workload(n: int = 120, rate: float = 20.0) -> dict[str, Any]:
    return {
        "type": "synthetic",
        "rate_rps": rate,
        "num_requests": n,
        "prompt": {"kind": "fixed", "value": 200},
        "output": {"kind": "fixed", "value": 20},
    }


def _doc(fleet: dict[str, Any], **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": "groups", "seed": 1, "fleet": fleet, "workload": _workload()}
    doc.update(extra)
    return doc


def test_groups_build_ids_gpus_and_prices() -> None:
    fleet = {
        "model": "llama-3-8b",
        "groups": [
            {"name": "new", "instances": 2, "gpu": "H200", "price_per_hour": 4.0},
            {"name": "old", "instances": 3, "gpu": "A100", "tp": 2},
        ],
    }
    (o,) = run_scenario(parse_scenario(_doc(fleet, router="round-robin"))).values()
    ids = [i.instance_id for i in o.result.instances]
    assert ids == ["new-0", "new-1", "old-0", "old-1", "old-2"]
    by_id = {i.instance_id: i for i in o.result.instances}
    assert by_id["new-0"].gpu.upper() == "H200" and by_id["new-0"].price_per_hour == 4.0
    a100 = Catalog.default().gpu("A100").price_per_hour
    assert by_id["old-2"].gpu.upper() == "A100" and by_id["old-2"].price_per_hour == pytest.approx(2 * a100)
    assert o.report["instances"] == 5
    assert [g["name"] for g in o.report["groups"]] == ["new", "old"]
    assert all(r.ok for r in o.result.records)
    assert {r.instance_id for r in o.result.records} == set(ids)


def _engines(fakes: Any, loop: Any, n: int) -> list[Any]:
    """``n`` bound engines on ``loop`` (H200 at 3.5 per hour), for a lifecycle built over them."""
    from tokenplane.sim.engine import ContinuousEngine, EngineConfig
    from tokenplane.sim.records import InstanceRecord, TbtHistogram

    engines = [
        ContinuousEngine(
            f"g-{i}",
            EngineConfig(kv_capacity_tokens=10_000),
            fakes.ConstModel(0.01),
            schedule=loop.schedule,
            on_finish=lambda seq, now: None,
            record=InstanceRecord(f"g-{i}", "H200", "m", 3.5),
            tbt=TbtHistogram(),
        )
        for i in range(n)
    ]
    changed: set[int] = set()
    for i, e in enumerate(engines):
        e.bind(i, changed)
    return engines


def test_views_carry_gpu_price_and_weights(fakes: Any) -> None:
    from tokenplane.sim.kernel import EventLoop
    from tokenplane.sim.lifecycle import SERVING, STOPPED, WARMING, Lifecycle, Timings

    loop = EventLoop()
    engines = _engines(fakes, loop, 3)
    lc = Lifecycle(loop, engines, [Timings(10.0, 1.0)] * 3, [SERVING, WARMING, STOPPED], land_to_warm=False)
    views = [e.view() for e in engines]
    assert [v.weights for v in views] == ["warm", "warming", "cold"]
    assert [v.ready for v in views] == [True, False, False]
    assert all(v.gpu == "H200" and v.price_per_hour == 3.5 for v in views)
    loop.run()
    assert engines[1].view().weights == "warm" and engines[1].ready
    assert lc.held_s(1, 10.0) == pytest.approx(10.0) and lc.held_s(2, 10.0) == 0.0


def test_single_form_is_unchanged() -> None:
    sc = parse_scenario(_doc({"instances": 3, "gpu": "H100", "model": "llama-3-8b"}, router="round-robin"))
    (o,) = run_scenario(sc).values()
    assert [i.instance_id for i in o.result.instances] == ["h100-0", "h100-1", "h100-2"]
    assert o.report["gpu"] == "H100"
    assert "groups" not in o.report and "fleet_timeline" not in o.report
    assert o.report["gpu_hours"] == pytest.approx(3 * o.report["duration_s"] / 3600)


def test_cold_group_serves_only_after_its_cold_start() -> None:
    fleet = {
        "model": "llama-3-8b",
        "gpu": "H100",
        "groups": [
            {"name": "warm", "instances": 1},
            {"name": "cold", "instances": 2, "state": "cold", "lifecycle": {"cold_start_s": 3.0}},
        ],
    }
    (o,) = run_scenario(parse_scenario(_doc(fleet, router="round-robin"))).values()
    assert all(r.ok for r in o.result.records)
    for r in o.result.records:
        if r.instance_id and r.instance_id.startswith("cold"):
            assert r.arrival_s >= 3.0
    assert any((r.instance_id or "").startswith("cold") for r in o.result.records)
    # a warming instance holds its GPU: every instance is charged from t = 0
    assert o.report["gpu_hours"] == pytest.approx(3 * o.report["duration_s"] / 3600)


def test_cold_start_time_defaults_to_start_plus_weight_load() -> None:
    from tokenplane.sim.autoscaling import group_timings
    from tokenplane.sim.scenario import FleetSettings

    g = FleetSettings(model="llama-3-70b", lifecycle={"start_s": 30, "load_gb_per_s": 4.0}).resolved_groups()[
        0
    ]
    weights = Catalog.default().model("llama-3-70b").weight_bytes
    assert group_timings(g, Catalog.default()).cold_start_s == pytest.approx(30 + weights / 4e9)


def test_bad_groups_fail_at_load() -> None:
    with pytest.raises(ScenarioError, match="unique"):
        parse_scenario(_doc({"groups": [{"name": "a", "instances": 1}, {"name": "a", "instances": 1}]}))
    with pytest.raises(ScenarioError):
        parse_scenario(_doc({"groups": []}))


def test_a_hold_a_decision_begins_or_ends_after_the_runs_end_is_cut_there(fakes: Any) -> None:
    """The static fleet is charged to the run's last activity; an autoscaled one was charged past it
    when a decision after that (the tick a few seconds on) stopped or started an instance."""
    from tokenplane.sim.kernel import EventLoop
    from tokenplane.sim.lifecycle import STOPPED, WARM, Lifecycle, Timings

    loop = EventLoop()
    engines = _engines(fakes, loop, 2)
    lc = Lifecycle(loop, engines, [Timings(10.0, 1.0)] * 2, [WARM, STOPPED], land_to_warm=True)
    lc.stop_warm(0, 110.0)  # a decision at 110 s, after a run that ended at 100 s
    lc.start_cold(1, 105.0)
    assert lc.held_s(0, 100.0) == pytest.approx(100.0) and lc.held_s(0, 120.0) == pytest.approx(110.0)
    assert lc.held_s(1, 100.0) == 0.0 and lc.held_s(1, 120.0) == pytest.approx(15.0)
