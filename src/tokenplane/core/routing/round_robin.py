"""Round-robin: send each request to the next instance in candidate order.

Algorithm: a cursor counts routed requests (it advances in ``on_routed``, never in ``select``). With
``n`` candidates, ``select`` proposes ``candidates[cursor % n]``; when that instance is usable the
decision is made without looking at the others. When it is not ready or not healthy the router
filters the list and takes ``usable[cursor % m]`` among the ``m`` usable ones, so an unusable
instance's turn is spread over the others instead of always falling to its neighbour.

Params: none.

Cost: O(1) per ``select`` when the proposed instance is usable, one pass over the candidates
otherwise; O(1) per ``on_routed``. No allocation on the fast path.

How it fails: the cycle follows candidate *order*, so a shell that reorders or resizes the candidate
list between requests shifts the cycle (still fair over time, not strictly alternating). It ignores
load entirely: a slow instance gets its full share. With some instances unusable the share of the
usable ones is near-equal rather than exactly equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import no_params
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import ROUTERS
from tokenplane.core.routing.candidates import NO_CANDIDATES, usable
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo, RouteDecision, RouteReason


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._cursor = 0

    @property
    def cursor(self) -> int:
        return self._cursor

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        n = len(candidates)
        if n == 0:
            return NO_CANDIDATES
        view = candidates[self._cursor % n]
        if not (view.ready and view.healthy):
            pool = usable(candidates)
            if not pool:
                return NO_CANDIDATES
            view = pool[self._cursor % len(pool)]
        return RouteDecision(view.instance_id, RouteReason.ROUND_ROBIN)

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        self._cursor += 1

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        pass

    def forget(self, instance_id: InstanceId) -> None:
        pass  # the cursor counts requests, not instances


@register(ROUTERS, "round-robin")
def _build(params: Mapping[str, Any], ctx: BuildContext) -> RoundRobinRouter:
    no_params("router 'round-robin'", params)
    return RoundRobinRouter()
