"""The control loop beside the gateway: the gateway's side of the autoscaler's seams.

:class:`GatewayRegistry` lets the loop add, drain and remove instances of a model's pool;
:class:`StatsListener` feeds the loop's rolling demand and SLO statistics from the request path
(through :attr:`GatewayMetrics.listeners`, so the pipeline itself knows nothing of autoscaling).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tokenplane.control.config import AutoscalingConfig, build_actuator
from tokenplane.control.loop import ControlLoop
from tokenplane.control.metrics import LoopMetrics
from tokenplane.control.signals import InProcessSignalSource, PoolStats
from tokenplane.gateway.config import InstanceConfig

if TYPE_CHECKING:
    from tokenplane.gateway.app import Gateway


class GatewayRegistry:
    """The autoscaler's view of one model's pool, carried out on the gateway's upstream pool."""

    def __init__(self, gateway: Gateway, model: str, template: InstanceConfig) -> None:
        self._gw = gateway
        self._model = model
        self._template = template

    async def add(self, url: str, instance_id: str) -> None:
        cfg = self._template.model_copy(
            update={"id": instance_id, "url": url.rstrip("/"), "model": self._model}
        )
        self._gw.pool.add(cfg)

    async def drain(self, instance_id: str) -> None:
        self._gw.pool.drain(instance_id)

    async def remove(self, instance_id: str) -> None:
        if self._gw.pool.remove(instance_id) is not None:
            self._gw.forget_instance(instance_id)


class StatsListener:
    """Finished requests and first tokens of one model, into the loop's :class:`PoolStats`."""

    def __init__(self, model: str, stats: PoolStats) -> None:
        self._model = model
        self.stats = stats

    def request_done(self, model: str, outcome: str, duration_s: float, prompt_tokens: int) -> None:
        if model != self._model:
            return
        now = time.monotonic()
        self.stats.arrival(now - duration_s, prompt_tokens)
        self.stats.finished(now, ok=outcome == "ok")

    def first_token(self, model: str, ttft_s: float) -> None:
        if model == self._model:
            self.stats.first_token(time.monotonic(), ttft_s)


def build_control_loop(gateway: Gateway, cfg: AutoscalingConfig) -> ControlLoop:
    models = [m.name for m in gateway.catalog.models]
    model = cfg.model or (models[0] if len(models) == 1 else None)
    if model is None or model not in models:
        raise ValueError(f"autoscaling.model must name one of the gateway's models {models}")
    spec = cfg.pool_spec()
    stats = PoolStats(
        bucket_s=cfg.signals.bucket_s,
        history_buckets=cfg.signals.history_buckets,
        slo_window_s=cfg.signals.slo_window_s,
        ttft_slo_s=spec.ttft_slo_s,
        tbt_slo_s=cfg.signals.tbt_slo_s,
    )
    gateway.metrics.listeners.append(StatsListener(model, stats))
    members = gateway.pool.for_model(model)
    template = (
        members[0].config if members else InstanceConfig(id="template", url="http://127.0.0.1:1", model=model)
    )
    queue = gateway.admission[model]
    source = InProcessSignalSource(
        views=lambda: [u.view() for u in gateway.pool.for_model(model)],
        queued=lambda: queue.queue.depth,
        stats=stats,
    )
    return ControlLoop(
        cfg.build_scaler(),
        spec,
        build_actuator(cfg),
        source,
        registry=GatewayRegistry(gateway, model, template),
        interval_s=cfg.interval_s,
        pool=model,
        dry_run=cfg.dry_run,
        adopt_existing=cfg.adopt_existing,
        max_drain_s=cfg.max_drain_s,
        metrics=LoopMetrics(gateway.metrics.registry, model),
    )
