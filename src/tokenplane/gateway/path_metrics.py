"""Request-path histograms beside :mod:`tokenplane.gateway.metrics`: where time goes per request.

* ``tokenplane_time_between_tokens_seconds{model}``: per streamed attempt that delivered at least two
  token events, the mean gap between them: ``(attempt end - its first token) / (tokens - 1)``. One
  observation per attempt (not per token: a per-token histogram would cost a lock per chunk on the
  relay loop); the attempt's end includes the final ``[DONE]``, a bound a little above the true mean.
* ``tokenplane_request_e2e_seconds{model, tenant}``: arrival to the last byte sent, for requests that
  succeeded (``tokenplane_request_duration_seconds`` has the same per ``model, stream``).
* ``tokenplane_upstream_duration_seconds{model, instance}``: each upstream attempt, from sending the
  request to the end of its answer (or its failure), retries and continuations included.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tokenplane.gateway.lean_metrics import LeanHistogram

__all__ = ["PathMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TBT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)


class PathMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._tbt = LeanHistogram(
            "tokenplane_time_between_tokens_seconds",
            "Mean time between token events of a streamed attempt",
            ["model"],
            buckets=_TBT_BUCKETS,
            registry=registry,
        )
        self._e2e = LeanHistogram(
            "tokenplane_request_e2e_seconds",
            "Arrival to the last byte sent, requests that succeeded, per model and tenant",
            ["model", "tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._upstream = LeanHistogram(
            "tokenplane_upstream_duration_seconds",
            "One upstream attempt, request sent to answer ended",
            ["model", "instance"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )

    def attempt(
        self, model: str, instance: str, duration_s: float, tokens: int, first_token_s: float | None
    ) -> None:
        self._upstream.labels(model, instance).observe(duration_s)
        if first_token_s is not None and tokens > 1:
            self._tbt.labels(model).observe(max(0.0, duration_s - first_token_s) / (tokens - 1))

    def request(self, model: str, tenant: str, duration_s: float) -> None:
        self._e2e.labels(model, tenant).observe(duration_s)
