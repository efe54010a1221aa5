"""The plugin registry: names per kind, unknown names, bad params, duplicates."""

from __future__ import annotations

import random

import pytest

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.registry import BuildContext, PluginSpec, build, names, register

CTX = BuildContext(random.Random(0))


def test_builtins_are_registered() -> None:
    assert names("router") == [
        "least-requests",
        "least-tokens",
        "power-of-two",
        "prefix-affinity",
        "random",
        "round-robin",
        "seven-axis",
        "weighted",
    ]
    assert names("filter") == [
        "gpu-generation",
        "kv-below",
        "kv-headroom",
        "queue-below",
        "ready",
        "weights-ready",
    ]
    assert names("scorer") == [
        "gpu-fit",
        "hbm-headroom",
        "kv-usage",
        "latency-budget",
        "outstanding-tokens",
        "prefix-overlap",
        "queue-depth",
        "tenant-priority",
        "weights-ready",
        "workflow-affinity",
    ]
    assert names("picker") == ["max-score", "random-top"]


@pytest.mark.parametrize("kind", ["router", "filter", "scorer", "picker"])
def test_unknown_name_lists_the_known_ones(kind: str) -> None:
    with pytest.raises(InvalidPolicyConfig) as err:
        build(PluginSpec(kind, "does-not-exist"), CTX)
    message = str(err.value)
    assert "does-not-exist" in message
    for known in names(kind):
        assert known in message


def test_unknown_kind() -> None:
    with pytest.raises(InvalidPolicyConfig, match="known: none"):
        build(PluginSpec("gizmo", "x"), CTX)


@pytest.mark.parametrize(
    "spec",
    [
        PluginSpec("router", "prefix-affinity", {"cache_threshold": -1}),
        PluginSpec("router", "prefix-affinity", {"balance_abs_threshold": True}),
        PluginSpec("router", "least-tokens", {"anything": 1}),
        PluginSpec("filter", "kv-below", {"max_kv_usage": "0.5"}),
        PluginSpec("filter", "queue-below", {"max_waiting": 1.5}),
        PluginSpec("picker", "random-top", {"top_k": -2}),
        PluginSpec("scorer", "queue-depth", {"normalise": False}),
    ],
)
def test_bad_params(spec: PluginSpec) -> None:
    with pytest.raises(InvalidPolicyConfig, match=spec.name):
        build(spec, CTX)


def test_duplicate_registration_is_refused() -> None:
    with pytest.raises(InvalidPolicyConfig, match="duplicate"):
        register("router", "round-robin")(lambda params, ctx: None)


def test_parse_shapes() -> None:
    assert PluginSpec.parse("x", default_kind="router") == PluginSpec("router", "x", {})
    assert PluginSpec.parse({"name": "x", "params": {"a": 1}}, default_kind="filter") == PluginSpec(
        "filter", "x", {"a": 1}
    )
