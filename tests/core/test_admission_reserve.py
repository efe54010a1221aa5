"""Class reserves: slots kept free of lower classes while a higher class is active."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.admission import AdmissionQueue, AdmissionReason, PriorityClass
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.state_store import LocalGaugeStore, SlidingWindowCounterStore
from tokenplane.core.views import RequestInfo

INTERACTIVE, STANDARD, BATCH = 1, 0, -1
_n = 0


def req(tenant: str, priority: int) -> RequestInfo:
    global _n
    _n += 1
    return RequestInfo(
        request_id=f"r{_n}",
        model="m",
        prompt_tokens=10,
        max_output_tokens=10,
        tenant=tenant,
        priority=priority,
    )


def queue(reserve: dict[str, float], window_s: float = 60.0) -> AdmissionQueue:
    return AdmissionQueue.from_params(
        {"reserve": reserve},
        store=SlidingWindowCounterStore(window_s),
        gauges=LocalGaugeStore(),
    )


def test_no_reserve_until_the_class_is_active() -> None:
    q = queue({"interactive": 0.5})
    # interactive has not been seen: a standard request may take the last of 4 slots
    assert q.offer(req("heavy", STANDARD), now=0.0, capacity=1, total_capacity=4).admitted


def test_an_active_class_keeps_its_reserve_free_of_lower_classes() -> None:
    q = queue({"interactive": 0.5})
    assert q.offer(req("light", INTERACTIVE), now=0.0, capacity=4, total_capacity=4).admitted
    # 3 free of 4; 2 are held for interactive: one standard request fits, the next waits
    assert q.offer(req("heavy", STANDARD), now=1.0, capacity=3, total_capacity=4).admitted
    a = q.offer(req("heavy", STANDARD), now=1.0, capacity=2, total_capacity=4)
    assert a.queued and a.reason is AdmissionReason.QUEUED_RESERVED
    # the queued standard request is not dispatched into the reserve...
    assert q.next(now=2.0, capacity=2, total_capacity=4) is None
    # ...an interactive arrival takes a reserved slot at once, past the waiting standard one
    assert q.offer(req("light", INTERACTIVE), now=2.0, capacity=2, total_capacity=4).admitted
    # and a free slot above the reserve goes to the standard request
    item = q.next(now=3.0, capacity=3, total_capacity=4)
    assert item is not None and item.request.tenant == "heavy"


def test_a_reserve_is_given_back_after_a_window_without_the_class() -> None:
    q = queue({"interactive": 0.5}, window_s=10.0)
    assert q.offer(req("light", INTERACTIVE), now=0.0, capacity=4, total_capacity=4).admitted
    assert q.reserved_above(PriorityClass.STANDARD, now=5.0, total_capacity=4) == 2
    assert q.reserved_above(PriorityClass.STANDARD, now=11.0, total_capacity=4) == 0
    assert q.offer(req("heavy", STANDARD), now=11.0, capacity=1, total_capacity=4).admitted


def test_reserves_of_classes_above_add_up_and_round_up() -> None:
    q = queue({"interactive": 0.25, "standard": 0.2})
    for priority in (INTERACTIVE, STANDARD):
        assert q.offer(req("x", priority), now=0.0, capacity=10, total_capacity=10).admitted
    assert q.reserved_above(PriorityClass.BATCH, now=1.0, total_capacity=10) == 5  # ceil(4.5)
    assert q.reserved_above(PriorityClass.STANDARD, now=1.0, total_capacity=10) == 3  # ceil(2.5)
    assert q.reserved_above(PriorityClass.INTERACTIVE, now=1.0, total_capacity=10) == 0
    assert q.reserved_above(PriorityClass.BATCH, now=1.0, total_capacity=8) == 4  # exactly 3.6 -> 4
    # a shell that passes no total reserves nothing
    assert q.reserved_above(PriorityClass.BATCH, now=1.0, total_capacity=None) == 0


@pytest.mark.parametrize(
    "reserve",
    [{"interactive": 1.0}, {"interactive": 0.6, "standard": 0.5}, {"batch": 0.1}, {"interactive": -0.1}],
)
def test_bad_reserves_are_refused(reserve: dict[str, float]) -> None:
    with pytest.raises(InvalidPolicyConfig):
        queue(reserve)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["offer", "finish", "pump"]), st.sampled_from([INTERACTIVE, STANDARD, BATCH])
        ),
        min_size=1,
        max_size=80,
    ),
    st.integers(min_value=1, max_value=12),
    st.sampled_from([0.2, 0.34, 0.5]),
)
def test_lower_classes_never_dispatch_into_an_active_reserve(
    ops: list[tuple[str, int]], total: int, fraction: float
) -> None:
    """Whatever the order of arrivals and finishes: a standard or batch request only dispatches while
    more slots are free than interactive's reserve (once interactive was dispatched), every
    dispatch has a free slot, and in-flight never exceeds the pool."""
    q = queue({"interactive": fraction})
    running: list[RequestInfo] = []
    interactive_seen = False
    held = -(-int(fraction * total * 1e9) // int(1e9))  # ceil without float residue
    t = 0.0

    def dispatched(r: RequestInfo, free_before: int) -> None:
        nonlocal interactive_seen
        assert free_before >= 1
        if r.priority != INTERACTIVE and interactive_seen:
            assert free_before - 1 >= held
        interactive_seen = interactive_seen or r.priority == INTERACTIVE
        running.append(r)

    for op, priority in ops:
        t += 0.1
        free = total - len(running)
        if op == "offer":
            r = req(f"t{priority}", priority)
            if q.offer(r, now=t, capacity=free, total_capacity=total).admitted:
                dispatched(r, free)
        elif op == "finish" and running:
            done = running.pop(0)
            q.on_finish(done, now=t)
        else:
            while (free := total - len(running)) > 0:
                item = q.next(now=t, capacity=free, total_capacity=total)
                if item is None:
                    break
                dispatched(item.request, free)
        assert len(running) <= total
