"""A tokenplane scaler in the state a run would have reached: a learned capacity and an SLO bank,
so a test can ask one decision of it without replaying the run."""

from __future__ import annotations

import msgspec

from tokenplane.core.autoscale import TokenplaneParams, TokenplaneScaler
from tokenplane.core.autoscale.budget import SloBudget
from tokenplane.core.autoscale.scaler_state import ScalerState

# The evidence rules the slo_budget tests build on (the suite's, less the burst and warm-pool ones).
BUDGET_RULES = TokenplaneParams(
    target_utilisation=1.0,
    capacity_lower_bounds=True,
    trust_latency=True,
    window_from_cold_start=True,
    latency_queues=True,
    slo_budget=True,
)


def scaler_in_state(params: TokenplaneParams, budget: SloBudget, *, capacity_rps: float) -> TokenplaneScaler:
    """A scaler that has learned ``capacity_rps`` per instance (five saturated observations, that
    ceiling) and holds ``budget``."""
    scaler = TokenplaneScaler(params)
    state = ScalerState(first_decision_s=0.0, slo_budget=budget)
    scaler._state = msgspec.structs.replace(  # decide reads the state; only a run would write it
        state,
        capacity_rps=msgspec.structs.replace(
            state.capacity_rps, value=capacity_rps, observations=5, weight=5.0, ceiling=capacity_rps
        ),
    )
    return scaler
