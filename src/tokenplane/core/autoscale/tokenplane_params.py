"""The tokenplane scaler's parameters (:class:`TokenplaneParams`, documented with the algorithm in
:mod:`tokenplane.core.autoscale.policy`) and how a scenario's ``params`` mapping is read into them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tokenplane.core.params import ParamReader


class TokenplaneParams(msgspec.Struct, frozen=True):
    target_utilisation: float = 0.75
    scale_down_hysteresis: float = 0.1
    queue_drain_s: float = 30.0
    slo_target: float = 0.95
    slo_gain: float = 2.0
    slo_step_interval_s: float = 60.0
    slo_load_gate: float = 0.5
    kv_high: float = 0.9
    kv_target: float = 0.75
    cooldown_s: float = 180.0
    stabilisation_s: float = 180.0
    scale_down_step_fraction: float = 0.25
    decision_interval_s: float = 15.0
    forecast_alpha: float = 0.5
    forecast_beta: float = 0.3
    forecast_phi: float = 0.9
    burst_k: float = 1.5
    learn_capacity: bool = True
    capacity_learn_rate: float = 0.2
    capacity_bound: float = 8.0
    capacity_prior_weight: float = 2.0
    capacity_probe: float = 0.25
    comfort_fraction: float = 0.5
    probe_load_gate: float = 0.3
    learn_burstiness: bool = True
    burst_half_life_s: float | None = None  # None: 2 × stabilisation_s
    park_drained: bool = True
    symmetric_bursts: bool = False
    queue_buffer: bool = False
    window_from_cold_start: bool = False
    capacity_lower_bounds: bool = False
    trust_latency: bool = False
    latency_queues: bool = False
    warm_slo_share: bool = False
    cancel_warming: bool = False
    slo_budget: bool = False
    slo_period_s: float | None = None  # None: the bank alone (see :mod:`.budget`)
    slo_defer: bool = False  # with slo_period_s: see :func:`.budget.deferral`

    def __post_init__(self) -> None:
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"target_utilisation must be in (0, 1], got {self.target_utilisation}")
        if not 0 <= self.scale_down_hysteresis < self.target_utilisation:
            raise ValueError("scale_down_hysteresis must be in [0, target_utilisation)")
        if not 0 < self.kv_target <= self.kv_high <= 1:
            raise ValueError("need 0 < kv_target <= kv_high <= 1")
        if not 0 < self.slo_target <= 1:
            raise ValueError(f"slo_target must be in (0, 1], got {self.slo_target}")
        if not 0 < self.scale_down_step_fraction <= 1:
            raise ValueError("scale_down_step_fraction must be in (0, 1]")
        if not (
            0 < self.forecast_alpha <= 1 and 0 <= self.forecast_beta <= 1 and 0 <= self.forecast_phi <= 1
        ):
            raise ValueError("need 0 < forecast_alpha <= 1, 0 <= forecast_beta <= 1, 0 <= forecast_phi <= 1")
        if self.capacity_bound < 1:
            raise ValueError(f"capacity_bound must be >= 1, got {self.capacity_bound}")
        if self.slo_period_s is not None and not self.slo_period_s > 0:
            raise ValueError(f"slo_period_s must be > 0, got {self.slo_period_s}")
        if self.burst_half_life_s is not None and not self.burst_half_life_s > 0:
            raise ValueError(f"burst_half_life_s must be > 0, got {self.burst_half_life_s}")
        if not 0 < self.capacity_learn_rate <= 1:
            raise ValueError("capacity_learn_rate must be in (0, 1]")
        for name in ("queue_drain_s", "capacity_prior_weight"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")


FLOAT_PARAMS = {
    "target_utilisation": (0.0, 1.0, True),
    "scale_down_hysteresis": (0.0, 1.0, False),
    "queue_drain_s": (0.0, None, True),
    "slo_target": (0.0, 1.0, True),
    "slo_gain": (0.0, None, False),
    "slo_step_interval_s": (0.0, None, False),
    "slo_load_gate": (0.0, None, False),
    "kv_high": (0.0, 1.0, True),
    "kv_target": (0.0, 1.0, True),
    "cooldown_s": (0.0, None, False),
    "stabilisation_s": (0.0, None, False),
    "scale_down_step_fraction": (0.0, 1.0, True),
    "decision_interval_s": (0.0, None, False),
    "forecast_alpha": (0.0, 1.0, True),
    "forecast_beta": (0.0, 1.0, False),
    "forecast_phi": (0.0, 1.0, False),
    "burst_k": (0.0, None, False),
    "capacity_learn_rate": (0.0, 1.0, True),
    "capacity_bound": (1.0, None, False),
    "capacity_prior_weight": (0.0, None, True),
    "capacity_probe": (0.0, None, False),
    "comfort_fraction": (0.0, 1.0, True),
    "probe_load_gate": (0.0, 1.0, False),
}
BOOL_PARAMS = (
    "learn_capacity",
    "learn_burstiness",
    "park_drained",
    "symmetric_bursts",
    "queue_buffer",
    "window_from_cold_start",
    "capacity_lower_bounds",
    "trust_latency",
    "latency_queues",
    "warm_slo_share",
    "cancel_warming",
    "slo_budget",
    "slo_defer",
)


def read_params(params: Mapping[str, Any]) -> TokenplaneParams:
    """A scenario's ``params`` for the ``tokenplane`` autoscaler, checked (unknown keys refused)."""
    reader = ParamReader(
        "autoscaler 'tokenplane'", params, (*FLOAT_PARAMS, *BOOL_PARAMS, "burst_half_life_s", "slo_period_s")
    )
    defaults = TokenplaneParams()
    values: dict[str, Any] = {}
    for key, (lo, hi, exclusive) in FLOAT_PARAMS.items():
        values[key] = reader.float_(
            key, getattr(defaults, key), min_value=lo, max_value=hi, exclusive_min=exclusive
        )
    for key in BOOL_PARAMS:
        values[key] = reader.bool_(key, getattr(defaults, key))
    if reader.has("burst_half_life_s"):
        values["burst_half_life_s"] = reader.float_(
            "burst_half_life_s", 900.0, min_value=0.0, exclusive_min=True
        )
    if reader.has("slo_period_s"):
        values["slo_period_s"] = reader.float_("slo_period_s", 3600.0, min_value=0.0, exclusive_min=True)
    return TokenplaneParams(**values)
