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

Params (:meth:`AdmissionQueue.from_params`)::

    max_depth: 1024                 # queued requests per pool
    max_per_tenant: 256             # queued requests per tenant in this pool
    max_in_flight: null             # default per-tenant in-flight limit (null: none)
    tenant_max_in_flight: {}        # per-tenant overrides
    tenant_weights: {}              # fair-share weights (> 0), default 1
    reserve: {}                     # class -> fraction of the pool's slots kept for it and above
    budget_s: {interactive: 30, standard: 120, batch: 3600}
    aging_s: null                   # null: strict priority
    retry_after_min_s: 1, retry_after_max_s: 60, retry_after_default_s: 5

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
import itertools
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from tokenplane.core.admission_decision import (
    Admission,
    AdmissionDecision,
    AdmissionReason,
    QueuedRequest,
    terminal_for,
)
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.priority import PriorityClass
from tokenplane.core.state_store import (
    CounterStore,
    GaugeStore,
    LocalGaugeStore,
    SlidingWindowCounterStore,
)
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

DEFAULT_MAX_DEPTH = 1024
DEFAULT_MAX_PER_TENANT = 256
DEFAULT_BUDGET_S: Mapping[PriorityClass, float] = {
    PriorityClass.INTERACTIVE: 30.0,
    PriorityClass.STANDARD: 120.0,
    PriorityClass.BATCH: 3600.0,
}
DEFAULT_RETRY_AFTER_MIN_S = 1.0
DEFAULT_RETRY_AFTER_MAX_S = 60.0
DEFAULT_RETRY_AFTER_DEFAULT_S = 5.0
DEFAULT_WINDOW_S = 60.0

_AT_OR_ABOVE: Mapping[PriorityClass, tuple[PriorityClass, ...]] = {
    c: tuple(x for x in PriorityClass if x >= c) for c in PriorityClass
}


class _Entry:
    __slots__ = ("item", "removed", "seq")

    def __init__(self, item: QueuedRequest, seq: int) -> None:
        self.item = item
        self.seq = seq
        self.removed = False


