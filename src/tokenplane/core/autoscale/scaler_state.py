"""What the tokenplane scaler remembers between decisions (:class:`ScalerState`).

:mod:`.learning` updates the learned part from each signal, :mod:`.scale_down` the record of
decisions that the way down reads; :mod:`.policy` decides from both.
"""

from __future__ import annotations

import msgspec

from tokenplane.core.autoscale.budget import SloBudget
from tokenplane.core.autoscale.burst import BurstMemory
from tokenplane.core.autoscale.capacity import CapacityEstimate

__all__ = ["ScalerState"]


class ScalerState(msgspec.Struct, frozen=True):
    """Everything the tokenplane scaler remembers; replaced (never mutated) by observe/commit."""

    last_scale_up_s: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()  # (decided at, scale-down recommendation)
    capacity_rps: CapacityEstimate = CapacityEstimate()
    capacity_tps: CapacityEstimate = CapacityEstimate()
    burst_activation: BurstMemory = BurstMemory()  # rises within warm activation + one interval
    burst_cold: BurstMemory = BurstMemory()  # rises within a cold start + one interval
    safe_rps: float | None = None  # most req/s per instance served with comfortable latency
    first_decision_s: float | None = None
    last_asked: int | None = None  # serving + warm the previous decision asked for
    slo_budget: SloBudget = SloBudget()  # slo_budget: the run's banked SLO margin (:mod:`.budget`)
