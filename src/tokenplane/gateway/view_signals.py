"""Where the gateway's seven-axis view fields come from, beyond the runtime's metrics.

How :class:`~tokenplane.gateway.upstream.Upstream` fills them:

* ``weights`` (:data:`WARM`, :data:`WARMING`, :data:`COLD`, what
  :func:`~tokenplane.core.routing.placement.weights_state` reads): ``cold`` until the instance is
  first seen serving (an answered health check or request) and while it is down; ``warming`` while
  its health check answers but not 200 (llama.cpp answers 503 while it loads a model) or while the
  autoscaler says it is starting (``Upstream.set_weights``, ``UpstreamPool.add(weights=...)``);
  ``warm`` once it serves;
* ``hbm_free_bytes``: the core's :func:`~tokenplane.core.ttft.free_kv_bytes` (the twin's too): the
  free KV cache in bytes, ``kv_capacity_tokens x (1 - kv_usage) x kv_bytes_per_token`` (the
  instance's config, else the twin's catalogue entry for its model,
  :func:`catalogue_kv_bytes_per_token`); 0 (unknown) without a capacity or a size per token;
* ``predicted_ttft_s``: the core's :class:`~tokenplane.core.ttft.PoolTtft`, one per model pool,
  fed with observed TTFTs (when a stream's relay ends) and read both by the instances' views and by
  admission's up-front rule; 0 (unknown) before any observation and for an instance that is not
  warm (the placement router then adds its own readiness delay);
* ``kv_capacity_tokens`` (config, else scraped), ``kv_usage``, ``price_per_hour``, ``gpu``: config
  and the runtime's metrics as they are;
* ``adapters``: the LoRA adapters the runtime reports running or queued (vLLM's
  ``vllm:lora_requests_info``); the ``lora-affinity`` scorer adds its own record of where it sent
  each adapter.
"""

from __future__ import annotations

import functools

from tokenplane.core.ttft import TTFT_REPUBLISH_RATIO, PoolTtft, free_kv_bytes

__all__ = [
    "COLD",
    "TTFT_REPUBLISH_RATIO",
    "WARM",
    "WARMING",
    "PoolTtft",
    "catalogue_kv_bytes_per_token",
    "free_kv_bytes",
]

WARM, WARMING, COLD = "warm", "warming", "cold"


@functools.cache
def catalogue_kv_bytes_per_token(model: str) -> int:
    """KV bytes per token of ``model`` in the twin's catalogue; 0 when it does not know the model."""
    from tokenplane.sim.catalog import Catalog  # the catalogue is built once, off the request path

    try:
        return int(Catalog.default().model(model).kv_bytes_per_token)
    except (KeyError, ValueError):
        return 0