_Heap = list[tuple[float, int, _Entry]]


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
        self._seq = itertools.count()
        self._by_class: dict[PriorityClass, dict[str, _Heap]] = {c: {} for c in PriorityClass}
        self._order: dict[PriorityClass, deque[_Entry]] = {c: deque() for c in PriorityClass}
        self._deadlines: _Heap = []
        self._by_id: dict[str, _Entry] = {}
        self._tenant_depth: dict[str, int] = {}
        self._pending_expired: list[tuple[QueuedRequest, AdmissionReason]] = []

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
        owner = "admission 'fair-queue'"
        keys = (
            "max_depth", "max_per_tenant", "max_in_flight", "tenant_max_in_flight", "tenant_weights",
            "reserve", "budget_s", "aging_s", "retry_after_min_s", "retry_after_max_s",
            "retry_after_default_s", "window_s",
        )  # fmt: skip
        r = ParamReader(owner, params, keys)

        def positive(key: str, default: float) -> float:
            return r.float_(key, default, min_value=0.0, exclusive_min=True)

        max_in_flight = None if r.raw("max_in_flight") is None else r.int_("max_in_flight", 0, min_value=1)
        aging_s = None if r.raw("aging_s") is None else positive("aging_s", 0.0)
        budgets = _mapping(owner, r.raw("budget_s"), "budget_s", 1e-9)
        reserves = _mapping(owner, r.raw("reserve"), "reserve", 0.0)
        limits = _mapping(owner, r.raw("tenant_max_in_flight"), "tenant_max_in_flight", 1)
        if any(v != int(v) for v in limits.values()):
            raise InvalidPolicyConfig(f"{owner}: tenant_max_in_flight values must be integers")
        return cls(
            store=store or SlidingWindowCounterStore(positive("window_s", DEFAULT_WINDOW_S)),
            gauges=gauges or LocalGaugeStore(),
            pool=pool,
            max_depth=r.int_("max_depth", DEFAULT_MAX_DEPTH, min_value=1),
            max_per_tenant=r.int_("max_per_tenant", DEFAULT_MAX_PER_TENANT, min_value=1),
            max_in_flight=max_in_flight,
            tenant_max_in_flight={k: int(v) for k, v in limits.items()},
            tenant_weights=_mapping(owner, r.raw("tenant_weights"), "tenant_weights", 1e-9),
            reserve={PriorityClass.from_name(k): v for k, v in reserves.items()},
            budget_s={PriorityClass.from_name(k): v for k, v in budgets.items()},
            aging_s=aging_s,
            retry_after_min_s=positive("retry_after_min_s", DEFAULT_RETRY_AFTER_MIN_S),
            retry_after_max_s=positive("retry_after_max_s", DEFAULT_RETRY_AFTER_MAX_S),
            retry_after_default_s=r.float_(
                "retry_after_default_s", DEFAULT_RETRY_AFTER_DEFAULT_S, min_value=0
            ),
        )

    # ---- reads ------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self._by_id)

    def depth_of(self, tenant: str) -> int:
        return self._tenant_depth.get(tenant, 0)

    def in_flight(self, tenant: str) -> int:
        return int(self._gauges.get(self._prefix + "inflight:" + tenant))

    def limit_of(self, tenant: str) -> int | None:
        return self._limits.get(tenant, self._default_limit)

    def served_tokens(self, tenant: str, *, now: float) -> float:
        return self._store.get(self._prefix + "served:" + tenant, now=now)

    def oldest_wait_s(self, *, now: float) -> float:
        oldest = math.inf
        for order in self._order.values():
            while order and order[0].removed:
                order.popleft()
            if order:
                oldest = min(oldest, order[0].item.enqueued_s)
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
        self._collect_expired(now)  # expired entries must not keep a newcomer from a free slot
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
            victim = self._newest_below(cls)
            if victim is None:
                return Admission(
                    AdmissionDecision.REJECTED, AdmissionReason.QUEUE_FULL, cls, deadline,
                    retry_after_s=self.retry_after_s(now=now),
                )  # fmt: skip
            self._remove(victim)
            evicted = victim.item
        item = QueuedRequest(request, cls, deadline, now, request_cost_tokens(request))
        self._push(item)
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
        if capacity <= 0 or not self._by_id:
            return None
        self._collect_expired(now)
        best: tuple[float, int, PriorityClass] | None = None
        for cls in PriorityClass:
            if not self._has_dispatchable(cls):
                continue
            if capacity <= self.reserved_above(cls, now=now, total_capacity=total_capacity):
                continue
            level = float(cls)
            if self.aging_s is not None:
                order = self._order[cls]
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
        for tenant, heap in self._by_class[cls].items():
            if not self._under_limit(tenant):
                continue
            _clean(heap)
            if not heap:
                continue
            share = self.served_tokens(tenant, now=now) / self._weights.get(tenant, 1.0)
            candidate = (share, heap[0][0], heap[0][1], tenant)
            if chosen is None or candidate < chosen:
                chosen = candidate
        if chosen is None:  # unreachable: _has_dispatchable found one
            return None
        entry = heapq.heappop(self._by_class[cls][chosen[3]])[2]
        self._remove(entry)
        self._reserve(entry.item.request, cls, entry.item.cost_tokens, now)
        return entry.item

    def expire(self, now: float) -> list[tuple[QueuedRequest, AdmissionReason]]:
        """Remove and return every queued request whose deadline is at or before ``now``."""
        self._collect_expired(now)
        out, self._pending_expired = self._pending_expired, []
        return out

    def cancel(self, request_id: str) -> QueuedRequest | None:
        entry = self._by_id.get(request_id)
        if entry is None:
            return None
        self._remove(entry)
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
        for tenant, heap in self._by_class[cls].items():
            _clean(heap)
            if heap and self._under_limit(tenant):
                return True
        return False

    def _dispatchable_at_or_above(self, cls: PriorityClass) -> bool:
        if not self._by_id:  # the common case on the request path: nothing queued
            return False
        return any(self._has_dispatchable(c) for c in _AT_OR_ABOVE[cls])

    def _newest_below(self, cls: PriorityClass) -> _Entry | None:
        for lower in sorted(PriorityClass):
            if lower >= cls:
                return None
            order = self._order[lower]
            while order and order[-1].removed:
                order.pop()
            if order:
                return order[-1]
        return None

    def _push(self, item: QueuedRequest) -> None:
        entry = _Entry(item, next(self._seq))
        tenant = item.request.tenant
        heapq.heappush(
            self._by_class[item.priority].setdefault(tenant, []), (item.deadline_s, entry.seq, entry)
        )
        self._order[item.priority].append(entry)
        heapq.heappush(self._deadlines, (item.deadline_s, entry.seq, entry))
        self._by_id[item.request.request_id] = entry
        self._tenant_depth[tenant] = self._tenant_depth.get(tenant, 0) + 1

    def _remove(self, entry: _Entry) -> None:
        if entry.removed:
            return
        entry.removed = True
        item = entry.item
        del self._by_id[item.request.request_id]
        tenant = item.request.tenant
        left = self._tenant_depth[tenant] - 1
        if left:
            self._tenant_depth[tenant] = left
        else:
            del self._tenant_depth[tenant]
        heaps = self._by_class[item.priority]
        heap = heaps.get(tenant)
        if heap is not None:
            _clean(heap)
            if not heap:
                del heaps[tenant]
            elif len(heap) > 2 * left + 16:
                _compact(heap)
        # Removed entries linger in the order deques and the deadline heap until they surface;
        # compacting at twice the live size keeps memory O(depth) at amortised O(1) per removal.
        live = len(self._by_id)
        if len(self._deadlines) > 2 * live + 64:
            _compact(self._deadlines)
        order = self._order[item.priority]
        if len(order) > 2 * live + 64:
            kept = [e for e in order if not e.removed]
            order.clear()
            order.extend(kept)

    def _collect_expired(self, now: float) -> None:
        heap = self._deadlines
        while heap and (heap[0][2].removed or heap[0][0] <= now):
            entry = heapq.heappop(heap)[2]
            if not entry.removed:
                self._remove(entry)
                self._pending_expired.append((entry.item, AdmissionReason.EXPIRED))


def _compact(heap: _Heap) -> None:
    heap[:] = [e for e in heap if not e[2].removed]
    heapq.heapify(heap)


def _clean(heap: _Heap) -> None:
    while heap and heap[0][2].removed:
        heapq.heappop(heap)


def _mapping(owner: str, raw: Any, key: str, min_value: float = 0.0) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidPolicyConfig(f"{owner}: param {key!r} must be a mapping, got {raw!r}")
    out: dict[str, float] = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < min_value:
            raise InvalidPolicyConfig(
                f"{owner}: param {key!r}[{k!r}] must be a number >= {min_value}, got {v!r}"
            )
        out[str(k)] = float(v)
    return out
