"""The gateway's own Prometheus metrics, in a registry of its own (never the process-global one).

Per request: ``tokenplane_requests_total{model, tenant, outcome, reason}`` (``reason`` is the
router's :class:`~tokenplane.core.views.RouteReason`, ``none`` when the request was refused before
routing), ``tokenplane_ttft_seconds{model}`` (streams: arrival to first token event written) and
``tokenplane_request_duration_seconds{model, stream}``.

Per instance, read from the pool only when ``/metrics`` is scraped (no cost on the request path):
in-flight requests and tokens by this gateway, and the gateway's view of the instance's running,
waiting, KV usage, prefix-cache counters and health, with when that view was last scraped and the
scrapes that failed (a view that stopped moving shows as an old timestamp, not as idle).

The per-request families are :mod:`~tokenplane.gateway.lean_metrics` ones (plain numbers, families
built at scrape time): ``prometheus_client``'s own take a lock per value, ~1-1.7 µs a record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenplane.gateway.lean_metrics import LeanCounter, LeanHistogram
from tokenplane.gateway.upstreams import Upstream

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NO_REASON = "none"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _InstanceCollector(Collector):
    def __init__(self, upstreams: Callable[[], Iterable[Upstream]]) -> None:
        self._upstreams = upstreams

    def collect(self) -> Iterator[Metric]:
        labels = ["instance", "model"]
        fams = {
            "in_flight": GaugeMetricFamily(
                "tokenplane_instance_in_flight_requests", "Requests this gateway has in flight", labels=labels
            ),
            "in_flight_tokens": GaugeMetricFamily(
                "tokenplane_instance_in_flight_tokens",
                "Prompt plus max output tokens this gateway has in flight",
                labels=labels,
            ),
            "running": GaugeMetricFamily(
                "tokenplane_instance_running", "Running requests, as last scraped", labels=labels
            ),
            "waiting": GaugeMetricFamily(
                "tokenplane_instance_waiting", "Waiting requests, as last scraped", labels=labels
            ),
            "kv_usage": GaugeMetricFamily(
                "tokenplane_instance_kv_usage", "KV-cache usage in [0, 1], as last scraped", labels=labels
            ),
            "prefix_cache_hits": GaugeMetricFamily(
                "tokenplane_instance_prefix_cache_hits",
                "The instance's prefix-cache hit counter, as last scraped",
                labels=labels,
            ),
            "prefix_cache_queries": GaugeMetricFamily(
                "tokenplane_instance_prefix_cache_queries",
                "The instance's prefix-cache query counter, as last scraped",
                labels=labels,
            ),
            "healthy": GaugeMetricFamily(
                "tokenplane_instance_healthy", "1 when the instance is routable", labels=labels
            ),
        }
        scraped = GaugeMetricFamily(
            "tokenplane_instance_scrape_timestamp_seconds",
            "Unix time of the last runtime /metrics scrape that landed (absent before the first): "
            "the age of the running, waiting and KV-use view",
            labels=labels,
        )
        scrape_failures = CounterMetricFamily(
            "tokenplane_instance_scrape_failures",
            "Runtime /metrics scrapes that failed, by reason (timeout, status, connection, parse)",
            labels=[*labels, "reason"],
        )
        for u in self._upstreams():
            lv = [u.id, u.model]
            if u.scraped_at is not None:
                scraped.add_metric(lv, u.scraped_at)
            for reason, n in u.scrape_failures.items():
                scrape_failures.add_metric([*lv, reason], n)
            m = u.metrics
            fams["in_flight"].add_metric(lv, u.in_flight)
            fams["in_flight_tokens"].add_metric(lv, u.in_flight_tokens)
            fams["running"].add_metric(lv, m.running)
            fams["waiting"].add_metric(lv, m.waiting)
            fams["kv_usage"].add_metric(lv, m.kv_usage)
            fams["prefix_cache_hits"].add_metric(lv, m.prefix_cache_hits)
            fams["prefix_cache_queries"].add_metric(lv, m.prefix_cache_queries)
            fams["healthy"].add_metric(lv, 1.0 if u.healthy else 0.0)
        yield from fams.values()
        yield scraped
        yield scrape_failures


class RequestListener(Protocol):
    def request_done(self, model: str, outcome: str, duration_s: float, prompt_tokens: int) -> None: ...

    def first_token(self, model: str, ttft_s: float) -> None: ...


class GatewayMetrics:
    def __init__(self, upstreams: Callable[[], Iterable[Upstream]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = LeanCounter(
            "tokenplane_requests",
            "Requests by model, tenant, outcome and routing reason",
            ["model", "tenant", "outcome", "reason"],
            registry=self.registry,
        )
        self._ttft = LeanHistogram(
            "tokenplane_ttft_seconds",
            "Time to the first token event sent to the client (streams)",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._prompt_tokens = LeanCounter(
            "tokenplane_prompt_tokens",
            "Prompt tokens of the requests that ended, by model (the model's tokenizer's count where one "
            "is configured, else the gateway's estimate)",
            ["model"],
            registry=self.registry,
        )
        self._duration = LeanHistogram(
            "tokenplane_request_duration_seconds",
            "Arrival to the last byte sent",
            ["model", "stream"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_InstanceCollector(upstreams))
        # Observers of finished requests and first tokens (the autoscaler's signal source);
        # empty unless autoscaling is on.
        self.listeners: list[RequestListener] = []

    def request_done(
        self,
        model: str,
        tenant: str,
        outcome: str,
        reason: str,
        duration_s: float,
        stream: bool,
        prompt_tokens: int = 0,
    ) -> None:
        self._requests.labels(model, tenant, outcome, reason).inc()
        if prompt_tokens:
            self._prompt_tokens.labels(model).inc(prompt_tokens)
        for listener in self.listeners:
            listener.request_done(model, outcome, duration_s, prompt_tokens)
        if outcome == "ok":
            self._duration.labels(model, "true" if stream else "false").observe(duration_s)

    def first_token(self, model: str, ttft_s: float) -> None:
        self._ttft.labels(model).observe(ttft_s)
        for listener in self.listeners:
            listener.first_token(model, ttft_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
