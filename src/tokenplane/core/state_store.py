"""Shared state behind small protocols: windowed counters and gauges that gateway replicas may share.

Policies that must agree across several gateway replicas (retry budgets, per-tenant fairness and
concurrency) keep their numbers here rather than in attributes, so a Redis-backed store can replace
the in-process one without touching the policies.

Protocols::

    CounterStore   add(key, delta, *, now) -> float; get(key, *, now) -> float
                   the sum of the deltas added to ``key`` within the last ``window_s`` seconds
    GaugeStore     add(key, delta) -> float; get(key) -> float
                   a plain running total (in-flight counts)

Both are synchronous and must not block: the core does no I/O. A multi-replica implementation keeps
a local view that the shell synchronises in the background (push local deltas, pull the aggregate
every few hundred ms), so the numbers a policy reads may lag the other replicas by one sync period:
a budget may be overspent by what the other replicas spend in that period, never more.

In-process implementations:

* :class:`SlidingWindowCounterStore` is exact: it keeps every ``(time, delta)`` per key
  and drops entries older than ``window_s`` on each call (amortised O(1) per add, memory O(adds in
  one window) per key). An entry added at ``t`` counts for ``t <= now < t + window_s``.
  Time must not go backwards per key; an earlier ``now`` is read as the latest time seen for that
  key (so replaying out-of-order events cannot resurrect expired entries).
* :class:`LocalGaugeStore` is a dict.

Failure modes: a key that is never read again keeps its entries until the next ``add``/``get`` on it
(call :meth:`SlidingWindowCounterStore.prune` from ``tick`` to bound memory for many short-lived keys).
"""

from __future__ import annotations

import math
from typing import Protocol

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.timed_series import TimedSeries


class CounterStore(Protocol):
    """Sliding-window sums per key."""

    @property
    def window_s(self) -> float: ...

    def add(self, key: str, delta: float, *, now: float) -> float:
        """Record ``delta`` at ``now``; return the key's windowed sum including it."""
        ...

    def get(self, key: str, *, now: float) -> float:
        """The sum of the deltas recorded for ``key`` in ``(now - window_s, now]``."""
        ...


class GaugeStore(Protocol):
    """Running totals per key (no window)."""

    def add(self, key: str, delta: float) -> float: ...

    def get(self, key: str) -> float: ...


class _Series:
    """A key's entries in a :class:`~tokenplane.core.timed_series.TimedSeries` (two arrays of
    doubles, not a deque of tuples the cyclic collector tracks and walks), and their running sum."""

    __slots__ = ("entries", "latest", "total")

    def __init__(self) -> None:
        self.entries = TimedSeries()
        self.total = 0.0
        self.latest = -math.inf


class SlidingWindowCounterStore:
    """Exact in-process :class:`CounterStore`."""

    def __init__(self, window_s: float) -> None:
        if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
            raise InvalidPolicyConfig(
                f"counter store: window_s must be a finite number > 0, got {window_s!r}"
            )
        self._window_s = float(window_s)
        self._series: dict[str, _Series] = {}

    @property
    def window_s(self) -> float:
        return self._window_s

    def _advance(self, series: _Series, now: float) -> None:
        if now > series.latest:
            series.latest = now
        entries = series.entries
        for delta in entries.expire(series.latest - self._window_s):
            series.total -= delta
        if not entries:
            series.total = 0.0  # no drift from float subtraction once the window is empty

    def add(self, key: str, delta: float, *, now: float) -> float:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        self._advance(series, now)
        series.entries.append(series.latest, delta)
        series.total += delta
        return series.total

    def get(self, key: str, *, now: float) -> float:
        series = self._series.get(key)
        if series is None:
            return 0.0
        self._advance(series, now)
        return series.total

    def prune(self, *, now: float) -> int:
        """Drop keys whose window is empty at ``now``; returns how many were dropped."""
        dead = []
        for key, series in self._series.items():
            self._advance(series, now)
            if not series.entries:
                dead.append(key)
        for key in dead:
            del self._series[key]
        return len(dead)


class LocalGaugeStore:
    """In-process :class:`GaugeStore`."""

    def __init__(self) -> None:
        self._values: dict[str, float] = {}

    def add(self, key: str, delta: float) -> float:
        value = self._values.get(key, 0.0) + delta
        if value == 0.0:
            self._values.pop(key, None)
        else:
            self._values[key] = value
        return value

    def get(self, key: str) -> float:
        return self._values.get(key, 0.0)
