"""llama.cpp's server (``llama-server --metrics``).

Metrics (``tools/server/README.md``, "GET /metrics"; no labels): ``llamacpp:requests_processing``
(running), ``llamacpp:requests_deferred`` (waiting), ``llamacpp:kv_cache_usage_ratio`` (KV use,
0..1) and ``llamacpp:kv_cache_tokens`` (tokens in the cache; with the ratio, the cache's size).
Recent builds (after the unified KV cache) dropped the two KV gauges: KV use then reads 0 and the
capacity stays unknown, as for a runtime that publishes none. llama.cpp has no prefix-cache counters.

Continuation: text completions take the prompt plus the delivered text. Chat: none. Recent
``llama-server`` builds continue a final assistant message by default ("assistant prefill", turned
off by ``--no-prefill-assistant``), older ones start a new assistant turn after it; the gateway
cannot see which, and the wrong guess would silently repeat text to the client, so a broken chat
stream ends with the error instead (``continuation`` answers None).

KV events: none. Embeddings: with ``--embeddings``.
"""

from __future__ import annotations

from tokenplane.gateway.runtimes.base import KV_USED_TOKENS, Capabilities, Runtime

METRIC_NAMES = {
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:kv_cache_usage_ratio": "kv_usage",
    "llamacpp:kv_cache_tokens": KV_USED_TOKENS,
}

RUNTIME = Runtime(
    "llamacpp",
    metric_names=METRIC_NAMES,
    capabilities=Capabilities(metrics=True, can_continue_chat=False, serves_embeddings=True),
)
