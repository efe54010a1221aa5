"""Fallback (only when some model has a chain): move the request down its model's chain
(:mod:`~tokenplane.gateway.fallback`); the answer then names the model that served it."""

from __future__ import annotations

from collections.abc import Mapping

from tokenplane.gateway.catalog import ModelCatalog
from tokenplane.gateway.fallback import SERVED_BY_KEY, FallbackChain, quality_of
from tokenplane.gateway.stages.context import RequestContext


class Fallback:
    __slots__ = ("catalog", "chains")

    def __init__(self, chains: Mapping[str, FallbackChain], catalog: ModelCatalog) -> None:
        self.chains = chains
        self.catalog = catalog

    def enter(self, ctx: RequestContext) -> None:
        chain = self.chains.get(ctx.model)
        caller = ctx.caller
        parsed = ctx.parsed
        if chain is None or caller is None or parsed is None:
            return
        moved = chain.choose(quality_of(ctx.client.headers, parsed.body), caller.may_use)
        if moved is not None:
            served = self.catalog.resolve(moved[0], caller)
            ctx.served = served
            ctx.model = served.name
            ctx.client.note(SERVED_BY_KEY, served.name)
            ctx.cache_key = None  # only the requested model's own answers are stored
            ctx.cacheable = False

    cleans_up = False

    def exit(self, ctx: RequestContext) -> None:
        pass
