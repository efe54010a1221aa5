"""Online estimate of what one serving instance sustains, learned from observed throughput.

The spec's ``capacity_rps`` is a prior (from a benchmark, the twin's calibration, or a guess); real
capacity moves with the traffic mix (prompt and output lengths, cache hits). Throughput measures
capacity only while the pool is at its limit, so, per observation of ``per_instance = throughput /
ready serving instances``:

* saturated (the shell's judgement at the observed latency: a backlog of at least one request per
  ready instance, KV caches nearly full, or the TTFT SLO breached while loaded): ``per_instance`` is
  a measurement of the capacity;
* otherwise, ``per_instance > estimate`` is one too (the pool has been seen doing more than we
  thought); a lower throughput while unsaturated says nothing (the pool was not asked for more).

The estimate is a weighted mean of the prior and the measurements. The prior enters with weight
``prior_weight`` (2: it counts as two measurements); each measurement has weight 1 and every earlier
weight, the prior's included, is multiplied by ``1 − rate`` when one arrives, so the prior's share
``prior_weight·(1 − rate)^k / weight`` decays geometrically with the number ``k`` of measurements
(with the defaults: 100 % before any, 67 % after one, under 10 % after eight, under 1 % after
twenty) and old measurements fade too, which tracks a drifting mix. The estimate stays within
``[prior / bound, prior × bound]`` so a pathological window (a stalled instance, a burst of cache
hits) cannot run the fleet size away.

State is two floats; :meth:`observe` returns a new estimator (immutable value).
"""

from __future__ import annotations

import math

import msgspec

DEFAULT_LEARN_RATE = 0.2
DEFAULT_BOUND = 8.0
DEFAULT_KV_SATURATED = 0.9
DEFAULT_PRIOR_WEIGHT = 2.0


class CapacityEstimate(msgspec.Struct, frozen=True):
    """Per-instance capacity in one unit (req/s or tokens/s); ``None`` until the first measurement.

    ``weight`` is the total weight behind ``value`` and ``prior_weight`` the prior's part of it.
    """

    value: float | None = None
    observations: int = 0
    weight: float = 0.0
    prior_weight: float = 0.0
    ceiling: float | None = None  # the latest saturated measurement (what the pool did at its limit)

    def get(self, prior: float, *, bound: float = DEFAULT_BOUND) -> float:
        if self.value is None:
            return prior
        return min(prior * bound, max(prior / bound, self.value))

    @property
    def prior_share(self) -> float:
        """The prior's share of the estimate (1 before any measurement)."""
        if self.value is None or self.weight <= 0:
            return 1.0
        return self.prior_weight / self.weight

    def observe(
        self,
        per_instance: float,
        *,
        saturated: bool,
        prior: float,
        rate: float = DEFAULT_LEARN_RATE,
        bound: float = DEFAULT_BOUND,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    ) -> CapacityEstimate:
        if not (math.isfinite(per_instance) and per_instance > 0):
            return self
        current = self.get(prior, bound=bound)
        if not saturated and per_instance <= current:
            return self
        if self.value is None:
            value, weight, pw = prior, prior_weight, prior_weight
        else:
            value, weight, pw = current, self.weight, self.prior_weight
        keep = 1.0 - rate
        new_weight = keep * weight + 1.0
        updated = (keep * weight * value + per_instance) / new_weight
        clamped = min(prior * bound, max(prior / bound, updated))
        ceiling = per_instance if saturated else self.ceiling
        return CapacityEstimate(clamped, self.observations + 1, new_weight, keep * pw, ceiling)
