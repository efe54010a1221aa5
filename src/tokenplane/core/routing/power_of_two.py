"""Power-of-two choices: draw two distinct instances at random, send to the less loaded of the two.

Algorithm: draw two distinct indices uniformly (``i`` over ``n``, ``j`` over the other ``n − 1``);
if both instances are usable, take the one with the smaller load (ties → the first drawn). If either
is unusable, filter the list once and draw the pair again among the usable ones; by the same argument
as rejection sampling the pair is uniform over usable pairs either way. With one usable instance it
is taken directly.

Params: ``load``: ``"requests"`` (default, ``outstanding_requests``) or ``"tokens"``
(``outstanding_tokens``).

Randomness comes from the injected ``ctx.rng``; ``select`` advances it (an injected dependency, not
policy state), so the same seed and inputs replay the same decisions.

Cost: O(1) per ``select`` (two draws, two reads) on the fast path, one pass when a drawn instance is
unusable. No state.

How it fails: only two instances are compared, so it never finds the global minimum; with very few
instances (n = 2) it degenerates to least-load. It is, however, robust to stale counts: concurrent
requests do not herd the way least-load's do (Mitzenmacher, "The Power of Two Choices").
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import ROUTERS
from tokenplane.core.routing.candidates import NO_CANDIDATES, usable
from tokenplane.core.routing.stateless import StatelessHooks
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason

DEFAULT_LOAD = "requests"
LOAD_CHOICES = ("requests", "tokens")


class PowerOfTwoRouter(StatelessHooks):
    name = "power-of-two"

    def __init__(self, rng: random.Random, *, load: str = DEFAULT_LOAD) -> None:
        if load not in LOAD_CHOICES:
            raise ValueError(f"load must be one of {LOAD_CHOICES}, got {load!r}")
        self._rng = rng
        self._by_tokens = load == "tokens"
        self.load = load

    def _pair(self, pool: Sequence[InstanceView]) -> tuple[InstanceView, InstanceView]:
        n = len(pool)
        rnd = self._rng.random
        i = int(rnd() * n)
        if i >= n:
            i = n - 1
        j = int(rnd() * (n - 1))
        if j >= n - 1:
            j = n - 2
        if j >= i:
            j += 1
        return pool[i], pool[j]

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        n = len(candidates)
        if n == 0:
            return NO_CANDIDATES
        if n == 1:
            a = b = candidates[0]
            if not (a.ready and a.healthy):
                return NO_CANDIDATES
        else:
            a, b = self._pair(candidates)
            if not (a.ready and a.healthy and b.ready and b.healthy):
                pool = usable(candidates)
                if not pool:
                    return NO_CANDIDATES
                if len(pool) == 1:
                    return RouteDecision(pool[0].instance_id, RouteReason.POWER_OF_TWO)
                a, b = self._pair(pool)
        if self._by_tokens:
            pick = b if b.outstanding_tokens < a.outstanding_tokens else a
        else:
            pick = b if b.outstanding_requests < a.outstanding_requests else a
        return RouteDecision(pick.instance_id, RouteReason.POWER_OF_TWO)


@register(ROUTERS, "power-of-two")
def _build(params: Mapping[str, Any], ctx: BuildContext) -> PowerOfTwoRouter:
    reader = ParamReader("router 'power-of-two'", params, ("load",))
    return PowerOfTwoRouter(ctx.rng, load=reader.choice("load", DEFAULT_LOAD, LOAD_CHOICES))
