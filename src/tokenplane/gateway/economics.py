"""What an attempt cost in the gateway, and the economics families of ``/metrics``.

Cost model (:class:`CostModel`): an attempt costs ``prompt tokens x prefill $/token + output tokens
x decode $/token`` (:func:`tokenplane.core.economics.token_costs`), priced from the instance's
``price_per_hour`` and a throughput figure, chosen in this order:

1. the instance's own ``prefill_tokens_per_s`` / ``decode_tokens_per_s`` in the config;
2. the twin's step-time model (:class:`tokenplane.sim.perf_model.StepTimeModel`) for the instance's
   ``gpu`` and its model (the gateway's model name, then the name the instance serves it under), when
   the twin's catalogue knows both: prefill throughput at a full chunk of
   :data:`PREFILL_CHUNK_TOKENS`, decode throughput at a batch of
   :data:`tokenplane.sim.economics_report.DECODE_BATCH` sequences of ``DECODE_CONTEXT`` tokens (the
   figures the twin's own reports price with, so twin and gateway costs are comparable);
3. ``ledger.prefill_tokens_per_s`` / ``ledger.decode_tokens_per_s`` (defaults 10,000 and 2,000).

The gateway does not know prompt-cache hits per request, so every prompt token is priced as computed
(an upper bound); prompt tokens are the gateway's estimate (about four characters per token) and
output tokens what the instance reported in ``usage`` (or the token events relayed). A failed attempt
costs what it processed before failing; per-token prices are computed once per instance.

Metrics (:class:`EconomicsMetrics`): counters ``tokenplane_cost_usd_total{tenant, model}`` and
``tokenplane_tasks_total{tenant, model, outcome}`` (per replica, counted when this gateway settles a
task), and gauges ``tokenplane_cost_per_successful_task_usd{tenant}`` and
``tokenplane_success_per_dollar{tenant}`` read from a snapshot of the ledger's aggregates (shared by
every replica), which the ``/metrics`` handler refreshes off the event loop before rendering.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenplane.core.economics import EconomicsSummary, TokenCosts, token_costs
from tokenplane.gateway.config import InstanceConfig, LedgerConfig
from tokenplane.gateway.lean_metrics import LeanCounter

__all__ = ["PREFILL_CHUNK_TOKENS", "CostModel", "EconomicsMetrics", "twin_throughput"]

log = logging.getLogger(__name__)

PREFILL_CHUNK_TOKENS = 2048
"""Prefill chunk the twin-derived prefill throughput is taken at (vLLM's default token budget)."""


def twin_throughput(gpu: str, models: tuple[str, ...]) -> tuple[float, float] | None:
    """(prefill, decode) tokens/s from the twin's step-time model, or ``None`` if it knows neither."""
    if not gpu:
        return None
    try:
        from tokenplane.sim.catalog import Catalog
        from tokenplane.sim.economics_report import DECODE_BATCH, DECODE_CONTEXT
        from tokenplane.sim.perf_model import StepTimeModel
    except ImportError:  # pragma: no cover - the twin ships with the package
        return None
    catalog = Catalog.default()
    try:
        gpu_spec = catalog.gpu(gpu)
    except LookupError:
        return None
    for name in models:
        try:
            model_spec = catalog.model(name)
        except LookupError:
            continue
        steps = StepTimeModel(gpu_spec, model_spec)
        chunk = PREFILL_CHUNK_TOKENS
        prefill = chunk / steps.step_time(chunk, 0, chunk * (chunk + 1) // 2)
        decode = DECODE_BATCH / steps.step_time(DECODE_BATCH, DECODE_BATCH * DECODE_CONTEXT, 0)
        return prefill, decode
    return None


class CostModel:
    """Per-token prices per instance (computed once per instance configuration), and attempt costs."""

    def __init__(self, config: LedgerConfig, served_names: Mapping[str, str] | None = None) -> None:
        self._config = config
        self._served = dict(served_names or {})
        self._cache: dict[tuple[str, str, str, float], tuple[TokenCosts, str]] = {}

    def costs(self, inst: InstanceConfig) -> tuple[TokenCosts, str]:
        """The instance's per-token prices and where its throughput came from (config|twin|default)."""
        key = (inst.id, inst.gpu, inst.model, inst.price_per_hour)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        source = "config"
        prefill, decode = inst.prefill_tokens_per_s, inst.decode_tokens_per_s
        if prefill is None or decode is None:
            names = (inst.model, self._served.get(inst.model, inst.model))
            twin = twin_throughput(inst.gpu, names)
            if twin is not None:
                source = "twin"
            else:
                source = "default"
                twin = (self._config.prefill_tokens_per_s, self._config.decode_tokens_per_s)
            prefill = prefill if prefill is not None else twin[0]
            decode = decode if decode is not None else twin[1]
        out = (
            token_costs(inst.price_per_hour, prefill_tokens_per_s=prefill, decode_tokens_per_s=decode),
            source,
        )
        self._cache[key] = out
        return out

    def attempt_cost(self, inst: InstanceConfig, prompt_tokens: int, output_tokens: int) -> float:
        c = self.costs(inst)[0]
        return (
            max(0, prompt_tokens) * c.prefill_usd_per_token + max(0, output_tokens) * c.decode_usd_per_token
        )


class _SnapshotCollector(Collector):
    def __init__(self, metrics: EconomicsMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        cpt = GaugeMetricFamily(
            "tokenplane_cost_per_successful_task_usd",
            "Spend on settled tasks (failed attempts and failed tasks included) per task that succeeded",
            labels=["tenant"],
        )
        spd = GaugeMetricFamily(
            "tokenplane_success_per_dollar",
            "Tasks that succeeded per dollar spent on settled tasks",
            labels=["tenant"],
        )
        for tenant, s in sorted(self._m.snapshot.items()):
            if s.cost_per_successful_task is not None:
                cpt.add_metric([tenant], s.cost_per_successful_task)
            if s.success_per_dollar is not None:
                spd.add_metric([tenant], s.success_per_dollar)
        yield cpt
        yield spd


class EconomicsMetrics:
    """Cost and task counters (incremented by the gateway) and the ledger-snapshot gauges."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._cost = LeanCounter(
            "tokenplane_cost_usd",
            "Attributed spend of upstream attempts, in dollars",
            ["tenant", "model"],
            registry=registry,
        )
        self._tasks = LeanCounter(
            "tokenplane_tasks",
            "Tasks (workflows; a request without one is a one-step task) settled, by outcome",
            ["tenant", "model", "outcome"],
            registry=registry,
        )
        self.snapshot: dict[str, EconomicsSummary] = {}
        """Per tenant, the ledger's aggregates as last read (see the module docstring)."""
        registry.register(_SnapshotCollector(self))

    def cost(self, tenant: str, model: str, usd: float) -> None:
        self._cost.labels(tenant, model).inc(usd)

    def task(self, tenant: str, model: str, outcome: str) -> None:
        self._tasks.labels(tenant, model or "unknown", outcome).inc()
