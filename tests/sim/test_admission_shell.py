"""The twin's admission layer: terminal outcomes, bounded queue, task-aware order, examples."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tokenplane.core.admission import PriorityClass
from tokenplane.core.economics import TokenCosts
from tokenplane.core.routing import build_router
from tokenplane.core.task_admission import TaskAwareAdmission
from tokenplane.core.views import RequestInfo, WorkflowContext
from tokenplane.sim.admission_shell import AdmissionGate
from tokenplane.sim.engine import ContinuousEngine, EngineConfig
from tokenplane.sim.faults import ClientSpec
from tokenplane.sim.fleet import Fleet, FleetContext
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, TbtHistogram
from tokenplane.sim.resilience import ResilientDispatch
from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import AdmissionSettings, parse_scenario
from tokenplane.sim.workloads.base import RequestSpec

DT = 0.01
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PRICE = TokenCosts(1e-8, 1e-7)


def make_fleet(
    fakes: SimpleNamespace,
    specs: Sequence[RequestSpec],
    *,
    engines: int = 1,
    clients: ClientSpec | None = None,
    **admission: Any,
) -> tuple[Fleet, AdmissionGate, Any]:
    loop = EventLoop()
    tbt = TbtHistogram()
    cfg = EngineConfig()
    engs = [
        ContinuousEngine(
            f"i{k}",
            cfg,
            fakes.ConstModel(DT),
            schedule=loop.schedule,
            schedule_late=loop.schedule_late,
            record=InstanceRecord(f"i{k}", "FAKE", "m", 1.0),
            tbt=tbt,
        )
        for k in range(engines)
    ]
    workload = fakes.ListWorkload(list(specs))
    ctx = FleetContext(
        loop=loop,
        engines=engs,
        router=build_router("least-requests", random.Random(0)),
        workload=workload,
        model="m",
        block_size=cfg.block_size,
        tbt=tbt,
    )
    gate = AdmissionGate(AdmissionSettings(**admission), {e.id: PRICE for e in engs})
    fleet = Fleet(ctx, ResilientDispatch(clients=clients, gate=gate))
    return fleet, gate, workload


def spec(rid: int, t: float, out: int = 100, *, step: int = 0, total: int = 5, wf: str = "") -> RequestSpec:
    ctx = WorkflowContext(wf or f"w{rid}", step=step, total_steps=total) if step else None
    return RequestSpec(rid, t, 200, out, max_output_tokens=out, workflow=ctx)


@pytest.mark.parametrize("policy", ["request-level", "task-aware"])
def test_every_request_ends_exactly_once_and_the_queue_stays_bounded(
    fakes: SimpleNamespace, policy: str
) -> None:
    rng = random.Random(1)
    specs = [spec(i, i * 0.02, out=rng.randint(20, 400), step=1 + i % 5, wf=f"w{i // 5}") for i in range(400)]
    fleet, gate, workload = make_fleet(
        fakes,
        specs,
        engines=2,
        clients=ClientSpec(timeout_s=3.0),
        policy=policy,
        max_in_flight_per_instance=4,
        queue={"max_depth": 16},
        shedder={
            "thresholds": {
                "batch": {"max_queue_wait_s": 0.5},
                "standard": {"max_queue_wait_s": 1.0},
                "interactive": {"max_queue_wait_s": 2},
            }
        },
    )
    records = fleet.run().records
    ended = Counter(rid for rid, _, _ in workload.finished)
    assert sorted(ended) == list(range(400))
    assert set(ended.values()) == {1}  # exactly once
    assert all(r.ok or r.reason for r in records)  # none left without an outcome
    assert gate.max_queue_depth <= 16
    assert not gate._queued and gate.queue.depth == 0
    assert any(not r.ok for r in records)  # it was overloaded
    assert all(e.view().outstanding_requests == 0 for e in fleet.engines)


def _constructed_overload(fakes: SimpleNamespace, policy: str) -> dict[int, str]:
    # One instance, one slot, a queue of one. A long request holds the slot; step 1 of a new task
    # queues; then step 5 of a task that has already spent arrives.
    specs = [
        spec(0, 0.0, out=1000),
        spec(1, 0.1, out=10, step=1),
        spec(2, 0.2, out=10, step=5, wf="old"),
    ]
    fleet, gate, _ = make_fleet(
        fakes,
        specs,
        policy=policy,
        max_in_flight_per_instance=1,
        protect_density=3.0,
        queue={"max_depth": 1},
        value={"usd_per_million_tokens": 0.1},
    )
    gate.spend["old"] = 4 * 300 * 0.1e-6  # four earlier steps of the same size
    records = fleet.run().records
    return {r.request_id: ("ok" if r.ok else r.reason) for r in records}


def test_task_aware_sheds_new_cheap_work_before_the_fifth_step(fakes: SimpleNamespace) -> None:
    assert _constructed_overload(fakes, "task-aware") == {0: "ok", 1: "evicted", 2: "ok"}


def test_request_level_refuses_the_newcomer_whatever_its_step(fakes: SimpleNamespace) -> None:
    assert _constructed_overload(fakes, "request-level") == {0: "ok", 1: "ok", 2: "queue_full"}


def test_task_aware_policy_ranks_by_value_density() -> None:
    policy = TaskAwareAdmission()

    def info(step: int, sunk: float, deadline: float | None = None) -> RequestInfo:
        wf = WorkflowContext("w", step=step, total_steps=5, sunk_cost_usd=sunk, deadline_s=deadline)
        return RequestInfo("r", "m", 1000, 0, workflow=wf)

    c = 1000 * 0.2e-6
    new, late = info(1, 0.0), info(5, 4 * c)
    assert policy.priority(new, now=0.0) is PriorityClass.STANDARD
    assert policy.priority(late, now=0.0) is PriorityClass.INTERACTIVE
    assert policy.victim(late, [new], now=0.0) is new
    assert policy.victim(new, [late], now=0.0) is None
    # not a universal rule: a late step past its workflow's deadline drops below new work
    expired = info(5, 4 * c, deadline=1.0)
    assert policy.priority(expired, now=2.0) is PriorityClass.BATCH
    assert policy.victim(new, [expired], now=2.0) is expired


def test_task_aware_retries_a_late_step_once(fakes: SimpleNamespace) -> None:
    # Step 3 waits behind a long request until its client gives up; the task-aware shell retries it
    # once (budgeted, after retry_delay_s), request-level lets the task end.
    specs = [spec(0, 0.0, out=300), spec(1, 0.0, out=10, step=3, wf="w")]
    outcomes = {}
    for policy in ("request-level", "task-aware"):
        fleet, gate, _ = make_fleet(
            fakes,
            specs,
            clients=ClientSpec(timeout_s=1.0),
            policy=policy,
            max_in_flight_per_instance=1,
            retry_delay_s=2.5,
            value={"usd_per_million_tokens": 0.1},
        )
        gate.spend["w"] = 2 * 300 * 0.1e-6
        records = fleet.run().records
        (r1,) = [r for r in records if r.request_id == 1]
        outcomes[policy] = (r1.ok, r1.reason, gate.adm["task_retries"])
    # step 3 expires in the queue at 1 s (its client's timeout) behind the 3 s request
    assert outcomes["request-level"] == (False, "expired", 0)
    assert outcomes["task-aware"] == (True, "", 1)


def _short(name: str, **over: Any) -> dict[str, Any]:
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    for k, v in over.items():
        target = raw
        keys = k.split(".")
        for kk in keys[:-1]:
            target = target[kk]
        target[keys[-1]] = v
    return raw


def test_agentic_overload_example_smoke() -> None:
    raw = _short("agentic-overload.yaml", duration_s=120.0, **{"workload.users": 120})
    out = run_scenario(parse_scenario(raw))
    assert set(out) == {"request-level", "task-aware"}
    for o in out.values():
        r = o.report
        assert r["admission_policy"] == o.settings.name
        assert r["tasks_completed"] > 0
        assert r["economics"]["attributed_cost_usd"] == pytest.approx(r["gpu_cost_usd"], rel=1e-6)


def test_seven_axis_example_smoke() -> None:
    raw = _short("heterogeneous.yaml", **{"workload.duration_s": 20.0, "workload.rate_rps": 10.0})
    raw["runs"] = raw["runs"][:2]
    out = run_scenario(parse_scenario(raw))
    for o in out.values():
        r = o.report
        assert r["budget_goodput_rps"] is not None
        assert set(r["budget_attainment_by_budget_s"]) == {"0.5", "2", "10"}


def test_kv_working_set_limit_refuses_new_tasks_at_step_1_only(fakes: SimpleNamespace) -> None:
    # KV 400,000 tokens x 0.005 = a 2,000-token budget. Task "a" starts alone (300 tokens now,
    # 1,500 projected to step 5), so the step 1 of "b" that arrives while it runs is refused; "a"'s
    # later steps are not, a request without a workflow is not, and once "a" has finished its last
    # step, "c" fits (and stays: its step 2 has not come).
    specs = [
        spec(0, 0.0, step=1, wf="a"),
        spec(1, 0.1, step=1, wf="b"),
        spec(2, 0.2, step=2, wf="a"),
        spec(3, 0.3),
        spec(4, 3.0, step=5, wf="a"),
        spec(5, 6.0, step=1, wf="c"),
    ]
    outcomes = {}
    for frac in (0.005, None):
        fleet, gate, _ = make_fleet(fakes, specs, policy="task-aware", kv_working_set_fraction=frac)
        records = fleet.run().records
        outcomes[frac] = {r.request_id: ("ok" if r.ok else r.reason) for r in records}
        if frac is not None:  # "a" finished and left the working set, "b" never entered it
            ws = gate.working_set
            assert ws is not None and list(ws.contexts) == ["c"] and ws.working_set_tokens == 300
    assert outcomes[0.005] == {0: "ok", 1: "kv_working_set", 2: "ok", 3: "ok", 4: "ok", 5: "ok"}
    assert set(outcomes[None].values()) == {"ok"}


def test_agentic_overload_working_set_limit_refuses_at_step_1_only() -> None:
    raw = _short("agentic-overload.yaml", duration_s=120.0, **{"workload.users": 160})
    raw["runs"] = [
        {"name": "limit", "admission": {"policy": "task-aware", "kv_working_set_fraction": 0.3}},
        {"name": "no-limit", "admission": {"policy": "task-aware", "kv_working_set_fraction": None}},
        {"name": "request-level", "admission": {"policy": "request-level"}},
    ]
    out = {name: o.report for name, o in run_scenario(parse_scenario(raw)).items()}
    limited = out["limit"]
    refused = limited["admission_refused_by_step"]
    ws = {k: v for k, v in refused.items() if k.startswith("kv_working_set@")}
    assert ws and set(ws) == {"kv_working_set@step1"}
    assert limited["admission_refused_kv_working_set"] == ws["kv_working_set@step1"]
    assert limited["admission_max_working_set_tokens"] > 0
    for name in ("no-limit", "request-level"):
        r = out[name]
        assert r["admission_refused_kv_working_set"] == 0
        assert not any(k.startswith("kv_working_set@") for k in r["admission_refused_by_step"])
    # the started tasks keep their prefixes
    assert limited["prefix_hit_ratio"] > out["no-limit"]["prefix_hit_ratio"]


@pytest.mark.parametrize("reserve", [None, {"interactive": 0.5}])
def test_an_interactive_reserve_in_the_twin(fakes: SimpleNamespace, reserve: dict[str, float] | None) -> None:
    """The core's class reserve, through the twin's shell: a standard flood of long requests on 8
    slots, then a burst of 4 interactive ones. With ``reserve: {interactive: 0.5}`` (the class was
    active from t=0) the burst starts at once; without, it waits for a long request to end."""

    def req(rid: int, t: float, out: int, priority: int, tenant: str) -> RequestSpec:
        return RequestSpec(rid, t, 200, out, max_output_tokens=out, tenant=tenant, priority=priority)

    specs = [req(0, 0.0, 5, 1, "light")]
    specs += [req(1 + i, 0.1 + i * 0.001, 1000, 0, "heavy") for i in range(24)]
    specs += [req(100 + i, 2.0, 10, 1, "light") for i in range(4)]
    fleet, _gate, _ = make_fleet(
        fakes, specs, max_in_flight_per_instance=8, queue={"reserve": reserve} if reserve else {}
    )
    records = {r.request_id: r for r in fleet.run().records}
    burst = [records[100 + i].ttft_s for i in range(4)]
    assert all(t is not None for t in burst)
    heavy_running_at_burst = sum(
        1 for i in range(24) if (r := records[1 + i]).scheduled_s is not None and r.scheduled_s <= 2.0
    )
    if reserve:
        assert heavy_running_at_burst == 4  # 4 of the 8 slots were kept for interactive
        assert max(burst) < 10 * DT  # type: ignore[type-var]
    else:
        assert heavy_running_at_burst == 8
        assert min(burst) > 5.0  # type: ignore[operator]  # waited for a 10 s request to end
