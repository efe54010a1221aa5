"""Online estimate of what one serving instance sustains, learned from observed throughput.

The spec's ``capacity_rps`` is a prior (from a benchmark or the twin's calibration); real capacity
moves with the traffic mix (prompt and output lengths, cache hits). Throughput is only a measure of
capacity while the pool is saturated; otherwise it is a lower bound. So, per observation of
``per_instance = throughput / ready serving instances``:

* saturated (backlog of at least one request per ready instance, or mean KV use ≥ ``kv_saturated``):
  ``estimate ← (1 − rate)·estimate + rate·per_instance``, an EWMA toward the measured ceiling;
* otherwise, if ``per_instance > estimate``: ``estimate ← per_instance`` (we have seen it do more);
* the estimate stays within ``[prior / bound, prior × bound]`` so a pathological window (a stalled
  instance, a burst of cache hits) cannot run the fleet size away.

State is one float per unit; :meth:`observe` returns a new estimator (immutable value), so the
scaler's state stays a plain value it can expose and compare.
"""

from __future__ import annotations

import math

import msgspec

DEFAULT_LEARN_RATE = 0.2
DEFAULT_BOUND = 4.0
DEFAULT_KV_SATURATED = 0.9


class CapacityEstimate(msgspec.Struct, frozen=True):
    """Per-instance capacity in one unit (req/s or tokens/s); ``None`` until first learned."""

    value: float | None = None
    observations: int = 0

    def get(self, prior: float, *, bound: float = DEFAULT_BOUND) -> float:
        if self.value is None:
            return prior
        return min(prior * bound, max(prior / bound, self.value))

    def observe(
        self,
        per_instance: float,
        *,
        saturated: bool,
        prior: float,
        rate: float = DEFAULT_LEARN_RATE,
        bound: float = DEFAULT_BOUND,
    ) -> CapacityEstimate:
        if not (math.isfinite(per_instance) and per_instance > 0):
            return self
        current = self.get(prior, bound=bound)
        if saturated:
            updated = (1.0 - rate) * current + rate * per_instance
        elif per_instance > current:
            updated = per_instance
        else:
            return self
        clamped = min(prior * bound, max(prior / bound, updated))
        return CapacityEstimate(clamped, self.observations + 1)
