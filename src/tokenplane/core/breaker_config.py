"""A circuit breaker board's parameters (:class:`BreakerConfig`), with their defaults and checks.

What each one does is in :mod:`tokenplane.core.breaker`'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader


class BreakerConfig(msgspec.Struct, frozen=True):
    consecutive_failures: int = 5
    window_s: float = 30.0
    min_requests: int = 20
    error_rate: float = 0.5
    latency_k: float = 3.0
    latency_min_samples: int = 10
    latency_min_instances: int = 3
    max_latency_ejection_fraction: float = 0.5
    cooldown_s: float = 5.0
    cooldown_multiplier: float = 2.0
    max_cooldown_s: float = 60.0
    half_open_probes: int = 1
    median_refresh_s: float = 0.1

    def validate(self) -> BreakerConfig:
        checks = (
            (self.consecutive_failures >= 1, "consecutive_failures must be >= 1"),
            (self.window_s > 0, "window_s must be > 0"),
            (self.min_requests >= 1, "min_requests must be >= 1"),
            (0 < self.error_rate <= 1, "error_rate must be in (0, 1]"),
            (self.latency_k > 1, "latency_k must be > 1"),
            (self.latency_min_samples >= 1, "latency_min_samples must be >= 1"),
            (self.latency_min_instances >= 2, "latency_min_instances must be >= 2"),
            (0 <= self.max_latency_ejection_fraction <= 1, "max_latency_ejection_fraction must be in [0, 1]"),
            (self.cooldown_s > 0, "cooldown_s must be > 0"),
            (self.cooldown_multiplier >= 1, "cooldown_multiplier must be >= 1"),
            (self.max_cooldown_s >= self.cooldown_s, "max_cooldown_s must be >= cooldown_s"),
            (self.half_open_probes >= 1, "half_open_probes must be >= 1"),
            (0 <= self.median_refresh_s <= self.window_s, "median_refresh_s must be in [0, window_s]"),
        )
        for ok, why in checks:
            if not ok:
                raise InvalidPolicyConfig(f"breaker: {why}, got {self}")
        return self

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> BreakerConfig:
        d = cls()
        r = ParamReader("breaker", params, tuple(cls.__struct_fields__))
        return cls(
            consecutive_failures=r.int_("consecutive_failures", d.consecutive_failures, min_value=1),
            window_s=r.float_("window_s", d.window_s),
            min_requests=r.int_("min_requests", d.min_requests, min_value=1),
            error_rate=r.float_("error_rate", d.error_rate),
            latency_k=r.float_("latency_k", d.latency_k),
            latency_min_samples=r.int_("latency_min_samples", d.latency_min_samples, min_value=1),
            latency_min_instances=r.int_("latency_min_instances", d.latency_min_instances, min_value=2),
            max_latency_ejection_fraction=r.float_(
                "max_latency_ejection_fraction", d.max_latency_ejection_fraction
            ),
            cooldown_s=r.float_("cooldown_s", d.cooldown_s),
            cooldown_multiplier=r.float_("cooldown_multiplier", d.cooldown_multiplier),
            max_cooldown_s=r.float_("max_cooldown_s", d.max_cooldown_s),
            half_open_probes=r.int_("half_open_probes", d.half_open_probes, min_value=1),
            median_refresh_s=r.float_("median_refresh_s", d.median_refresh_s),
        ).validate()
