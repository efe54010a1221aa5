"""What an autoscaler reads: one pool's measured state (:class:`PoolSignal`: the lifecycle's
instances by state plus the :class:`PoolMeasures` of demand and service) and its fixed shape
(:class:`PoolSpec`).

Both are frozen ``msgspec.Struct``s built by the shell (the twin from its fleet model, the gateway from
its accounting and the instances' metrics) and handed to the policy unchanged, as :mod:`views` does
for routing.

Instance lifecycle, as the autoscalers see it::

    START_COLD ─▶ warming ──(cold_start_s)──▶ warm ──ACTIVATE_WARM (warm_activation_s)──▶ serving
                                               ▲  └─STOP_WARM─▶ gone                      │
                                               └──────────DRAIN_TO_WARM (after its work)───┤
                                                                  DRAIN (after its work) ──┴─▶ gone

A cold start always lands in the warm pool (loaded, idle, routed nothing); the next decision
activates it if serving is short. That keeps one path into service, so the policy never has to know
which warming instance was meant for which pool. An instance being activated is reported in
``serving`` with ``ready=False`` until it takes traffic. Every instance that holds a GPU (serving,
warm, warming, draining) counts against ``max_instances`` and costs ``cost_per_instance_hour``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from tokenplane.core.views import InstanceId, InstanceView

DEFAULT_COLD_START_S = 300.0
DEFAULT_WARM_ACTIVATION_S = 5.0

RateSample = tuple[float, float]
"""``(bucket_start_s, requests_per_second)`` for one complete arrival bucket."""

PROMPT_TOKENS_WINDOW_S = 60.0
"""The window of :attr:`PoolMeasures.prompt_tokens_per_s`, the same in every shell."""


def prompt_tokens_rate(
    bucket_tokens: Mapping[int, int], now: float, bucket_s: float, first_bucket: int = 0
) -> float | None:
    """Prompt tokens per second arrived over the last :data:`PROMPT_TOKENS_WINDOW_S` of complete
    buckets (bucket ``k`` covers ``[k * bucket_s, (k + 1) * bucket_s)``), counting from
    ``first_bucket`` (the shell's first); ``None`` before one bucket is complete."""
    current = int(now // bucket_s)  # the bucket in progress is not complete
    first = max(first_bucket, current - max(1, round(PROMPT_TOKENS_WINDOW_S / bucket_s)))
    if current <= first:
        return None
    return sum(bucket_tokens.get(b, 0) for b in range(first, current)) / ((current - first) * bucket_s)


class PoolSpec(msgspec.Struct, frozen=True):
    """The fixed shape of one pool: bounds, timings, capacity prior and price.

    ``capacity_rps`` is what one serving instance sustains at full utilisation (requests per second
    for this pool's traffic mix); the tokenplane scaler refines it online from throughput observed
    while saturated. ``capacity_tokens_per_s``, when set together with the signal's
    ``tokens_per_s_demand``, adds a token-throughput term (useful when request sizes drift).
    ``ttft_slo_s`` lets a TTFT p90 above the SLO count as SLO risk before attainment has dropped.
    """

    max_instances: int
    capacity_rps: float
    min_instances: int = 0
    warm_pool_size: int = 0
    cold_start_s: float = DEFAULT_COLD_START_S
    warm_activation_s: float = DEFAULT_WARM_ACTIVATION_S
    capacity_tokens_per_s: float | None = None
    cost_per_instance_hour: float = 0.0
    ttft_slo_s: float | None = None

    def __post_init__(self) -> None:
        if self.min_instances < 0:
            raise ValueError(f"min_instances must be >= 0, got {self.min_instances}")
        if self.max_instances < max(1, self.min_instances):
            raise ValueError(
                f"max_instances must be >= max(1, min_instances={self.min_instances}), "
                f"got {self.max_instances}"
            )
        if self.warm_pool_size < 0:
            raise ValueError(f"warm_pool_size must be >= 0, got {self.warm_pool_size}")
        for name in ("cold_start_s", "warm_activation_s", "cost_per_instance_hour"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not (math.isfinite(self.capacity_rps) and self.capacity_rps > 0):
            raise ValueError(f"capacity_rps must be a finite number > 0, got {self.capacity_rps}")
        tps = self.capacity_tokens_per_s
        if tps is not None and not (math.isfinite(tps) and tps > 0):
            raise ValueError(f"capacity_tokens_per_s must be > 0 when set, got {tps}")
        if self.ttft_slo_s is not None and not self.ttft_slo_s > 0:
            raise ValueError(f"ttft_slo_s must be > 0 when set, got {self.ttft_slo_s}")


class PoolMeasures(msgspec.Struct, frozen=True):
    """What a shell measures of one pool's demand and service (the half of a :class:`PoolSignal`
    that is not lifecycle), so that a shell's sample type can share these fields, not repeat them.

    * ``queued``: requests held by the gateway (admission queue) and not yet on an instance; the
      backlog the scalers see is ``queued`` plus every serving instance's ``waiting``.
    * ``arrivals``: per-bucket arrival rates, oldest first, complete buckets only, evenly spaced
      (a partial last bucket reads as a drop in demand).
    * ``tokens_per_s_demand``: tokens per second asked of the pool now.
    * ``prompt_tokens_per_s``: prompt tokens per second arrived over the last minute (``slo_budget``
      compares pool sizes on it: a prefill-bound pool's work follows prompt tokens, not requests).
    * ``throughput_rps``/``throughput_tps``: completions over a recent window (feeds the capacity
      estimator, which divides by the ready serving instances now: measure over a window in which
      the ready set did not change, or scale to the current ready count).
    * ``ttft_attainment``/``tbt_attainment``: fraction of recent requests within their SLO
      (``None`` when the window had none); ``*_p90_s``: the window's p90s.
    * ``utilisation``: mean busy fraction of the serving instances (GPU busy time, or running over
      max batch): the metric the HPA baseline scales on; tokenplane's scaler ignores it.
    """

    queued: int = 0
    arrivals: tuple[RateSample, ...] = ()
    tokens_per_s_demand: float | None = None
    prompt_tokens_per_s: float | None = None
    throughput_rps: float | None = None
    throughput_tps: float | None = None
    ttft_attainment: float | None = None
    tbt_attainment: float | None = None
    ttft_p90_s: float | None = None
    tbt_p90_s: float | None = None
    utilisation: float | None = None

    def measures_kwargs(self) -> dict[str, Any]:
        """These fields as keyword arguments (for a :class:`PoolSignal` built from a sample)."""
        return {name: getattr(self, name) for name in PoolMeasures.__struct_fields__}


class PoolSignal(PoolMeasures, frozen=True, kw_only=True):
    """One pool's state at ``now``, as measured by the shell: its :class:`PoolMeasures` plus

    * ``serving``: instances taking (or about to take, ``ready=False``) traffic, with their
      ``running``/``waiting``/``kv_usage``; ``warm``/``warming``/``draining``: ids by state.

    Keyword-only (``now`` is required and follows the measures' defaults).
    """

    now: float
    serving: tuple[InstanceView, ...] = ()
    warm: tuple[InstanceId, ...] = ()
    warming: tuple[InstanceId, ...] = ()
    draining: tuple[InstanceId, ...] = ()

    @property
    def backlog(self) -> int:
        """Requests waiting anywhere in the pool (gateway queue plus engine queues)."""
        return max(0, self.queued) + sum(max(0, v.waiting) for v in self.serving)

    @property
    def total_instances(self) -> int:
        """Every instance holding a GPU: what ``max_instances`` bounds and what costs money."""
        return len(self.serving) + len(self.warm) + len(self.warming) + len(self.draining)

    @property
    def mean_kv_usage(self) -> float:
        if not self.serving:
            return 0.0
        return sum(min(1.0, max(0.0, v.kv_usage)) for v in self.serving) / len(self.serving)
