"""The twin's autoscaling shell: lifecycle delays, draining, GPU-hours, and the scalers end to end."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.fleet import FleetResult
from tokenplane.sim.lifecycle import SERVING
from tokenplane.sim.runner import run_scenario, simulate
from tokenplane.sim.scenario import ScenarioError, parse_scenario
from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.traces import traces_dir

COLD_S = 20.0
ACT_S = 2.0


class StepWorkload:
    """Constant-rate phases ``(duration_s, rate_rps)``, deterministic spacing, short requests."""

    name = "step"

    def __init__(self, phases: Sequence[tuple[float, float]], prompt: int = 100, output: int = 30) -> None:
        self.phases = phases
        self.prompt = prompt
        self.output = output

    def arrivals(self) -> Iterator[RequestSpec]:
        t0 = 0.0
        rid = 0
        for duration, rate in self.phases:
            n = int(duration * rate)
            for k in range(n):
                yield RequestSpec(rid, t0 + k / rate, self.prompt, self.output)
                rid += 1
            t0 += duration

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()


def _doc(autoscaler: dict[str, Any], instances: int = 6, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "autoscale-test",
        "seed": 1,
        "router": "least-requests",
        "fleet": {
            "instances": instances,
            "gpu": "H100",
            "model": "llama-3-8b",
            "engine": {"max_num_seqs": 4},
            "lifecycle": {"cold_start_s": COLD_S, "warm_activation_s": ACT_S},
        },
        "workload": {"type": "synthetic", "rate_rps": 1, "num_requests": 1},
        "slo": {"ttft_s": 2.0, "tbt_s": 0.5},
        "autoscaler": autoscaler,
    }
    doc.update(extra)
    return doc


def _simulate(doc: dict[str, Any], workload: StepWorkload) -> FleetResult:
    (run,) = parse_scenario(doc).runs
    return simulate(run, catalog=Catalog.default(), workload=workload)


def _serving_intervals(result: FleetResult) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for t, iid, state in result.lifecycle.transitions:
        if state == SERVING:
            since[iid] = t
        elif iid in since:
            out.setdefault(iid, []).append((since.pop(iid), t))
    for iid, t in since.items():
        out.setdefault(iid, []).append((t, float("inf")))
    return out


def _assert_routed_only_while_serving(result: FleetResult) -> None:
    intervals = _serving_intervals(result)
    for r in result.records:
        assert r.instance_id is not None
        assert any(a <= r.arrival_s <= b for a, b in intervals[r.instance_id]), r


STEP = StepWorkload([(60.0, 2.0), (120.0, 40.0), (240.0, 2.0)])
TOKENPLANE = {
    "name": "tokenplane",
    "params": {"cooldown_s": 30, "stabilisation_s": 30},
    "pool": {"capacity_rps": 8.0, "min_instances": 1, "warm_pool_size": 1},
    "initial_serving": 1,
}


def test_step_up_activates_warm_then_cold_starts_with_their_delays() -> None:
    result = _simulate(_doc(TOKENPLANE), STEP)
    tr = result.lifecycle.transitions
    # t = 0: one serving, one warm, the rest stopped
    assert [s for t, _, s in tr if t == 0.0] == [
        "serving",
        "warm",
        "stopped",
        "stopped",
        "stopped",
        "stopped",
    ]
    first_up = min(t for t, _, s in tr if s == "activating")
    first_cold = min(t for t, _, s in tr if s == "warming")
    assert 60.0 <= first_up <= first_cold  # the warm pool goes first, then cold starts
    started: dict[str, float] = {}
    for t, iid, s in tr:
        if s == "warming":
            started[iid] = t
        elif s == "warm" and iid in started:
            assert t == pytest.approx(started.pop(iid) + COLD_S)  # lands after exactly cold_start_s
    activating: dict[str, float] = {}
    for t, iid, s in tr:
        if s == "activating":
            activating[iid] = t
        elif s == "serving" and iid in activating:
            assert t == pytest.approx(activating.pop(iid) + ACT_S)
    # serving follows demand up: more than the initial one at the peak
    timeline = result.extra["fleet_timeline"]
    assert max(p[1] for p in timeline if p[0] <= 180.0) >= 4
    _assert_routed_only_while_serving(result)
    assert result.extra["scale_actions"]["start_cold"] >= 1


def test_scale_down_drains_without_losing_requests() -> None:
    result = _simulate(_doc(TOKENPLANE), STEP)
    assert all(r.ok for r in result.records), [r for r in result.records if not r.ok][:3]
    states = [s for _, _, s in result.lifecycle.transitions]
    assert "draining" in states
    timeline = result.extra["fleet_timeline"]
    peak = max(p[1] for p in timeline)
    assert timeline[-1][1] < peak  # scaled back down after the burst
    _assert_routed_only_while_serving(result)
    drained_at: dict[str, float] = {}
    for t, iid, s in result.lifecycle.transitions:
        if s == "draining":
            drained_at[iid] = t
        elif iid in drained_at and s in ("stopped", "warm"):
            # released only once its in-flight work finished
            busy = [r for r in result.records if r.instance_id == iid and r.arrival_s <= drained_at[iid]]
            assert all(r.finish_s is not None and r.finish_s <= t for r in busy)
            del drained_at[iid]


def test_gpu_hours_is_the_integral_of_instances_holding_gpus() -> None:
    # 3 instances: 1 serving, 1 warm (stopped by the static scaler's first decision at t = 15 s),
    # 1 stopped throughout: held seconds = end + 15 + 0.
    doc = _doc(
        {"name": "static", "params": {"instances": 1}, "pool": {"capacity_rps": 1.0, "warm_pool_size": 1}},
        instances=3,
    )
    result = _simulate(doc, StepWorkload([(40.0, 1.0)]))
    end = result.duration_s
    held = sorted(i.alive_s for i in result.instances)
    assert held == pytest.approx([0.0, 15.0, end])
    (o,) = run_scenario(parse_scenario(doc)).values()
    # The scenario's own workload ends before t = 15 s: the warm instance stopped then is charged
    # to the run's end, as the serving one is (not past it).
    end = o.report["duration_s"]
    assert o.report["gpu_hours"] == pytest.approx((end + min(15.0, end)) / 3600)
    price = Catalog.default().gpu("H100").price_per_hour
    assert o.report["cost_usd"] == pytest.approx(o.report["gpu_hours"] * price)


def test_static_scaler_never_changes_the_fleet() -> None:
    doc = _doc({"name": "static", "params": {"instances": 3}, "pool": {"capacity_rps": 1.0}}, instances=4)
    result = _simulate(doc, STEP)
    assert result.extra["scale_actions"] == {}
    assert set(result.extra["scale_decisions"]) == {"fixed_size"}
    assert all(t == 0.0 for t, _, _ in result.lifecycle.transitions)
    assert {p[1] for p in result.extra["fleet_timeline"]} == {3}
    assert all(r.ok for r in result.records)


def test_hpa_scales_on_utilisation() -> None:
    doc = _doc({"name": "hpa", "pool": {"capacity_rps": 8.0, "min_instances": 1}, "initial_serving": 1})
    result = _simulate(doc, STEP)
    assert result.extra["scale_decisions"].get("utilisation_high", 0) >= 1
    assert all(r.ok for r in result.records)
    _assert_routed_only_while_serving(result)


def test_report_keys_of_an_autoscaled_run() -> None:
    doc = _doc(TOKENPLANE, workload={"type": "synthetic", "rate_rps": 5, "num_requests": 300})
    (o,) = run_scenario(parse_scenario(doc)).values()
    r = o.report
    for key in ("gpu_hours", "slo_attainment", "ttft_slo_attainment", "fleet_timeline", "warm_timeline"):
        assert key in r
    assert r["cost_usd"] == r["gpu_cost_usd"]
    assert sum(r["scale_decisions"].values()) >= 1
    assert 0.0 <= r["ttft_slo_attainment"] <= 1.0
    assert r["ttft_slo_attainment"] >= r["slo_attainment"]
    assert all(len(p) == 3 for p in r["fleet_timeline"])


@pytest.mark.parametrize(
    ("autoscaler", "match"),
    [
        ({"name": "nope", "pool": {"capacity_rps": 1.0}}, "nope"),
        ({"name": "tokenplane", "pool": {}}, "capacity_rps"),
        ({"name": "tokenplane", "pool": {"capacity_rps": 1.0, "max_instances": 99}}, "max_instances"),
        ({"name": "tokenplane", "params": {"bogus": 1}, "pool": {"capacity_rps": 1.0}}, "bogus"),
    ],
)
def test_bad_autoscaler_config_fails_at_load(autoscaler: dict[str, Any], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        parse_scenario(_doc(autoscaler))


@pytest.mark.traces
def test_servegen_autoscaled_end_to_end() -> None:
    folder = traces_dir()
    if folder is None or not (folder / "servegen/reason/deepseek-r1").is_dir():
        pytest.skip("public traces folder (servegen/reason/deepseek-r1) not found")
    doc = _doc(
        {"name": "tokenplane", "pool": {"capacity_rps": 1.3, "min_instances": 2, "warm_pool_size": 1}},
        instances=12,
        fleet={"instances": 12, "gpu": "H100", "model": "llama-3-70b", "tp": 2},
        workload={
            "type": "servegen",
            "path": "servegen/reason/deepseek-r1",
            "clients": [47, 18, 62, 11],
            "time_scale": 0.125,
            "duration_s": 600,
        },
    )
    (o,) = run_scenario(parse_scenario(doc), traces=folder).values()
    r = o.report
    assert r["requests_total"] > 100
    assert r["requests_failed"] == 0
    assert r["fleet_timeline"] and r["gpu_hours"] > 0
    assert r["ttft_slo_attainment"] is not None


def test_the_slo_budget_compares_sizes_on_prompt_tokens_per_second_over_the_last_minute() -> None:
    """A pool held at 2 (min = max) records size 2 at the busiest last minute of prompt tokens."""
    scaler = {
        "name": "tokenplane",
        "params": {"slo_budget": True},
        "pool": {"capacity_rps": 8.0, "min_instances": 2},
        "initial_serving": 2,
    }
    result = _simulate(_doc(scaler, instances=2), StepWorkload([(90.0, 2.0), (120.0, 6.0)], prompt=100))
    sizes = result.extra["pool"]["slo_budget"]["sizes"]
    assert set(sizes) == {"2"}
    assert sizes["2"]["max_prompt_tokens_per_s"] == pytest.approx(6.0 * 100)  # a whole minute of phase 2
    assert sizes["2"]["max_rps"] == pytest.approx(6.0)
