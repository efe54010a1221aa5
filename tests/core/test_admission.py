"""Admission queue: bounds, reasons, EDF, strict priority with aging, fair sharing, concurrency limits."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.admission import (
    AdmissionDecision,
    AdmissionQueue,
    AdmissionReason,
    PriorityClass,
    terminal_for,
)
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.outcomes import OutcomeLedger, TerminalOutcome
from tokenplane.core.state_store import LocalGaugeStore, SlidingWindowCounterStore
from tokenplane.core.views import RequestInfo, WorkflowContext

_n = 0


def req(
    tenant: str = "t",
    priority: int = 0,
    arrival_s: float = 0.0,
    prompt: int = 100,
    out: int = 100,
    workflow: WorkflowContext | None = None,
) -> RequestInfo:
    global _n
    _n += 1
    return RequestInfo(
        request_id=f"r{_n}",
        model="m",
        prompt_tokens=prompt,
        max_output_tokens=out,
        tenant=tenant,
        priority=priority,
        arrival_s=arrival_s,
        workflow=workflow,
    )


def queue(**kw: Any) -> AdmissionQueue:
    return AdmissionQueue(store=SlidingWindowCounterStore(60.0), gauges=LocalGaugeStore(), **kw)


def test_priority_class_mapping() -> None:
    assert PriorityClass.from_name("Interactive") is PriorityClass.INTERACTIVE
    assert PriorityClass.from_value(5) is PriorityClass.INTERACTIVE
    assert PriorityClass.from_value(-9) is PriorityClass.BATCH
    assert PriorityClass.INTERACTIVE > PriorityClass.STANDARD > PriorityClass.BATCH
    with pytest.raises(InvalidPolicyConfig):
        PriorityClass.from_name("urgent")


@pytest.mark.parametrize(
    ("capacity", "decision", "reason"),
    [
        (1, AdmissionDecision.ADMIT_NOW, AdmissionReason.ADMITTED),
        (0, AdmissionDecision.QUEUED, AdmissionReason.QUEUED_NO_CAPACITY),
    ],
)
def test_offer_capacity(capacity: int, decision: AdmissionDecision, reason: AdmissionReason) -> None:
    a = queue().offer(req(), now=0.0, capacity=capacity)
    assert (a.decision, a.reason) == (decision, reason)
    assert a.deadline_s == 120.0  # standard budget from arrival


def test_no_queue_jumping_when_others_wait() -> None:
    q = queue()
    q.offer(req(tenant="a"), now=0.0, capacity=0)
    a = q.offer(req(tenant="b"), now=0.0, capacity=1)
    assert a.reason is AdmissionReason.QUEUED_BEHIND
    # a higher class does jump a lower one
    assert q.offer(req(tenant="c", priority=1), now=0.0, capacity=1).admitted


def test_deadline_unreachable_and_workflow_deadline() -> None:
    q = queue()
    a = q.offer(req(arrival_s=0.0), now=0.0, budget_s=1.0, predicted_service_s=2.0)
    assert a.reason is AdmissionReason.DEADLINE_UNREACHABLE and a.rejected
    assert terminal_for(a.reason) is TerminalOutcome.REJECTED
    wf = WorkflowContext("w", deadline_s=5.0)
    assert q.offer(req(workflow=wf), now=0.0).deadline_s == 5.0


def test_tenant_queue_full_then_queue_full_with_retry_after() -> None:
    q = queue(max_depth=3, max_per_tenant=2)
    for _ in range(2):
        assert q.offer(req(tenant="a"), now=0.0).queued
    a = q.offer(req(tenant="a"), now=0.0)
    assert a.reason is AdmissionReason.TENANT_QUEUE_FULL and a.retry_after_s == 5.0
    assert q.offer(req(tenant="b"), now=0.0).queued
    full = q.offer(req(tenant="c"), now=0.0)
    assert full.reason is AdmissionReason.QUEUE_FULL
    assert full.retry_after_s is not None and 1.0 <= full.retry_after_s <= 60.0


def test_full_queue_evicts_newest_lower_class() -> None:
    q = queue(max_depth=2)
    old = req(tenant="a", priority=-1)
    new = req(tenant="b", priority=-1)
    q.offer(old, now=0.0)
    q.offer(new, now=1.0)
    a = q.offer(req(tenant="c", priority=1), now=2.0)
    assert a.queued and a.evicted is not None and a.evicted.request is new
    assert terminal_for(AdmissionReason.SHED_LOW_PRIORITY) is TerminalOutcome.SHED
    # same class cannot evict
    assert q.offer(req(tenant="d", priority=-1), now=2.0).reason is AdmissionReason.QUEUE_FULL


def test_edf_within_tenant_and_class() -> None:
    q = queue()
    late = req(arrival_s=0.0)
    early = req(arrival_s=0.0)
    q.offer(late, now=0.0, budget_s=50.0)
    q.offer(early, now=0.0, budget_s=10.0)
    first = q.next(now=1.0, capacity=1)
    assert first is not None and first.request is early


def test_strict_priority_between_classes() -> None:
    q = queue()
    batch = req(priority=-1)
    inter = req(priority=1)
    q.offer(batch, now=0.0)
    q.offer(inter, now=1.0)
    got = q.next(now=2.0, capacity=1)
    assert got is not None and got.request is inter


def test_aging_promotes_starved_class() -> None:
    q = queue(aging_s=10.0)
    batch = req(priority=-1, arrival_s=0.0)
    q.offer(batch, now=0.0)
    q.offer(req(priority=0, arrival_s=25.0), now=25.0)
    # batch waited 25 s -> two levels up (ties broken towards the higher base class)
    got = q.next(now=25.0, capacity=1)
    assert got is not None and got.request is batch


def test_tenant_concurrency_limit() -> None:
    q = queue(tenant_max_in_flight={"a": 1})
    first = req(tenant="a")
    assert q.offer(first, now=0.0, capacity=4).admitted
    a = q.offer(req(tenant="a"), now=0.0, capacity=4)
    assert a.reason is AdmissionReason.QUEUED_TENANT_LIMIT
    other = req(tenant="b")
    q.offer(other, now=0.0)
    got = q.next(now=0.0, capacity=4)
    assert got is not None and got.request is other  # a is skipped, not blocking b
    assert q.next(now=0.0, capacity=4) is None
    q.on_finish(first, now=1.0)
    got = q.next(now=1.0, capacity=4)
    assert got is not None and got.request.tenant == "a"
    assert q.in_flight("a") == 1


def test_expire_and_cancel() -> None:
    q = queue()
    r1, r2 = req(), req()
    q.offer(r1, now=0.0, budget_s=5.0)
    q.offer(r2, now=0.0, budget_s=50.0)
    assert q.next(now=6.0, capacity=1) is not None  # r2; r1 held for expire
    assert [(x.request, why) for x, why in q.expire(6.0)] == [(r1, AdmissionReason.EXPIRED)]
    r3 = req()
    q.offer(r3, now=7.0)
    got = q.cancel(r3.request_id)
    assert got is not None and q.depth == 0 and q.cancel(r3.request_id) is None


def test_from_params_validates() -> None:
    q = AdmissionQueue.from_params({"max_depth": 4, "budget_s": {"batch": 10}, "aging_s": 5})
    assert q.max_depth == 4 and q.aging_s == 5
    for bad in ({"max_depth": 0}, {"typo": 1}, {"tenant_weights": {"a": -1}}, {"budget_s": {"x": 1}}):
        with pytest.raises(InvalidPolicyConfig):
            AdmissionQueue.from_params(bad)


@given(heavy=st.integers(1, 60), light=st.integers(1, 10))
def test_light_tenant_not_starved_by_heavy_flood(heavy: int, light: int) -> None:
    q = queue(max_depth=1000, max_per_tenant=1000)
    for _ in range(heavy):
        q.offer(req(tenant="heavy"), now=0.0)
    lights = [req(tenant="light") for _ in range(light)]
    for r in lights:
        q.offer(r, now=0.0)
    order = []
    while (x := q.next(now=1.0, capacity=1)) is not None:
        order.append(x.request.tenant)
    # equal token costs: the light tenant's i-th request goes out within the first 2i dispatches
    positions = [i for i, t in enumerate(order) if t == "light"]
    for i, pos in enumerate(positions, start=1):
        assert pos < 2 * i
    assert len(order) == heavy + light


def test_weights_shift_the_share() -> None:
    q = queue(tenant_weights={"a": 3.0})
    for _ in range(40):
        q.offer(req(tenant="a"), now=0.0)
        q.offer(req(tenant="b"), now=0.0)
    first = [q.next(now=1.0, capacity=1) for _ in range(40)]
    share_a = sum(1 for x in first if x is not None and x.request.tenant == "a")
    assert 28 <= share_a <= 32


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("offer"),
            st.sampled_from(["a", "b", "c"]),
            st.integers(-1, 1),
            st.floats(0.5, 30.0),
            st.integers(0, 2),
        ),
        st.tuples(st.just("next"), st.integers(0, 2)),
        st.tuples(st.just("advance"), st.floats(0.0, 10.0)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
    ),
    max_size=80,
)


@settings(max_examples=150)
@given(ops)
def test_every_offered_request_reaches_exactly_one_terminal_outcome(steps: list[tuple[Any, ...]]) -> None:
    q = queue(max_depth=6, max_per_tenant=3, max_in_flight=2)
    ledger = OutcomeLedger()
    now = 0.0
    offered: list[RequestInfo] = []
    running: list[RequestInfo] = []

    def settle_expired() -> None:
        for item, why in q.expire(now):
            terminal = terminal_for(why)
            assert terminal is not None and ledger.settle(item.request.request_id, terminal)

    for step in steps:
        if step[0] == "offer":
            _, tenant, prio, budget, cap = step
            r = req(tenant=tenant, priority=prio, arrival_s=now)
            offered.append(r)
            assert ledger.open(r.request_id)
            a = q.offer(r, now=now, capacity=cap, budget_s=budget)
            if a.evicted is not None:
                assert ledger.settle(a.evicted.request.request_id, TerminalOutcome.SHED)
            if a.admitted:
                running.append(r)
                assert ledger.settle(r.request_id, TerminalOutcome.COMPLETED)
            elif a.rejected:
                terminal = terminal_for(a.reason)
                assert terminal is not None and ledger.settle(r.request_id, terminal)
        elif step[0] == "next":
            got = q.next(now=now, capacity=step[1])
            if got is not None:
                assert got.deadline_s > now
                running.append(got.request)
                assert ledger.settle(got.request.request_id, TerminalOutcome.COMPLETED)
        elif step[0] == "advance":
            now += step[1]
            settle_expired()
        elif step[0] == "cancel" and offered:
            r = offered[step[1] % len(offered)]
            if q.cancel(r.request_id) is not None:
                assert ledger.settle(r.request_id, TerminalOutcome.CANCELLED)
        elif step[0] == "finish" and running:
            done = running.pop(step[1] % len(running))
            q.on_finish(done, now=now)
        assert q.depth <= 6
        assert all(q.depth_of(t) <= 3 for t in "abc")
        assert all(0 <= q.in_flight(t) <= 2 for t in "abc")
    # drain: release every slot, dispatch what is dispatchable, expire the rest
    for r in running:
        q.on_finish(r, now=now)
    while (got := q.next(now=now, capacity=1)) is not None:
        assert ledger.settle(got.request.request_id, TerminalOutcome.COMPLETED)
        q.on_finish(got.request, now=now)
    now += 10_000.0
    settle_expired()
    assert q.depth == 0
    assert ledger.pending == frozenset() and ledger.duplicates == 0
    assert sum(ledger.counts.values()) == len(offered)
