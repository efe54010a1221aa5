"""Task economics in the twin's report: hand-checked attribution and task counting."""

from __future__ import annotations

import math

import pytest

from tokenplane.core.economics import TokenCosts
from tokenplane.core.views import WorkflowContext
from tokenplane.sim.economics_report import build_economics
from tokenplane.sim.records import InstanceRecord, RequestRecord

PRICE = TokenCosts(prefill_usd_per_token=1e-6, decode_usd_per_token=4e-6)


def rec(rid: int, *, ok: bool, reason: str = "", inst: str | None = "a", tenant: str = "t") -> RequestRecord:
    r = RequestRecord(rid, tenant, 0.0, 100, 10)
    r.ok, r.reason, r.instance_id = ok, reason, inst
    return r


def test_attribution_splits_each_instance_bill_by_token_cost() -> None:
    # Instance a: $3.6/h alive 1000 s = $1.00; b: $7.2/h alive 500 s = $1.00, busy 250 s.
    instances = [
        InstanceRecord("a", "G", "m", 3.6, busy_s=1000.0, alive_s=1000.0),
        InstanceRecord("b", "G", "m", 7.2, busy_s=250.0, alive_s=500.0),
    ]
    records = [rec(1, ok=True), rec(2, ok=True), rec(3, ok=False, reason="timeout", inst="b")]
    # request 1 on a: 100 prefill + 25 decode = 1e-4 + 1e-4 = 2e-4; request 2 on a: 3e-4 + 1e-4 = 4e-4
    # request 3: a failed attempt on b (its whole bill) and a delivered... no: request 2's retry on b
    usage = [
        (1, "a", 100, 25, True),
        (2, "a", 300, 25, True),
        (3, "b", 50, 0, False),
        (2, "b", 150, 0, False),
    ]
    out = build_economics(records, instances, prices={"a": PRICE, "b": PRICE}, workflows={}, usage=usage)
    econ = out["economics"]
    assert econ["gpu_cost_usd"] == pytest.approx(2.0)
    assert econ["attributed_cost_usd"] == pytest.approx(2.0)  # the total equals the fleet's bill
    assert econ["unattributed_cost_usd"] == pytest.approx(0.0, abs=1e-12)
    assert econ["idle_cost_usd"] == pytest.approx(0.5)  # b idle 250 s at $7.2/h
    # a: 1/3 to request 1, 2/3 to request 2; b: 1/4 to request 3, 3/4 to request 2's failed attempt.
    assert out["tasks_completed"] == 2  # requests 1 and 2 (one-step tasks)
    assert out["tasks_failed"] == 1
    assert out["tasks_abandoned_midway"] == 0
    # settled spend: everything; successes: 2
    assert out["cost_per_successful_task_usd"] == pytest.approx(1.0)
    assert out["success_per_dollar"] == pytest.approx(1.0)
    # wasted: request 3 (0.25) + request 2's failed attempt on b (0.75)
    assert out["wasted_cost_usd"] == pytest.approx(1.0)


def test_three_step_task_shed_at_step_two_is_failed_and_its_spend_wasted() -> None:
    wf = {i: WorkflowContext("w", step=i, total_steps=3) for i in (1, 2)}
    wf.update(
        {10: WorkflowContext("v", step=1, total_steps=2), 11: WorkflowContext("v", step=2, total_steps=2)}
    )
    records = [
        rec(1, ok=True),
        rec(2, ok=False, reason="shed_queue_wait", inst=None),
        rec(10, ok=True),
        rec(11, ok=True),
    ]
    instances = [InstanceRecord("a", "G", "m", 3.6, busy_s=1000.0, alive_s=1000.0)]
    usage = [(1, "a", 100, 25, True), (10, "a", 100, 25, True), (11, "a", 200, 50, True)]
    out = build_economics(records, instances, prices={"a": PRICE}, workflows=wf, usage=usage)
    assert out["tasks_completed"] == 1
    assert out["tasks_failed"] == 1
    assert out["tasks_abandoned_midway"] == 1
    # weights 2e-4, 2e-4, 4e-4 of a $1 bill: task w spent 0.25, task v 0.75
    assert out["wasted_cost_usd"] == pytest.approx(0.25)
    assert out["cost_per_successful_task_usd"] == pytest.approx(1.0)
    assert out["economics"]["tasks_failed_at_step"] == {"2": 1}


def test_open_tasks_count_in_neither_side() -> None:
    wf = {1: WorkflowContext("w", step=1, total_steps=3)}
    records = [rec(1, ok=True), rec(2, ok=False)]  # 2: still in flight (no reason)
    instances = [InstanceRecord("a", "G", "m", 3.6, busy_s=10.0, alive_s=10.0)]
    out = build_economics(records, instances, prices={"a": PRICE}, workflows=wf, usage=None)
    assert out["tasks_open"] == 2
    assert out["tasks_completed"] == 0
    assert out["cost_per_successful_task_usd"] is None
    assert not math.isnan(out["economics"]["attributed_cost_usd"])


def test_breakdowns_per_tenant_when_several() -> None:
    records = [rec(1, ok=True, tenant="x"), rec(2, ok=True, tenant="y")]
    instances = [InstanceRecord("a", "G", "m", 3.6, busy_s=1000.0, alive_s=1000.0)]
    out = build_economics(records, instances, prices={"a": PRICE}, workflows={}, usage=None)
    assert set(out["economics"]["by_tenant"]) == {"x", "y"}
    assert "by_model" not in out["economics"]


def test_plain_run_report_carries_the_economics_keys() -> None:
    from tokenplane.sim.runner import run_scenario
    from tokenplane.sim.scenario import parse_scenario

    sc = parse_scenario(
        {
            "fleet": {"instances": 2},
            "workload": {"type": "synthetic", "rate_rps": 5, "num_requests": 50},
        }
    )
    (outcome,) = run_scenario(sc).values()
    r = outcome.report
    for key in ("tasks_completed", "tasks_failed", "cost_per_successful_task_usd", "success_per_dollar"):
        assert key in r
    assert r["tasks_completed"] == 50
    assert r["economics"]["attributed_cost_usd"] == pytest.approx(r["gpu_cost_usd"], rel=1e-9)
