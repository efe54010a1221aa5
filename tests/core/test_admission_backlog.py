"""The admission queue's Backlog: its four indexes agree on what is queued, whatever the sequence of
pushes, removals (lazy, with compaction) and expiries."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.admission_backlog import Backlog, BacklogEntry
from tokenplane.core.admission_decision import AdmissionReason, QueuedRequest
from tokenplane.core.priority import PriorityClass
from tokenplane.core.views import RequestInfo

TENANTS = ("a", "b", "c")


def item(n: int, tenant: str, cls: PriorityClass, deadline_s: float, enqueued_s: float) -> QueuedRequest:
    request = RequestInfo(request_id=f"r{n}", model="m", prompt_tokens=1, max_output_tokens=1, tenant=tenant)
    return QueuedRequest(request, cls, deadline_s, enqueued_s, 2)


def live(entries: list[BacklogEntry]) -> list[QueuedRequest]:
    return [e.item for e in entries if not e.removed]


# One operation: ("push", tenant index, class, deadline) | ("remove", which) | ("expire", now)
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.integers(0, len(TENANTS) - 1),
            st.sampled_from(list(PriorityClass)),
            st.floats(1.0, 100.0),
        ),
        st.tuples(st.just("remove"), st.integers(0, 10_000)),
        st.tuples(st.just("expire"), st.floats(0.0, 100.0)),
    ),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_the_indexes_agree_on_what_is_queued(ops: list[tuple[object, ...]]) -> None:
    b = Backlog()
    queued: dict[str, QueuedRequest] = {}  # the model: what should be queued, by request id
    expired: list[str] = []
    clock = 0.0
    for n, op in enumerate(ops):
        clock += 0.5
        if op[0] == "push":
            _, t, cls, deadline = op
            assert isinstance(t, int) and isinstance(cls, PriorityClass) and isinstance(deadline, float)
            it = item(n, TENANTS[t], cls, deadline, clock)
            b.push(it)
            queued[it.request.request_id] = it
        elif op[0] == "remove" and queued:
            which = op[1]
            assert isinstance(which, int)
            rid = sorted(queued)[which % len(queued)]
            entry = b.by_id[rid]
            b.remove(entry)
            b.remove(entry)  # a second removal of the same entry: no effect
            del queued[rid]
        elif op[0] == "expire":
            now = op[1]
            assert isinstance(now, float)
            b.collect_expired(now)
            due = [r for r, q in queued.items() if q.deadline_s <= now]
            # handed back earliest deadline first (ties: first pushed)
            for rid in sorted(due, key=lambda r: (queued[r].deadline_s, int(r[1:]))):
                del queued[rid]
                expired.append(rid)
        assert set(b.by_id) == set(queued)
        assert sum(b.tenant_depth.values()) == len(queued)
        for tenant in TENANTS:
            assert b.tenant_depth.get(tenant, 0) == sum(
                1 for q in queued.values() if q.request.tenant == tenant
            )
        for cls in PriorityClass:
            in_heaps = [e.item for heap in b.by_class[cls].values() for _, _, e in heap if not e.removed]
            in_order = live(list(b.order[cls]))
            want = sorted(r for r, q in queued.items() if q.priority is cls)
            assert sorted(q.request.request_id for q in in_heaps) == want
            assert sorted(q.request.request_id for q in in_order) == want
            # arrival order is kept: the deque's live entries are in enqueue order
            assert [q.enqueued_s for q in in_order] == sorted(q.enqueued_s for q in in_order)
        assert sorted(e.item.request.request_id for _, _, e in b.deadlines if not e.removed) == sorted(queued)
        # removed entries are compacted away: memory stays O(depth)
        assert len(b.deadlines) <= 2 * len(queued) + 64 + 1
    assert [q.request.request_id for q, _ in b.pending_expired] == expired
    assert all(reason is AdmissionReason.EXPIRED for _, reason in b.pending_expired)
    oldest = min((q.enqueued_s for q in queued.values()), default=math.inf)
    assert b.oldest_enqueued_s() == oldest


def test_newest_below_is_the_latest_of_the_lowest_class_strictly_below() -> None:
    b = Backlog()
    b.push(item(1, "a", PriorityClass.STANDARD, 50.0, 1.0))
    b.push(item(2, "a", PriorityClass.BATCH, 50.0, 2.0))
    b.push(item(3, "b", PriorityClass.BATCH, 50.0, 3.0))
    newest = b.newest_below(PriorityClass.INTERACTIVE)
    assert newest is not None and newest.item.request.request_id == "r3"
    b.remove(newest)
    again = b.newest_below(PriorityClass.STANDARD)
    assert again is not None and again.item.request.request_id == "r2"
    assert b.newest_below(PriorityClass.BATCH) is None


def test_expiry_is_by_deadline_not_arrival() -> None:
    b = Backlog()
    b.push(item(1, "a", PriorityClass.STANDARD, 30.0, 1.0))
    b.push(item(2, "a", PriorityClass.STANDARD, 10.0, 2.0))
    b.collect_expired(10.0)
    assert [q.request.request_id for q, _ in b.pending_expired] == ["r2"]
    assert set(b.by_id) == {"r1"} and b.tenant_depth == {"a": 1}


def test_removed_entries_are_compacted_away() -> None:
    b = Backlog()
    for n in range(400):
        b.push(item(n, "a", PriorityClass.STANDARD, 50.0 + n, float(n)))
    for n in range(10, 400):  # the first ten stay at the heads: nothing removed surfaces
        b.remove(b.by_id[f"r{n}"])
    assert len(b.by_id) == 10
    assert len(b.deadlines) <= 2 * 10 + 64
    assert len(b.order[PriorityClass.STANDARD]) <= 2 * 10 + 64
    assert len(b.by_class[PriorityClass.STANDARD]["a"]) <= 2 * 10 + 16
