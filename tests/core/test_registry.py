"""The plugin registry: names per kind, unknown names, bad params, duplicates, and typed families."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from tokenplane.core.autoscale.base import AUTOSCALERS, Autoscaler
from tokenplane.core.errors import InvalidPolicyConfig, PluginFamilyMismatch
from tokenplane.core.registry import BuildContext, Family, PluginSpec, build, names, register
from tokenplane.core.routing import RoundRobinRouter
from tokenplane.core.routing.base import FILTERS, PICKERS, ROUTERS, SCORERS, Filter, Picker, Router, Scorer

CTX = BuildContext(random.Random(0))
FAMILIES: dict[str, Family[Any]] = {
    "router": ROUTERS,
    "filter": FILTERS,
    "scorer": SCORERS,
    "picker": PICKERS,
    "autoscaler": AUTOSCALERS,
}


def test_builtins_are_registered() -> None:
    assert names("router") == [
        "least-requests",
        "least-tokens",
        "lora-aware",
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
        "lora-affinity",
        "outstanding-tokens",
        "prefix-overlap",
        "queue-depth",
        "tenant-priority",
        "weights-ready",
        "workflow-affinity",
    ]
    assert names("picker") == ["max-score", "random-top"]
    assert names(PICKERS) == names("picker")


@pytest.mark.parametrize(
    ("family", "protocol"),
    [(ROUTERS, Router), (FILTERS, Filter), (SCORERS, Scorer), (PICKERS, Picker), (AUTOSCALERS, Autoscaler)],
)
def test_every_builtin_builds_as_a_member_of_its_family(family: Family[Any], protocol: type) -> None:
    needs = {"static": {"instances": 2}}  # the one built-in without defaults for every param
    for name in names(family):
        built = build(PluginSpec(family.kind, name, needs.get(name, {})), CTX, family)
        assert isinstance(built, protocol)
        assert built.name == name


@pytest.mark.parametrize("kind", ["router", "filter", "scorer", "picker"])
def test_unknown_name_lists_the_known_ones(kind: str) -> None:
    with pytest.raises(InvalidPolicyConfig) as err:
        build(PluginSpec(kind, "does-not-exist"), CTX, FAMILIES[kind])
    message = str(err.value)
    assert "does-not-exist" in message
    for known in names(kind):
        assert known in message


def test_unknown_kind() -> None:
    with pytest.raises(InvalidPolicyConfig, match="known: none"):
        build(PluginSpec("gizmo", "x"), CTX, Family("gizmo", object))


def test_a_spec_of_another_kind_is_refused_with_its_path() -> None:
    with pytest.raises(InvalidPolicyConfig, match=r"scorer/kv-usage: expected kind 'router'") as err:
        build(PluginSpec("scorer", "kv-usage"), CTX, ROUTERS)
    assert not isinstance(err.value, PluginFamilyMismatch)


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
        build(spec, CTX, FAMILIES[spec.kind])


def test_duplicate_registration_is_refused() -> None:
    with pytest.raises(InvalidPolicyConfig, match="duplicate"):
        register(ROUTERS, "round-robin")(lambda params, ctx: RoundRobinRouter())


# -- a factory that builds the wrong thing ---------------------------------------------------------


class _NotARouter:
    """Has a name and ``select`` but no ``on_routed``/``on_finished``/``forget``."""

    name = "half-a-router"

    def select(self, *args: object, **kwargs: object) -> None:
        return None


class _ForgetlessRouter(RoundRobinRouter):
    forget = None  # type: ignore[assignment]  # hides the method: no longer a Router


def _half(params: Mapping[str, Any], ctx: BuildContext) -> Any:
    return _NotARouter()


_TEST_KIND: Family[Router] = Family("test-router", Router)
register(_TEST_KIND, "half")(_half)
register(_TEST_KIND, "scorer-in-disguise")(
    lambda params, ctx: build(PluginSpec("scorer", "kv-usage"), ctx, SCORERS)
)  # type: ignore[arg-type,return-value]
register(_TEST_KIND, "round-robin")(lambda params, ctx: RoundRobinRouter())


@pytest.mark.parametrize(
    ("name", "built"),
    [("half", "_NotARouter"), ("scorer-in-disguise", "KvUsageScorer")],
)
def test_a_factory_that_builds_another_family_is_refused_naming_the_spec(name: str, built: str) -> None:
    with pytest.raises(PluginFamilyMismatch) as err:
        build(PluginSpec("test-router", name), CTX, _TEST_KIND)
    message = str(err.value)
    assert message.startswith(f"test-router/{name}: ")
    assert built in message and "Router" in message
    assert isinstance(err.value, InvalidPolicyConfig)  # callers that catch config errors catch it too


def test_the_family_check_passes_a_member_through_unchanged() -> None:
    router = build(PluginSpec("test-router", "round-robin"), CTX, _TEST_KIND)
    assert type(router) is RoundRobinRouter


def test_a_router_without_forget_is_not_a_router() -> None:
    with pytest.raises(PluginFamilyMismatch, match="_ForgetlessRouter"):
        ROUTERS.check(PluginSpec("router", "x"), _ForgetlessRouter())


def test_parse_shapes() -> None:
    assert PluginSpec.parse("x", default_kind="router") == PluginSpec("router", "x", {})
    assert PluginSpec.parse({"name": "x", "params": {"a": 1}}, default_kind="filter") == PluginSpec(
        "filter", "x", {"a": 1}
    )
    assert PluginSpec("router", "x").path == "router/x"
