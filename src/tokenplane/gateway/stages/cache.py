"""Response cache (only when some model caches): a stored answer for the same tenant, endpoint and
body ends the request here (``x-tokenplane-cache: hit``); on the way out, a successful JSON answer
of the requested model is stored (never an error, never a stream)."""

from __future__ import annotations

from collections.abc import Mapping

from tokenplane.gateway.proxy import OUTCOME_OK
from tokenplane.gateway.response_cache import ResponseCache, hit_response
from tokenplane.gateway.stages.context import RequestContext


class Cache:
    __slots__ = ("caches",)

    def __init__(self, caches: Mapping[str, ResponseCache]) -> None:
        self.caches = caches

    def enter(self, ctx: RequestContext) -> None:
        cache = self.caches.get(ctx.model)
        parsed = ctx.parsed
        if cache is None or parsed is None or parsed.endpoint not in ("chat", "completions"):
            return
        key = cache.key(ctx.tenant, parsed.endpoint, parsed.body)
        if key is None:
            return
        stored = cache.get(key)
        if stored is not None:
            ctx.reason = "cache"
            ctx.response = hit_response(stored, parsed.body, parsed.stream)
        elif not parsed.stream:
            ctx.cache_key = key
            ctx.cacheable = True

    def exit(self, ctx: RequestContext) -> None:
        key = ctx.cache_key
        body = ctx.answer_body
        if key is not None and body is not None and ctx.outcome == OUTCOME_OK:
            self.caches[key[1]].put(key, body)
