"""A minimal deterministic discrete-event kernel.

A heap of ``(time, seq, callback, arg)``: ties in time break in insertion order (as in SimPy's
core), so the same inputs always give the same event order. Cancellation is lazy: an owner that
reschedules bumps its own version and ignores stale callbacks.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

_LATE = 1 << 62
_heappush = heapq.heappush


class EventLoop:
    __slots__ = ("_heap", "_seq", "now")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[float, Any], None], Any]] = []
        self._seq = 0
        self.now = 0.0

    def schedule(self, at: float, callback: Callable[[float, Any], None], arg: Any = None) -> None:
        if at < self.now:
            at = self.now
        seq = self._seq = self._seq + 1
        _heappush(self._heap, (at, seq, callback, arg))

    def schedule_late(self, at: float, callback: Callable[[float, Any], None], arg: Any = None) -> None:
        """Like :meth:`schedule`, but after every ordinary event at the same time, even later ones."""
        if at < self.now:
            at = self.now
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq + _LATE, callback, arg))

    def __len__(self) -> int:
        return len(self._heap)

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until: float | None = None, on_progress: Callable[[float], None] | None = None) -> None:
        heap = self._heap
        pop = heapq.heappop
        if until is None and on_progress is None:  # the common case, without the per-event checks
            while heap:
                at, _, callback, arg = pop(heap)
                self.now = at
                callback(at, arg)
            return
        count = 0
        while heap:
            if until is not None and heap[0][0] > until:
                self.now = until
                return
            at, _, callback, arg = pop(heap)
            self.now = at
            callback(at, arg)
            count += 1
            if on_progress is not None and count & 0x3FFF == 0:
                on_progress(at)
