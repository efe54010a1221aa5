"""Random: send each request to a uniformly drawn usable instance.

Algorithm: draw an index uniformly over all ``n`` candidates; if that instance is usable, take it.
Otherwise filter the list and draw again uniformly among the ``m`` usable ones. The result is
exactly uniform over the usable instances (P = 1/n + (k/n)·1/m = 1/m with k = n − m unusable).

Randomness comes from the ``random.Random`` injected at build time (``ctx.rng``). ``select`` draws
from it, which advances the generator: that is the one mutation ``select`` performs, and it is of an
injected dependency, not of policy state; the same seed and the same inputs give the same decisions.
Indices are ``int(rng.random() * n)`` (a few times cheaper than ``randrange``; the bias is below
n/2**53).

Params: none.

Cost: O(1) per ``select`` (one or two draws) when the drawn instance is usable, one pass otherwise.

How it fails: blind to load, so with heterogeneous instances or bursty arrivals queues grow on the
unlucky ones (the classic balls-into-bins max load of ~log n / log log n); prefer power-of-two.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import no_params
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import ROUTERS
from tokenplane.core.routing.candidates import NO_CANDIDATES, usable
from tokenplane.core.routing.stateless import StatelessHooks
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason


def draw_index(rng: random.Random, n: int) -> int:
    """A uniform index in ``[0, n)`` for ``n >= 1``."""
    i = int(rng.random() * n)
    return i if i < n else n - 1


class RandomRouter(StatelessHooks):
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        n = len(candidates)
        if n == 0:
            return NO_CANDIDATES
        view = candidates[draw_index(self._rng, n)]
        if not (view.ready and view.healthy):
            pool = usable(candidates)
            if not pool:
                return NO_CANDIDATES
            view = pool[draw_index(self._rng, len(pool))]
        return RouteDecision(view.instance_id, RouteReason.RANDOM)


@register(ROUTERS, "random")
def _build(params: Mapping[str, Any], ctx: BuildContext) -> RandomRouter:
    no_params("router 'random'", params)
    return RandomRouter(ctx.rng)
