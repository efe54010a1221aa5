"""Build an autoscaler and its pool spec from config slices, validated once at start-up.

``build_autoscaler("tokenplane")``, ``build_autoscaler({"name": "hpa", "params": {...}})`` or
``{kind: autoscaler, name: static, params: {instances: 12}}``; ``parse_pool_spec`` turns a pool's
mapping (``min_instances``, ``max_instances``, ``warm_pool_size``, ``cold_start_s``,
``warm_activation_s``, ``capacity_rps``, ``capacity_tokens_per_s``, ``cost_per_instance_hour``,
``ttft_slo_s``) into a :class:`PoolSpec`. Every failure is an
:class:`~tokenplane.core.errors.InvalidPolicyConfig` naming the key and the reason.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from tokenplane.core.autoscale.base import AUTOSCALERS, Autoscaler
from tokenplane.core.autoscale.signals import DEFAULT_COLD_START_S, DEFAULT_WARM_ACTIVATION_S, PoolSpec
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, PluginSpec, build

_POOL_KEYS = (
    "min_instances",
    "max_instances",
    "warm_pool_size",
    "cold_start_s",
    "warm_activation_s",
    "capacity_rps",
    "capacity_tokens_per_s",
    "cost_per_instance_hour",
    "ttft_slo_s",
)


def build_autoscaler(raw_config: Mapping[str, Any] | str, rng: random.Random | None = None) -> Autoscaler:
    """Parse and build one autoscaler (none of the built-ins uses randomness; ``rng`` is for plugins)."""
    spec = PluginSpec.parse(raw_config, default_kind="autoscaler")
    return build(spec, BuildContext(rng or random.Random(0)), AUTOSCALERS)


def parse_pool_spec(raw: Mapping[str, Any], *, owner: str = "pool") -> PoolSpec:
    reader = ParamReader(owner, raw, _POOL_KEYS)
    for key in ("max_instances", "capacity_rps"):
        if not reader.has(key):
            raise InvalidPolicyConfig(f"{owner}: {key!r} is required")
    tps = reader.float_("capacity_tokens_per_s", 1.0, min_value=0.0, exclusive_min=True)
    slo = reader.float_("ttft_slo_s", 1.0, min_value=0.0, exclusive_min=True)
    try:
        return PoolSpec(
            min_instances=reader.int_("min_instances", 0, min_value=0),
            max_instances=reader.int_("max_instances", 1, min_value=1),
            warm_pool_size=reader.int_("warm_pool_size", 0, min_value=0),
            cold_start_s=reader.float_("cold_start_s", DEFAULT_COLD_START_S, min_value=0.0),
            warm_activation_s=reader.float_("warm_activation_s", DEFAULT_WARM_ACTIVATION_S, min_value=0.0),
            capacity_rps=reader.float_("capacity_rps", 1.0, min_value=0.0, exclusive_min=True),
            capacity_tokens_per_s=tps if reader.has("capacity_tokens_per_s") else None,
            cost_per_instance_hour=reader.float_("cost_per_instance_hour", 0.0, min_value=0.0),
            ttft_slo_s=slo if reader.has("ttft_slo_s") else None,
        )
    except ValueError as exc:
        raise InvalidPolicyConfig(f"{owner}: {exc}") from exc
