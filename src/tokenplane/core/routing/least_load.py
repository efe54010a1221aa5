"""Least-requests and least-tokens: send each request to the usable instance with the least work.

Algorithm: one pass over the candidates keeps the usable instance with the smallest
``outstanding_requests`` ("least-requests") or ``outstanding_tokens`` ("least-tokens"), the control
plane's own count of work sent and not yet finished. Ties go to the lowest candidate index (the
first one seen), which is deterministic and needs no state; since the shell's accounting rises as
soon as a request is routed, the next request sees the new count and ties do not herd.

Params: none.

Cost: one tight pass over the candidates per ``select`` (the ready/healthy check is folded into the
same pass and only evaluated for a new minimum); no allocation besides the decision. No state.

How it fails: if the shell's counts lag (a view built before the previous request was counted),
bursts of simultaneous requests all pick the same minimum and herd onto it; power-of-two is the
usual cure. Outstanding requests treat a 10-token and a 10k-token request alike (least-tokens
weighs by size but ignores prefill/decode cost differences and cache hits).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import no_params
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import ROUTERS
from tokenplane.core.routing.candidates import NO_CANDIDATES
from tokenplane.core.routing.stateless import StatelessHooks
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason

_UNSET = sys.maxsize  # a load no real instance reaches; saves a `best is None` test per candidate


def least_requests(candidates: Sequence[InstanceView]) -> InstanceView | None:
    """The usable candidate with the fewest outstanding requests (first on ties), or None."""
    best: InstanceView | None = None
    best_load = _UNSET
    for view in candidates:
        # the load is read a second time only for a new minimum: cheaper than a local per candidate
        if view.outstanding_requests < best_load and view.ready and view.healthy:
            best = view
            best_load = view.outstanding_requests
    if best is None:  # nothing usable, or absurd loads >= _UNSET: redo without the sentinel
        usable_views = [v for v in candidates if v.ready and v.healthy]
        best = min(usable_views, key=lambda v: v.outstanding_requests, default=None)
    return best


def least_tokens(candidates: Sequence[InstanceView]) -> InstanceView | None:
    """The usable candidate with the fewest outstanding tokens (first on ties), or None."""
    best: InstanceView | None = None
    best_load = _UNSET
    for view in candidates:
        # the load is read a second time only for a new minimum: cheaper than a local per candidate
        if view.outstanding_tokens < best_load and view.ready and view.healthy:
            best = view
            best_load = view.outstanding_tokens
    if best is None:  # nothing usable, or absurd loads >= _UNSET: redo without the sentinel
        usable_views = [v for v in candidates if v.ready and v.healthy]
        best = min(usable_views, key=lambda v: v.outstanding_tokens, default=None)
    return best


class LeastRequestsRouter(StatelessHooks):
    name = "least-requests"

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        best = least_requests(candidates)
        if best is None:
            return NO_CANDIDATES
        return RouteDecision(best.instance_id, RouteReason.LEAST_REQUESTS)


class LeastTokensRouter(StatelessHooks):
    name = "least-tokens"

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        best = least_tokens(candidates)
        if best is None:
            return NO_CANDIDATES
        return RouteDecision(best.instance_id, RouteReason.LEAST_TOKENS)


@register(ROUTERS, "least-requests")
def _build_requests(params: Mapping[str, Any], ctx: BuildContext) -> LeastRequestsRouter:
    no_params("router 'least-requests'", params)
    return LeastRequestsRouter()


@register(ROUTERS, "least-tokens")
def _build_tokens(params: Mapping[str, Any], ctx: BuildContext) -> LeastTokensRouter:
    no_params("router 'least-tokens'", params)
    return LeastTokensRouter()
