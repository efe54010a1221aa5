"""Avoid: an exact response cache for deterministic requests, one per model that turns it on.

A request is cacheable when its answer is meant to be reproducible: ``temperature`` is 0 or a
fixed integer ``seed`` is given, and it asks for one choice (``n`` absent or 1). The key is
(tenant, resolved model, endpoint, the body re-encoded with sorted keys, without ``stream``,
``stream_options``, ``user`` and ``model``): tenants never see each other's entries, and an alias
hits the same entries as the model's name.

Only a successful (200) JSON answer from the requested model's own pool is stored (never an error,
never a fallback's answer). A hit returns the stored body byte for byte, its original ``id`` and
``created`` included (the answer is the same answer; clients that need unique ids should not send
deterministic requests through a cached model), with ``x-tokenplane-cache: hit``. A streaming
request hits the same entries: the stored answer is replayed as SSE (one chunk per choice with the
whole text, a usage chunk when ``stream_options.include_usage`` is set, then ``[DONE]``); streams
are never stored, only served.

Bounds: ``max_entries`` and ``max_bytes`` (the stored bodies), least recently used evicted first;
entries older than ``ttl_s`` are dropped when met. Metrics:
``tokenplane_response_cache_total{model,result=hit|shared_hit|miss|store|evict}``.

With ``state: {backend: redis}`` this cache is each replica's first level: a request it misses is
looked up in Redis (``shared_hit`` when found there; ``miss`` only when both miss), and what a
replica stores goes to Redis too, so a deterministic request answered through one replica is a hit
through any (:meth:`~tokenplane.shared_state.redis_backend.RedisState.cache_get`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from tokenplane.gateway.config import ResponseCacheConfig
from tokenplane.gateway.proxy import SSE_HEADERS

CACHE_HEADER = "x-tokenplane-cache"
_IGNORED = frozenset(("stream", "stream_options", "user", "model"))
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_encode = msgspec.json.Encoder().encode

CacheKey = tuple[str, str, str, bytes]


def is_deterministic(body: dict[str, Any]) -> bool:
    """Whether a request's answer is meant to be reproducible (and so may be cached)."""
    n = body.get("n")
    if n is not None and n != 1:
        return False
    if body.get("best_of") not in (None, 1):
        return False
    seed = body.get("seed")
    if type(seed) is int:
        return True
    t = body.get("temperature")
    return (type(t) is int or type(t) is float) and t == 0


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.counter = Counter(
            "tokenplane_response_cache",
            "Exact response cache lookups and stores, by result",
            ["model", "result"],
            registry=registry,
        )

    def count(self, model: str, result: str, n: int = 1) -> None:
        self.counter.labels(model, result).inc(n)


class ResponseCache:
    """LRU over (key → (stored at, body)), bounded in entries and bytes, with a TTL."""

    def __init__(
        self,
        model: str,
        config: ResponseCacheConfig,
        metrics: CacheMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.ttl_s = config.ttl_s
        self.max_entries = config.max_entries
        self.max_bytes = config.max_bytes
        self._metrics = metrics
        self._clock = clock
        self._entries: OrderedDict[CacheKey, tuple[float, bytes]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, tenant: str, endpoint: str, body: dict[str, Any]) -> CacheKey | None:
        """The request's key, or ``None`` when it is not deterministic (never cached)."""
        if not is_deterministic(body):
            return None
        canonical = {k: v for k, v in body.items() if k not in _IGNORED}
        return (tenant, self.model, endpoint, _encode_sorted(canonical))

    def get(self, key: CacheKey, *, count_miss: bool = True) -> bytes | None:
        entry = self._entries.get(key)
        if entry is not None and self._clock() - entry[0] > self.ttl_s:
            self._drop(key)
            entry = None
        if entry is None:
            if count_miss:
                self._metrics.count(self.model, "miss")
            return None
        self._entries.move_to_end(key)
        self._metrics.count(self.model, "hit")
        return entry[1]

    def count(self, result: str) -> None:
        self._metrics.count(self.model, result)

    def put(self, key: CacheKey, body: bytes, *, ttl_left_s: float | None = None) -> None:
        """Store an answer; ``ttl_left_s``: one found in the shared cache, kept here only for what
        is left of its TTL there (counted as ``shared_hit``, not ``store``)."""
        size = len(body)
        if size > self.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        now = self._clock()
        stored_at = now if ttl_left_s is None else now - max(0.0, self.ttl_s - ttl_left_s)
        self._entries[key] = (stored_at, body)
        self.bytes += size
        if ttl_left_s is None:
            self._metrics.count(self.model, "store")
        evicted = 0
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            evicted += 1
        if evicted:
            self._metrics.count(self.model, "evict", evicted)

    def _drop(self, key: CacheKey) -> None:
        _, body = self._entries.pop(key)
        self.bytes -= len(body)


def hit_response(body: bytes, parsed_body: dict[str, Any], stream: bool) -> web.Response:
    """The client's answer from a stored body: as is, or replayed as SSE for a streaming request."""
    headers = {CACHE_HEADER: "hit"}
    if not stream:
        return web.Response(body=body, content_type="application/json", headers=headers)
    data = msgspec.json.decode(body)
    chat = data.get("object") == "chat.completion"
    base = {
        "id": data.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": data.get("created"),
        "model": data.get("model"),
    }
    out = bytearray()
    for c in data.get("choices") or ():
        if chat:
            msg = c.get("message") or {}
            delta = {"role": msg.get("role", "assistant"), "content": msg.get("content")}
            choice = {"index": c.get("index", 0), "delta": delta, "finish_reason": c.get("finish_reason")}
        else:
            choice = {"index": c.get("index", 0), "text": c.get("text")}
            choice["finish_reason"] = c.get("finish_reason")
        choice["logprobs"] = c.get("logprobs")
        out += b"data: " + _encode({**base, "choices": [choice]}) + b"\n\n"
    opts = parsed_body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage") and data.get("usage") is not None:
        out += b"data: " + _encode({**base, "choices": [], "usage": data["usage"]}) + b"\n\n"
    out += b"data: [DONE]\n\n"
    return web.Response(body=bytes(out), headers={**SSE_HEADERS, **headers})
