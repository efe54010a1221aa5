"""A sliding window of ``(time, value)`` pairs kept as two arrays of doubles.

Counter windows and breaker windows hold one pair per request for their window (30 s of a few
thousand requests a second is ~100,000 pairs). As a deque of tuples each pair was a tuple the cyclic
collector tracked when made, and the deque was a container every full collection walked item by
item (one cache miss per item: ~20 ms per 100,000). Two ``array('d')`` hold the same in 16 bytes a
pair, as raw doubles: a collection visits each array once, never its elements. Expiry moves a
head index; the dead front is cut off once it is the larger part, so each pair is copied at most
about once: O(1) amortised.

Pairs are expected in time order (the shells pass a monotonic clock). Like the deques before them,
expiry stops at the first pair newer than the horizon, so one out of order waits for those before it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["TimedSeries"]

_COMPACT_MIN = 1024
_NONE: tuple[float, ...] = ()  # what most calls expire: no allocation for it


class TimedSeries:
    __slots__ = ("_head", "_times", "_values")

    def __init__(self) -> None:
        self._times = array("d")
        self._values = array("d")
        self._head = 0

    def __len__(self) -> int:
        return len(self._times) - self._head

    def append(self, t: float, value: float) -> None:
        self._times.append(t)
        self._values.append(value)

    def expire(self, horizon: float) -> Sequence[float]:
        """Remove the pairs from the front with time <= ``horizon``; return their values in order."""
        times = self._times
        head = start = self._head
        n = len(times)
        while head < n and times[head] <= horizon:
            head += 1
        if head == start:
            return _NONE
        out = self._values[start:head]
        if head == n:
            self.clear()
        elif head >= _COMPACT_MIN and head * 2 >= n:
            del times[:head]
            del self._values[:head]
            self._head = 0
        else:
            self._head = head
        return out

    def clear(self) -> None:
        del self._times[:]
        del self._values[:]
        self._head = 0
