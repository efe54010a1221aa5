"""The queued requests of one admission queue, indexed for its decisions (:class:`Backlog`).

Each queued request is one :class:`BacklogEntry`, held four ways: per class and tenant a heap by
deadline (earliest deadline first within a tenant), per class a deque in arrival order (the oldest
for aging, the newest to evict), one heap by deadline over all (expiry), and a map by request id
(cancel). Removal is lazy: an entry is marked removed and leaves the heaps and deques when it
surfaces, or when they are compacted at twice the live size, so memory stays O(depth) at amortised
O(1) per removal. The rules that read it are :class:`~tokenplane.core.admission.AdmissionQueue`'s.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from tokenplane.core.admission_decision import AdmissionReason, QueuedRequest
from tokenplane.core.priority import PriorityClass

__all__ = ["Backlog", "BacklogEntry", "EntryHeap", "clean", "compact"]


class BacklogEntry:
    __slots__ = ("item", "removed", "seq")

    def __init__(self, item: QueuedRequest, seq: int) -> None:
        self.item = item
        self.seq = seq
        self.removed = False


EntryHeap = list[tuple[float, int, BacklogEntry]]


class Backlog:
    """The queued requests by class and tenant, by arrival, by deadline and by id (module docstring)."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self.by_class: dict[PriorityClass, dict[str, EntryHeap]] = {c: {} for c in PriorityClass}
        self.order: dict[PriorityClass, deque[BacklogEntry]] = {c: deque() for c in PriorityClass}
        self.deadlines: EntryHeap = []
        self.by_id: dict[str, BacklogEntry] = {}
        self.tenant_depth: dict[str, int] = {}
        self.pending_expired: list[tuple[QueuedRequest, AdmissionReason]] = []

    def oldest_enqueued_s(self) -> float:
        """When the longest-queued request was queued; ``math.inf`` when nothing is."""
        oldest = math.inf
        for order in self.order.values():
            while order and order[0].removed:
                order.popleft()
            if order:
                oldest = min(oldest, order[0].item.enqueued_s)
        return oldest

    def newest_below(self, cls: PriorityClass) -> BacklogEntry | None:
        for lower in sorted(PriorityClass):
            if lower >= cls:
                return None
            order = self.order[lower]
            while order and order[-1].removed:
                order.pop()
            if order:
                return order[-1]
        return None

    def push(self, item: QueuedRequest) -> None:
        entry = BacklogEntry(item, next(self._seq))
        tenant = item.request.tenant
        heapq.heappush(
            self.by_class[item.priority].setdefault(tenant, []), (item.deadline_s, entry.seq, entry)
        )
        self.order[item.priority].append(entry)
        heapq.heappush(self.deadlines, (item.deadline_s, entry.seq, entry))
        self.by_id[item.request.request_id] = entry
        self.tenant_depth[tenant] = self.tenant_depth.get(tenant, 0) + 1

    def remove(self, entry: BacklogEntry) -> None:
        if entry.removed:
            return
        entry.removed = True
        item = entry.item
        del self.by_id[item.request.request_id]
        tenant = item.request.tenant
        left = self.tenant_depth[tenant] - 1
        if left:
            self.tenant_depth[tenant] = left
        else:
            del self.tenant_depth[tenant]
        heaps = self.by_class[item.priority]
        heap = heaps.get(tenant)
        if heap is not None:
            clean(heap)
            if not heap:
                del heaps[tenant]
            elif len(heap) > 2 * left + 16:
                compact(heap)
        # Removed entries linger in the order deques and the deadline heap until they surface;
        # compacting at twice the live size keeps memory O(depth) at amortised O(1) per removal.
        live = len(self.by_id)
        if len(self.deadlines) > 2 * live + 64:
            compact(self.deadlines)
        order = self.order[item.priority]
        if len(order) > 2 * live + 64:
            kept = [e for e in order if not e.removed]
            order.clear()
            order.extend(kept)

    def collect_expired(self, now: float) -> None:
        """Move every entry whose deadline is at or before ``now`` to :attr:`pending_expired`."""
        heap = self.deadlines
        while heap and (heap[0][2].removed or heap[0][0] <= now):
            entry = heapq.heappop(heap)[2]
            if not entry.removed:
                self.remove(entry)
                self.pending_expired.append((entry.item, AdmissionReason.EXPIRED))


def compact(heap: EntryHeap) -> None:
    heap[:] = [e for e in heap if not e[2].removed]
    heapq.heapify(heap)


def clean(heap: EntryHeap) -> None:
    while heap and heap[0][2].removed:
        heapq.heappop(heap)
