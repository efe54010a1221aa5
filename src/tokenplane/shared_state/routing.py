"""The approximate prefix index, shared: every replica learns where the others routed.

:class:`SharedPrefixRouter` wraps a model's router whose index is a
:class:`~tokenplane.core.routing.prefix_index.PrefixIndex` (``prefix-affinity``, ``weighted``):
it decides exactly as the router does, and after each routing decision it also queues
(model, instance, the blocks of the prompt-block chain that this replica's index did not yet
hold for that instance: the rest the others learnt before, from this replica or another) for the
other replicas
(:meth:`~tokenplane.shared_state.redis_backend.RedisState.publish_routed`). What the other replicas
publish goes straight into the index (:func:`learn`), not through ``on_routed``, so a router's other
bookkeeping (loads, cursors) stays this replica's own.

A replica that missed a message (its subscription was down) lacks those blocks: the next turn
routed there is a miss for it and is published whole again. A received suffix is newer in the LRU
than its prefix, so under eviction pressure the prefix may go first; the suffix is then dead weight
until evicted in turn (the index is approximate by design).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenplane.core.routing import Router
from tokenplane.core.routing.prefix_index import PrefixIndex
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo, RouteDecision


class RoutedSink(Protocol):
    def publish_routed(self, model: str, instance_id: str, block_hashes: Sequence[int]) -> None: ...


def prefix_index_of(router: Router) -> PrefixIndex | None:
    """The router's own approximate prefix index, if it keeps one."""
    index = getattr(router, "index", None)
    return index if isinstance(index, PrefixIndex) else None


class SharedPrefixRouter:
    """A model's router, publishing its routing decisions (see the module docstring)."""

    def __init__(self, inner: Router, index: PrefixIndex, model: str, sink: RoutedSink) -> None:
        self.inner = inner
        self.index = index
        self.name = inner.name
        self.model = model
        self.sink = sink

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        return self.inner.select(request, candidates, now=now)

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        chain = request.block_hashes
        known = self.index.matched_depth(chain, instance_id) if chain else 0
        self.inner.on_routed(request, instance_id, now=now)
        if known < len(chain):  # only the blocks the instance did not hold yet are news
            self.sink.publish_routed(self.model, instance_id, chain[known:])

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        self.inner.on_finished(request, instance_id, now=now)

    def forget(self, instance_id: InstanceId) -> None:
        self.inner.forget(instance_id)


def learn(index: PrefixIndex, instance_id: str, block_hashes: Sequence[int], now: float) -> None:
    """Insert another replica's routing decision into this replica's index."""
    if block_hashes:
        index.insert(instance_id, block_hashes, now)
