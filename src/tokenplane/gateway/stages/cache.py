"""Response cache (only when some model caches): a stored answer for the same tenant, endpoint and
body ends the request here (``x-tokenplane-cache: hit``); on the way out, a successful JSON answer
of the requested model is stored (never an error, never a stream). With a shared state backend, a
local miss is looked up in Redis (the only wait of this stage) and stores go there too."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping

from tokenplane.gateway.proxy import OUTCOME_OK
from tokenplane.gateway.response_cache import CacheKey, ResponseCache, hit_response
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.shared_state.redis_backend import RedisState


class Cache:
    __slots__ = ("caches", "shared")

    def __init__(self, caches: Mapping[str, ResponseCache], shared: RedisState | None = None) -> None:
        self.caches = caches
        self.shared = shared

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        cache = self.caches.get(ctx.model)
        parsed = ctx.parsed
        if cache is None or parsed is None or parsed.endpoint not in ("chat", "completions"):
            return None
        key = cache.key(ctx.tenant, parsed.endpoint, parsed.body)
        if key is None:
            return None
        shared = self.shared
        ask_shared = shared is not None and shared.up
        stored = cache.get(key, count_miss=not ask_shared)
        if stored is not None:
            ctx.reason = "cache"
            ctx.response = hit_response(stored, parsed.body, parsed.stream)
            return None
        if ask_shared:
            return self._shared_get(ctx, cache, key)
        if shared is not None:
            shared.fell_back("cache_get")
        self._missed(ctx, key)
        return None

    async def _shared_get(self, ctx: RequestContext, cache: ResponseCache, key: CacheKey) -> None:
        shared = self.shared
        parsed = ctx.parsed
        assert shared is not None and parsed is not None
        found = await shared.cache_get(shared.cache_key(key))
        if found is None:
            cache.count("miss")
            self._missed(ctx, key)
            return
        body, ttl_left_s = found
        cache.put(key, body, ttl_left_s=ttl_left_s)
        cache.count("shared_hit")
        ctx.reason = "cache"
        ctx.response = hit_response(body, parsed.body, parsed.stream)

    @staticmethod
    def _missed(ctx: RequestContext, key: CacheKey) -> None:
        parsed = ctx.parsed
        if parsed is not None and not parsed.stream:
            ctx.cache_key = key
            ctx.cacheable = True

    def exit(self, ctx: RequestContext) -> None:
        key = ctx.cache_key
        body = ctx.answer_body
        if key is not None and body is not None and ctx.outcome == OUTCOME_OK:
            cache = self.caches[key[1]]
            cache.put(key, body)
            shared = self.shared
            if shared is not None:
                shared.cache_put(shared.cache_key(key), body, cache.ttl_s)
