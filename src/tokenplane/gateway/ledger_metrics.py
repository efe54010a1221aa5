"""``/metrics`` for the ledger's write queue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from tokenplane.gateway.workflows import Workflows


class LedgerQueueCollector:
    """``/metrics``: the ledger's write queue (its depth, drops, retries, whether it can write)."""

    def __init__(self, workflows: Workflows) -> None:
        self._wf = workflows

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        ledger = self._wf.ledger
        if ledger is None:
            return
        depth = GaugeMetricFamily(
            "tokenplane_ledger_buffered_writes", "Ledger writes queued and not yet committed"
        )
        depth.add_metric([], ledger.buffered)
        yield depth
        up = GaugeMetricFamily(
            "tokenplane_ledger_available", "1 when the ledger's last write committed, 0 while it cannot write"
        )
        up.add_metric([], 0 if ledger.unavailable is not None else 1)
        yield up
        dropped = CounterMetricFamily(
            "tokenplane_ledger_dropped_writes", "Ledger writes dropped: the store was away and the queue full"
        )
        dropped.add_metric([], ledger.dropped)
        yield dropped
        retries = CounterMetricFamily(
            "tokenplane_ledger_write_retries", "Ledger batches tried again because the store was unreachable"
        )
        retries.add_metric([], ledger.retries)
        yield retries
