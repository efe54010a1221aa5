"""Each disaggregated model's pool: its pair router and config, and the P/D counters."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter

from tokenplane.core.routing import PairRouter, build_pair_router
from tokenplane.gateway.disagg.config import PoolConfig

EVENTS = ("handover", "prefill_failed", "kv_transfer_failed", "colocated_fallback")


class PdMetrics:
    """``tokenplane_pd_events_total{model, event}``: handovers, prefills failed over, KV loads that
    failed (prefilled again), requests a decode instance served whole for want of a prefill one."""

    def __init__(self, registry: CollectorRegistry, models: Sequence[str]) -> None:
        counter = Counter(
            "tokenplane_pd_events",
            "Prefill/decode disaggregation: handovers and what went wrong on either side.",
            ["model", "event"],
            registry=registry,
        )
        self.events = {(m, e): counter.labels(m, e) for m in models for e in EVENTS}

    def count(self, model: str, event: str) -> None:
        self.events[(model, event)].inc()


class PdPool:
    __slots__ = ("config", "router")

    def __init__(self, config: PoolConfig, rng: random.Random) -> None:
        self.config = config
        self.router: PairRouter = build_pair_router(config.pair_router, rng)


class DisaggregatedPools:
    """The disaggregated models of a gateway (built once, with the gateway's state)."""

    def __init__(
        self, pools: Mapping[str, PoolConfig], registry: CollectorRegistry, rng: random.Random
    ) -> None:
        self.pools = {name: PdPool(cfg, rng) for name, cfg in pools.items()}
        self.metrics = PdMetrics(registry, list(pools))

    @classmethod
    def from_models(
        cls, models: Sequence[tuple[str, PoolConfig]], registry: CollectorRegistry, rng: random.Random
    ) -> DisaggregatedPools | None:
        pools = {name: cfg for name, cfg in models if cfg.disaggregated}
        return cls(pools, registry, rng) if pools else None


__all__ = ["EVENTS", "DisaggregatedPools", "PdMetrics", "PdPool"]
