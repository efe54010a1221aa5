"""Counters and histograms for the request path, exposed through ``prometheus_client``.

``prometheus_client``'s own ``Histogram.observe`` costs about 1.7 µs and ``Counter.inc`` 0.85 µs
on this kind of machine (each takes a lock per value it touches, and a histogram walks its bucket
list in Python); a request records five or six of them. These keep plain numbers instead (a bisect
and two additions, ~0.3 µs) and build the metric families only when ``/metrics`` is scraped, as a
registered :class:`~prometheus_client.registry.Collector`. The exposition is the library's: the
same ``_total``, ``_bucket{le}``, ``_count`` and ``_sum`` series (no ``_created``).

Not thread-safe, by design: the gateway records and renders on its one event-loop thread.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LeanCounter", "LeanHistogram"]


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le is "less or equal")
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Family(Collector):
    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        registry.register(self)

    def _check(self, values: tuple[str, ...]) -> None:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")


class LeanCounter(_Family):
    """``Counter(name, documentation, labelnames, registry=...)``; ``name`` without ``_total``."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], *, registry: CollectorRegistry
    ) -> None:
        super().__init__(name, documentation, labelnames, registry)
        self._children: dict[tuple[str, ...], _CounterChild] = {}

    def labels(self, *values: str) -> _CounterChild:
        child = self._children.get(values)
        if child is None:
            self._check(values)
            child = self._children[values] = _CounterChild()
        return child

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            fam.add_metric(list(values), child.value)
        yield fam


class LeanHistogram(_Family):
    """``Histogram(name, documentation, labelnames, buckets=..., registry=...)``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be increasing and distinct, got {buckets}")
        super().__init__(name, documentation, labelnames, registry)
        self.bounds = bounds
        self._children: dict[tuple[str, ...], _HistogramChild] = {}

    def labels(self, *values: str) -> _HistogramChild:
        child = self._children.get(values)
        if child is None:
            self._check(values)
            child = self._children[values] = _HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        for values, child in self._children.items():
            cumulative = 0
            buckets = []
            for le, n in zip(les, child.counts, strict=True):
                cumulative += n
                buckets.append((le, float(cumulative)))
            fam.add_metric(list(values), buckets, child.sum)
        yield fam
