"""build_router: the accepted config shapes and the errors for the rest."""

from __future__ import annotations

import random

import pytest

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.registry import names
from tokenplane.core.routing import (
    LeastRequestsRouter,
    PowerOfTwoRouter,
    PrefixAffinityRouter,
    RoundRobinRouter,
    WeightedRouter,
    build_router,
)


@pytest.mark.parametrize(
    ("config", "cls"),
    [
        ("round-robin", RoundRobinRouter),
        ({"name": "least-requests"}, LeastRequestsRouter),
        ({"name": "prefix-affinity", "params": {"cache_threshold": 0.7}}, PrefixAffinityRouter),
        ({"kind": "router", "name": "power-of-two", "params": {"load": "tokens"}}, PowerOfTwoRouter),
        ({"name": "weighted", "params": None}, WeightedRouter),
    ],
)
def test_accepted_shapes(config: object, cls: type) -> None:
    router = build_router(config, random.Random(0))  # type: ignore[arg-type]
    assert isinstance(router, cls)
    assert router.name in names("router")


def test_params_reach_the_router() -> None:
    router = build_router({"name": "prefix-affinity", "params": {"cache_threshold": 0.7}}, random.Random())
    assert isinstance(router, PrefixAffinityRouter) and router.cache_threshold == 0.7


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("no-such-router", "known: least-requests, least-tokens, lora-aware, power-of-two"),
        ({"kind": "scorer", "name": "kv-usage"}, "expected kind 'router'"),
        ({"name": "round-robin", "params": {"start": 3}}, "unknown params"),
        ({"name": "random", "params": {"seed": 3}}, "unknown params"),
        ({"name": "power-of-two", "params": {"load": "memory"}}, "load"),
        ({"name": "round-robin", "extra": 1}, "unknown keys"),
        ({"params": {}}, "mapping with 'name'"),
        ({"name": "round-robin", "params": [1]}, "params must be a mapping"),
    ],
)
def test_rejected(config: object, message: str) -> None:
    with pytest.raises(InvalidPolicyConfig, match=message):
        build_router(config, random.Random())  # type: ignore[arg-type]


def test_needs_an_injected_rng() -> None:
    with pytest.raises(InvalidPolicyConfig, match=r"random\.Random"):
        build_router("random", None)  # type: ignore[arg-type]
