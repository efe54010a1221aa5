"""``/metrics`` for the routers' prefix indexes: blocks held per instance, against their bound (an
instance's KV cache size in blocks, see ``Gateway.bound_prefix_indexes``). The index is the
gateway's largest structure that grows with traffic; once every instance is at its bound, its
memory is flat."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tokenplane.core.routing.prefix_index import PrefixIndex

__all__ = ["PrefixIndexCollector"]


class PrefixIndexCollector(Collector):
    def __init__(self, indexes: Callable[[], Iterable[tuple[str, PrefixIndex, Iterable[str]]]]) -> None:
        self._indexes = indexes  # (model, its index, its instances), read at each scrape

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "instance"]
        held = GaugeMetricFamily(
            "tokenplane_prefix_index_blocks", "Prompt blocks the prefix index holds", labels=labels
        )
        bound = GaugeMetricFamily(
            "tokenplane_prefix_index_bound_blocks",
            "The most blocks the prefix index holds for the instance",
            labels=labels,
        )
        for model, index, instances in self._indexes():
            for iid in instances:
                held.add_metric([model, iid], index.blocks_held(iid))
                bound.add_metric([model, iid], index.bound(iid))
        yield held
        yield bound
