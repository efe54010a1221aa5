"""Admission: priority classes, a bounded per-pool queue, fair sharing between tenants, EDF within one.

Algorithm. One :class:`AdmissionQueue` per pool. A request is offered with its priority class (from
``RequestInfo.priority``: 1 interactive, 0 standard, -1 batch, as the gateway's tenant config maps
them) and a latency budget (per class by default); its deadline is ``arrival_s + budget``, capped by
the workflow's deadline when it has one.

``offer`` decides, in order:

1. ``DEADLINE_UNREACHABLE`` when ``now + predicted_service_s`` is already past the deadline;
2. ``ADMIT_NOW`` when the shell has a free slot for its class (``capacity`` above the slots held in
   reserve for higher classes, below), the tenant is under its in-flight limit and nothing
   dispatchable waits at the same or a higher class (no queue jumping);
3. ``TENANT_QUEUE_FULL`` when the tenant already has ``max_per_tenant`` queued;
4. when the pool queue holds ``max_depth``: evict the newest queued request of the lowest class
   strictly below this one (``SHED_LOW_PRIORITY``, handed back in ``Admission.evicted``: the one
   that has waited least loses least), or refuse with ``QUEUE_FULL``;
5. otherwise ``QUEUED``.

``next(now=, capacity=)`` picks what to dispatch: first the class (strict priority; with ``aging_s``
a class is promoted one level for each ``aging_s`` its oldest request has waited, so batch cannot
starve forever), then the tenant within the class by **least windowed service**: the tenant whose
dispatched tokens (``prompt_tokens + max_output_tokens``) over the counter store's window, divided by
its weight, are lowest (ties: earliest head deadline). This is weighted fair queueing with virtual
time = served tokens / weight, kept over a sliding window so that a tenant idle for a while does not
bank unlimited credit, and kept in the shared :class:`CounterStore` so that several gateway
replicas share one view of who was served. A tenant with backlog whose service lags another's is
always served before it, so a light tenant's request is dispatched as soon as it is the least-served
tenant: with one heavy flooder, at the next dispatch of its class. Within the tenant: earliest
deadline first. Tenants at their in-flight limit are skipped (not blocked on).

**Class reserves.** ``reserve: {interactive: 0.4}`` keeps 40 % of the pool's slots (rounded up, of
``total_capacity``, which the shell passes with ``capacity``) out of lower classes' reach while
that class is *active* (dispatched within the store's window): a standard or batch request
dispatches only while more slots are free than the reserves of the active classes above it add up
to. Without preemption in the engine this is the one way a burst of interactive requests finds free
slots at once when a flood of long standard requests could otherwise hold every slot for the length
of a generation; the price is reserved slots idle while the class sends less than they hold. A class
idle for a window gives its reserve back (work-conserving when it is absent). Nothing is reserved
when the shell passes no ``total_capacity``.

Dispatch decisions (``ADMIT_NOW`` and ``next``) reserve the tenant's in-flight slot and record the
served tokens at once (there is no window between deciding and counting); the shell calls
``on_finish`` when the request leaves the upstream, whatever its fate. ``on_start`` counts work
started without the queue. ``expire(now)`` hands back queued requests whose deadline has passed;
``cancel(request_id)`` removes one whose client left. With the shedder and the queue together every
offered request ends in exactly one of: dispatched, rejected, evicted, expired, cancelled.

Refusals carry ``retry_after_s`` = queued depth / recent dispatch rate (dispatches in the store's
window / window), clamped to ``[retry_after_min_s, retry_after_max_s]``; ``retry_after_default_s``
when nothing was dispatched recently. The gateway rounds it up for ``Retry-After``.

Params, their defaults and how a config mapping is read: :mod:`.admission_params`. The
queued requests' indexes and their lazy deletion: :mod:`.admission_backlog`.

Cost: ``offer`` O(log n) plus O(tenants queued at >= its class) for the no-jumping check; ``next``
O(classes + tenants in the chosen class) store reads plus O(log n); memory O(queued). Lazy deletion
keeps removed entries in heaps until they surface.

Failure modes: the in-flight counts are only as right as the shell's ``on_finish`` calls (a missed
call leaks a slot until restart); fairness is over the store's window, so two tenants' shares even
out over that window, not per request; a shared store read with lag can let two replicas both favour
the same tenant for one sync period.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Any

from tokenplane.core.admission_backlog import Backlog, clean
from tokenplane.core.admission_decision import (
    Admission,
    AdmissionDecision,
    AdmissionReason,
    QueuedRequest,
    terminal_for,
)
from tokenplane.core.admission_params import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_PER_TENANT,
    DEFAULT_RETRY_AFTER_DEFAULT_S,
    DEFAULT_RETRY_AFTER_MAX_S,
    DEFAULT_RETRY_AFTER_MIN_S,
    DEFAULT_WINDOW_S,
    queue_from_params,
)
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.priority import PriorityClass
from tokenplane.core.state_store import CounterStore, GaugeStore
from tokenplane.core.views import RequestInfo

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_PER_TENANT",
    "DEFAULT_RETRY_AFTER_DEFAULT_S",
    "DEFAULT_RETRY_AFTER_MAX_S",
    "DEFAULT_RETRY_AFTER_MIN_S",
    "DEFAULT_WINDOW_S",
    "Admission",
    "AdmissionDecision",
    "AdmissionQueue",
    "AdmissionReason",
    "PriorityClass",
    "QueuedRequest",
    "request_cost_tokens",
    "terminal_for",
]

_AT_OR_ABOVE: Mapping[PriorityClass, tuple[PriorityClass, ...]] = {
    c: tuple(x for x in PriorityClass if x >= c) for c in PriorityClass
}


def request_cost_tokens(request: RequestInfo) -> int:
    """The token weight of a request for fair sharing and budgets."""
    return max(1, request.prompt_tokens + request.max_output_tokens)


class AdmissionQueue:
    def __init__(
        self,
        *,
        store: CounterStore,
        gauges: GaugeStore,
        pool: str = "default",
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_per_tenant: int = DEFAULT_MAX_PER_TENANT,
        max_in_flight: int | None = None,
        tenant_max_in_flight: Mapping[str, int] | None = None,
        tenant_weights: Mapping[str, float] | None = None,
        reserve: Mapping[PriorityClass, float] | None = None,
        budget_s: Mapping[PriorityClass, float] | None = None,
        aging_s: float | None = None,
        retry_after_min_s: float = DEFAULT_RETRY_AFTER_MIN_S,
        retry_after_max_s: float = DEFAULT_RETRY_AFTER_MAX_S,
        retry_after_default_s: float = DEFAULT_RETRY_AFTER_DEFAULT_S,
    ) -> None:
        if max_depth < 1 or max_per_tenant < 1:
            raise InvalidPolicyConfig("admission: max_depth and max_per_tenant must be >= 1")
        if aging_s is not None and not aging_s > 0:
            raise InvalidPolicyConfig(f"admission: aging_s must be > 0 or null, got {aging_s}")
        if not 0 < retry_after_min_s <= retry_after_max_s:
            raise InvalidPolicyConfig("admission: need 0 < retry_after_min_s <= retry_after_max_s")
        weights = dict(tenant_weights or {})
        if any(not (w > 0 and math.isfinite(w)) for w in weights.values()):
            raise InvalidPolicyConfig(f"admission: tenant weights must be finite and > 0, got {weights}")
        reserves = {c: float(f) for c, f in (reserve or {}).items() if f}
        if any(not 0 < f < 1 for f in reserves.values()) or sum(reserves.values()) >= 1:
            raise InvalidPolicyConfig(
                f"admission: reserve fractions must be in (0, 1) and sum below 1, got {reserves}"
            )
        if PriorityClass.BATCH in reserves:
            raise InvalidPolicyConfig("admission: no class is below batch, so a batch reserve keeps nothing")
        budgets = dict(DEFAULT_BUDGET_S)
        budgets.update(budget_s or {})
        if any(not b > 0 for b in budgets.values()):
            raise InvalidPolicyConfig(f"admission: budgets must be > 0, got {budgets}")
        self._store = store
        self._gauges = gauges
        self._prefix = f"adm:{pool}:"
        self.max_depth = max_depth
        self.max_per_tenant = max_per_tenant
        self._default_limit = max_in_flight
        self._limits = dict(tenant_max_in_flight or {})
        self._weights = weights
        self._reserves = reserves
        # per class: the classes strictly above it that hold a reserve
        self._reserved_above = {c: tuple(k for k in reserves if k > c) for c in PriorityClass}
        self._budgets = budgets
        self.aging_s = aging_s
        self._ra = (retry_after_min_s, retry_after_max_s, retry_after_default_s)
        self._backlog = Backlog()

    # ---- construction from config -------------------------------------------------------------

    @classmethod
    def from_params(
        cls,
        params: Mapping[str, Any],
        *,
        store: CounterStore | None = None,
        gauges: GaugeStore | None = None,
        pool: str = "default",
    ) -> AdmissionQueue:
        """Build from a config mapping (keys and defaults: :mod:`.admission_params`)."""
        return queue_from_params(cls, params, store=store, gauges=gauges, pool=pool)

    # ---- reads ------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self._backlog.by_id)

    def depth_of(self, tenant: str) -> int:
        return self._backlog.tenant_depth.get(tenant, 0)

    def in_flight(self, tenant: str) -> int:
        return int(self._gauges.get(self._prefix + "inflight:" + tenant))

    def limit_of(self, tenant: str) -> int | None:
        return self._limits.get(tenant, self._default_limit)

    def served_tokens(self, tenant: str, *, now: float) -> float:
        return self._store.get(self._prefix + "served:" + tenant, now=now)

    def oldest_wait_s(self, *, now: float) -> float:
        oldest = self._backlog.oldest_enqueued_s()
        return 0.0 if oldest == math.inf else max(0.0, now - oldest)

    def deadline_for(
        self, request: RequestInfo, priority: PriorityClass, budget_s: float | None = None
    ) -> float:
        deadline = request.arrival_s + (self._budgets[priority] if budget_s is None else budget_s)
        workflow = request.workflow
        if workflow is not None and workflow.deadline_s is not None:
            deadline = min(deadline, workflow.deadline_s)
        return deadline

    def reserved_above(self, cls: PriorityClass, *, now: float, total_capacity: int | None) -> int:
        """Slots a ``cls`` request must leave free: the reserves of the active classes above it."""
        above = self._reserved_above[cls]
        if not above or total_capacity is None or total_capacity <= 0:
            return 0
        store, prefix = self._store, self._prefix + "class:"
        fraction = sum(self._reserves[k] for k in above if store.get(prefix + k.label, now=now) > 0)
        return math.ceil(fraction * total_capacity - 1e-9)

    def retry_after_s(self, *, now: float) -> float:
        lo, hi, default = self._ra
        rate = self._store.get(self._prefix + "dispatched", now=now) / self._store.window_s
        if rate <= 0:
            return default
        return min(hi, max(lo, (self.depth + 1) / rate))

    # ---- decisions --------------------------------------------------------------------------

    def offer(
        self,
        request: RequestInfo,
        *,
        now: float,
        capacity: int = 0,
        total_capacity: int | None = None,
        priority: PriorityClass | None = None,
        budget_s: float | None = None,
        predicted_service_s: float = 0.0,
    ) -> Admission:
        """``capacity``: free slots in the pool now; ``total_capacity``: all its slots (for reserves)."""
        cls = PriorityClass.from_value(request.priority) if priority is None else priority
        deadline = self.deadline_for(request, cls, budget_s)
        if now + predicted_service_s >= deadline:
            return Admission(AdmissionDecision.REJECTED, AdmissionReason.DEADLINE_UNREACHABLE, cls, deadline)
        self._backlog.collect_expired(now)  # expired entries must not keep a newcomer from a free slot
        tenant = request.tenant
        tenant_ok = self._under_limit(tenant)
        held = self.reserved_above(cls, now=now, total_capacity=total_capacity) if capacity > 0 else 0
        if capacity > held and tenant_ok and not self._dispatchable_at_or_above(cls):
            self._reserve(request, cls, request_cost_tokens(request), now)
            return Admission(AdmissionDecision.ADMIT_NOW, AdmissionReason.ADMITTED, cls, deadline)
        if self.depth_of(tenant) >= self.max_per_tenant:
            return Admission(
                AdmissionDecision.REJECTED, AdmissionReason.TENANT_QUEUE_FULL, cls, deadline,
                retry_after_s=self.retry_after_s(now=now),
            )  # fmt: skip
        evicted: QueuedRequest | None = None
        if self.depth >= self.max_depth:
            victim = self._backlog.newest_below(cls)
            if victim is None:
                return Admission(
                    AdmissionDecision.REJECTED, AdmissionReason.QUEUE_FULL, cls, deadline,
                    retry_after_s=self.retry_after_s(now=now),
                )  # fmt: skip
            self._backlog.remove(victim)
            evicted = victim.item
        item = QueuedRequest(request, cls, deadline, now, request_cost_tokens(request))
        self._backlog.push(item)
        if not tenant_ok:
            reason = AdmissionReason.QUEUED_TENANT_LIMIT
        elif held and capacity <= held:
            reason = AdmissionReason.QUEUED_RESERVED
        elif capacity > 0:
            reason = AdmissionReason.QUEUED_BEHIND
        else:
            reason = AdmissionReason.QUEUED_NO_CAPACITY
        return Admission(AdmissionDecision.QUEUED, reason, cls, deadline, evicted=evicted)

    def next(self, *, now: float, capacity: int, total_capacity: int | None = None) -> QueuedRequest | None:
        """Pop the request to dispatch now, or ``None``; expired heads are held for :meth:`expire`.
        A class whose free slots are all held in reserve for classes above it is passed over."""
        if capacity <= 0 or not self._backlog.by_id:
            return None
        self._backlog.collect_expired(now)
        best: tuple[float, int, PriorityClass] | None = None
        for cls in PriorityClass:
            if not self._has_dispatchable(cls):
                continue
            if capacity <= self.reserved_above(cls, now=now, total_capacity=total_capacity):
                continue
            level = float(cls)
            if self.aging_s is not None:
                order = self._backlog.order[cls]
                while order[0].removed:  # a dispatchable entry exists, so this stops
                    order.popleft()
                level += math.floor(max(0.0, now - order[0].item.enqueued_s) / self.aging_s)
            key = (level, int(cls), cls)
            if best is None or key > best:
                best = key
        if best is None:
            return None
        cls = best[2]
        chosen: tuple[float, float, int, str] | None = None
        for tenant, heap in self._backlog.by_class[cls].items():
            if not self._under_limit(tenant):
                continue
            clean(heap)
            if not heap:
                continue
            share = self.served_tokens(tenant, now=now) / self._weights.get(tenant, 1.0)
            candidate = (share, heap[0][0], heap[0][1], tenant)
            if chosen is None or candidate < chosen:
                chosen = candidate
        if chosen is None:  # unreachable: _has_dispatchable found one
            return None
        entry = heapq.heappop(self._backlog.by_class[cls][chosen[3]])[2]
        self._backlog.remove(entry)
        self._reserve(entry.item.request, cls, entry.item.cost_tokens, now)
        return entry.item

    def expire(self, now: float) -> list[tuple[QueuedRequest, AdmissionReason]]:
        """Remove and return every queued request whose deadline is at or before ``now``."""
        backlog = self._backlog
        backlog.collect_expired(now)
        out, backlog.pending_expired = backlog.pending_expired, []
        return out

    def cancel(self, request_id: str) -> QueuedRequest | None:
        entry = self._backlog.by_id.get(request_id)
        if entry is None:
            return None
        self._backlog.remove(entry)
        return entry.item

    # ---- observations -----------------------------------------------------------------------

    def on_start(self, request: RequestInfo, *, now: float) -> None:
        """Count a request started without this queue's decision (ADMIT_NOW/next count their own)."""
        self._reserve(request, PriorityClass.from_value(request.priority), request_cost_tokens(request), now)

    def on_finish(self, request: RequestInfo, *, now: float) -> None:
        key = self._prefix + "inflight:" + request.tenant
        if self._gauges.get(key) >= 1:
            self._gauges.add(key, -1)

    # ---- internals --------------------------------------------------------------------------

    def _under_limit(self, tenant: str) -> bool:
        limit = self.limit_of(tenant)
        return limit is None or self.in_flight(tenant) < limit

    def _reserve(self, request: RequestInfo, cls: PriorityClass, cost: int, now: float) -> None:
        self._gauges.add(self._prefix + "inflight:" + request.tenant, 1)
        store = self._store
        store.add(self._prefix + "served:" + request.tenant, cost, now=now)
        store.add(self._prefix + "dispatched", 1, now=now)
        if self._reserves:
            store.add(self._prefix + "class:" + cls.label, 1, now=now)

    def _has_dispatchable(self, cls: PriorityClass) -> bool:
        for tenant, heap in self._backlog.by_class[cls].items():
            clean(heap)
            if heap and self._under_limit(tenant):
                return True
        return False

    def _dispatchable_at_or_above(self, cls: PriorityClass) -> bool:
        if not self._backlog.by_id:  # the common case on the request path: nothing queued
            return False
        return any(self._has_dispatchable(c) for c in _AT_OR_ABOVE[cls])
