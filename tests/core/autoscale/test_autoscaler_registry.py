"""Autoscalers build through the registry, and bad params or pool specs fail at start-up."""

from __future__ import annotations

from typing import Any

import pytest

from tokenplane.core.autoscale import (
    HpaScaler,
    StaticFleet,
    TokenplaneScaler,
    build_autoscaler,
    parse_pool_spec,
)
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.registry import names


def test_names() -> None:
    assert names("autoscaler") == ["hpa", "static", "tokenplane"]


def test_build_each() -> None:
    tp = build_autoscaler({"name": "tokenplane", "params": {"target_utilisation": 0.8, "burst_k": 2}})
    assert isinstance(tp, TokenplaneScaler)
    assert tp.params.target_utilisation == 0.8 and tp.params.burst_k == 2.0
    hpa = build_autoscaler({"kind": "autoscaler", "name": "hpa", "params": {"metric": "kv_usage"}})
    assert isinstance(hpa, HpaScaler) and hpa.metric == "kv_usage"
    static = build_autoscaler({"name": "static", "params": {"instances": 12}})
    assert isinstance(static, StaticFleet) and static.instances == 12
    assert isinstance(build_autoscaler("tokenplane"), TokenplaneScaler)


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "tokenplane", "params": {"target_utilisaton": 0.8}},  # typo
        {"name": "tokenplane", "params": {"target_utilisation": 0}},
        {"name": "tokenplane", "params": {"target_utilisation": 1.2}},
        {"name": "tokenplane", "params": {"learn_capacity": "yes"}},
        {"name": "tokenplane", "params": {"kv_target": 0.95, "kv_high": 0.9}},  # cross-field
        {"name": "tokenplane", "params": {"scale_down_hysteresis": 0.8}},  # >= target utilisation
        {"name": "hpa", "params": {"tolerance": -0.1}},
        {"name": "hpa", "params": {"metric": "cpu"}},
        {"name": "static", "params": {}},
        {"name": "static", "params": {"instances": 2.5}},
        {"name": "nope"},
        {"kind": "router", "name": "round-robin"},
    ],
)
def test_bad_configs(raw: dict[str, Any]) -> None:
    with pytest.raises(InvalidPolicyConfig):
        build_autoscaler(raw)


def test_pool_spec() -> None:
    spec = parse_pool_spec({"max_instances": 8, "capacity_rps": 1.5, "warm_pool_size": 1, "ttft_slo_s": 2})
    assert (spec.min_instances, spec.max_instances, spec.warm_pool_size, spec.ttft_slo_s) == (0, 8, 1, 2.0)
    assert spec.capacity_tokens_per_s is None


@pytest.mark.parametrize(
    "raw",
    [
        {"capacity_rps": 1.0},
        {"max_instances": 4},
        {"max_instances": 4, "capacity_rps": 0},
        {"max_instances": 2, "min_instances": 3, "capacity_rps": 1},
        {"max_instances": 4, "capacity_rps": 1, "cold_start_s": -1},
        {"max_instances": 4, "capacity_rps": 1, "warmup": 10},
    ],
)
def test_bad_pool_specs(raw: dict[str, Any]) -> None:
    with pytest.raises(InvalidPolicyConfig):
        parse_pool_spec(raw)
