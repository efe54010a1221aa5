"""Where the gateway's seven-axis view fields come from, beyond the runtime's metrics.

How :class:`~tokenplane.gateway.upstreams.Upstream` fills them:

* ``weights`` (:data:`WARM`, :data:`WARMING`, :data:`COLD`, what
  :func:`~tokenplane.core.routing.placement.weights_state` reads): ``cold`` until the instance is
  first seen serving (an answered health check or request) and while it is down; ``warming`` while
  its health check answers but not 200 (llama.cpp answers 503 while it loads a model) or while the
  autoscaler says it is starting (``Upstream.set_weights``, ``UpstreamPool.add(weights=...)``);
  ``warm`` once it serves;
* ``hbm_free_bytes``: no runtime publishes free HBM, so it is the free KV cache in bytes:
  ``kv_capacity_tokens x (1 - kv_usage) x kv_bytes_per_token`` (the instance's config, else the
  twin's catalogue entry for its model, :func:`catalogue_kv_bytes_per_token`); 0 (unknown) without
  a capacity or a size per token;
* ``predicted_ttft_s``: :class:`PoolTtft`, one per model pool, fed with observed TTFTs and read both
  by the instances' views and by admission; 0 (unknown) before any observation and for an instance
  that is not warm (the placement router then adds its own readiness delay);
* ``kv_capacity_tokens`` (config, else scraped), ``kv_usage``, ``price_per_hour``, ``gpu``: config
  and the runtime's metrics as they are;
* ``adapters``: the LoRA adapters the runtime reports running or queued (vLLM's
  ``vllm:lora_requests_info``); the ``lora-affinity`` scorer adds its own record of where it sent
  each adapter.
"""

from __future__ import annotations

import functools

from tokenplane.core.shedding import TtftPredictor

WARM, WARMING, COLD = "warm", "warming", "cold"
TTFT_REPUBLISH_RATIO = 0.02
"""Views carry a new predicted TTFT when the pool's mean prefill time moved by more than this
fraction since they were built: every observation would otherwise rebuild every view."""


class PoolTtft:
    """One model pool's :class:`~tokenplane.core.shedding.TtftPredictor`, fed with observed TTFTs.

    Each instance's view carries ``predicted_ttft_s = (waiting + 1) x mean_prefill_s``: the requests
    it reports waiting, then the newcomer's own prefill, each at the pool's observed mean (the
    core's model per instance; admission uses the same predictor over the pool). ``version`` moves
    when the mean moved enough to matter (:data:`TTFT_REPUBLISH_RATIO`), and views rebuild then.
    Before the first observation nothing is predicted (0: the placement router uses its own model).
    """

    __slots__ = ("mean_prefill_s", "observed", "predictor", "version")

    def __init__(self, predictor: TtftPredictor | None = None) -> None:
        self.predictor = predictor if predictor is not None else TtftPredictor()
        self.observed = 0
        self.version = 0
        self.mean_prefill_s = 0.0  # as last published to views; 0 before the first observation

    def observe(self, ttft_s: float, waiting_ahead: int) -> None:
        self.predictor.observe(ttft_s, waiting_ahead=max(0, waiting_ahead))
        self.observed += 1
        mean = self.predictor.mean_prefill_s
        published = self.mean_prefill_s
        if not published or abs(mean - published) > TTFT_REPUBLISH_RATIO * published:
            self.mean_prefill_s = mean
            self.version += 1

    def has_observed(self) -> bool:
        return self.observed > 0

    def for_waiting(self, waiting: int) -> float:
        return (max(0, waiting) + 1) * self.mean_prefill_s


@functools.cache
def catalogue_kv_bytes_per_token(model: str) -> int:
    """KV bytes per token of ``model`` in the twin's catalogue; 0 when it does not know the model."""
    from tokenplane.sim.catalog import Catalog  # the catalogue is built once, off the request path

    try:
        return int(Catalog.default().model(model).kv_bytes_per_token)
    except (KeyError, ValueError):
        return 0
