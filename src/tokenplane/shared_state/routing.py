"""The approximate prefix index, shared: every replica learns where the others routed.

:class:`SharedPrefixRouter` wraps a model's router whose index is a
:class:`~tokenplane.core.routing.prefix_index.PrefixIndex` (``prefix-affinity``, ``weighted``):
it decides exactly as the router does, and after each routing decision that taught this replica's
index something new (a block of the prompt-block chain it did not yet hold for that instance), it
queues (model, instance, the whole chain) for the other replicas
(:meth:`~tokenplane.shared_state.peer_channel.PeerChannel.publish_routed`). What the other replicas
publish goes straight into the index (:func:`learn`), not through ``on_routed``, so a router's other
bookkeeping (loads, cursors) stays this replica's own.

The whole chain, not only the blocks that were news here: the index's matching relies on every
instance's held set being prefix-closed (:mod:`~tokenplane.core.routing.prefix_index`), and a
receiver may have aged the prefix out (it routes there less than the sender). A suffix inserted
without its prefix would then make the receiver match the chain's full depth for an instance that
holds none of its start; the whole chain also renews the prefix in the receiver's generations.
A chain costs about 9 bytes per 64-token routing block on the wire.

A replica that missed a message (its subscription was down) lacks those blocks: the next turn
routed there is a miss for it, and turns that add blocks are published again.
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
        if known < len(chain):  # news here: the whole chain (module docstring)
            self.sink.publish_routed(self.model, instance_id, chain)

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        self.inner.on_finished(request, instance_id, now=now)

    def forget(self, instance_id: InstanceId) -> None:
        self.inner.forget(instance_id)


def learn(index: PrefixIndex, instance_id: str, block_hashes: Sequence[int], now: float) -> None:
    """Insert another replica's routing decision into this replica's index."""
    if block_hashes:
        index.insert(instance_id, block_hashes, now)
