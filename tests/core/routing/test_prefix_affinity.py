"""Prefix affinity: sticks to the instance holding a long shared prefix, falls back on imbalance."""

from __future__ import annotations

import random

import pytest
from block_chains import chain

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.routing import PrefixAffinityRouter, build_router
from tokenplane.core.views import InstanceView, RequestInfo, RouteReason


def req(rid: str, hashes: tuple[int, ...]) -> RequestInfo:
    return RequestInfo(rid, "m", prompt_tokens=16 * len(hashes), max_output_tokens=8, block_hashes=hashes)


def views(*loads: int, down: tuple[int, ...] = ()) -> list[InstanceView]:
    return [
        InstanceView(f"i{i}", outstanding_requests=load, ready=i not in down) for i, load in enumerate(loads)
    ]


SYSTEM = tuple(range(100, 110))  # 10 shared blocks


def test_long_shared_prefix_goes_back_to_the_same_instance() -> None:
    router = PrefixAffinityRouter()
    first = req("a", chain(*SYSTEM, 1, 2))
    d = router.select(first, views(3, 0, 2), now=0)
    assert (d.instance_id, d.reason) == ("i1", RouteReason.PREFIX_MISS_LEAST_LOADED)
    router.on_routed(first, "i1", now=0)
    follow = req("b", chain(*SYSTEM, 7, 8, 9))  # 10 of 13 blocks cached on i1
    d = router.select(follow, views(3, 4, 2), now=1)
    assert (d.instance_id, d.reason) == ("i1", RouteReason.PREFIX_MATCH)


def test_short_match_is_a_miss() -> None:
    router = PrefixAffinityRouter(cache_threshold=0.5)
    router.on_routed(req("a", chain(1, 2)), "i0", now=0)
    d = router.select(req("b", chain(1, 2, 3, 4)), views(1, 0), now=1)  # ratio 0.5, not > 0.5
    assert (d.instance_id, d.reason) == ("i1", RouteReason.PREFIX_MISS_LEAST_LOADED)


def test_imbalance_overrides_the_cache() -> None:
    router = PrefixAffinityRouter(balance_abs_threshold=32, balance_rel_threshold=1.5)
    hashes = chain(*SYSTEM)
    router.on_routed(req("a", hashes), "i0", now=0)
    d = router.select(req("b", hashes), views(40, 5, 6), now=1)
    assert (d.instance_id, d.reason) == ("i1", RouteReason.LOAD_IMBALANCE)
    # gap 35 > 32 but 40 < 30 * 1.5: balanced enough, the cache wins
    d = router.select(req("b", hashes), views(40, 30, 31), now=1)
    assert (d.instance_id, d.reason) == ("i0", RouteReason.PREFIX_MATCH)


@pytest.mark.parametrize(
    ("loads", "expected"),
    [((5, 2, 9), "i1"), ((5, 5, 9), "i0"), ((9, 9, 1), "i2")],
)
def test_ties_in_match_go_to_fewer_outstanding(loads: tuple[int, ...], expected: str) -> None:
    router = PrefixAffinityRouter()
    hashes = chain(*SYSTEM)
    for iid in ("i0", "i1", "i2"):
        router.on_routed(req("a", hashes), iid, now=0)
    d = router.select(req("b", hashes), views(*loads), now=1)
    assert (d.instance_id, d.reason) == (expected, RouteReason.PREFIX_MATCH)


def test_best_match_unusable_falls_back_to_the_next_best() -> None:
    router = PrefixAffinityRouter(cache_threshold=0.3)
    router.on_routed(req("a", chain(1, 2, 3, 4)), "i0", now=0)
    router.on_routed(req("b", chain(1, 2, 5)), "i1", now=0)
    probe = req("c", chain(1, 2, 3, 4))
    d = router.select(probe, views(0, 3, 0, down=(0,)), now=1)
    assert (d.instance_id, d.reason) == ("i1", RouteReason.PREFIX_MATCH)  # 2/4 > 0.3
    d = router.select(probe, [InstanceView("i2"), InstanceView("i1", outstanding_requests=1)], now=1)
    assert (d.instance_id, d.reason) == ("i1", RouteReason.PREFIX_MATCH)
    d = router.select(probe, [InstanceView("i2")], now=1)
    assert (d.instance_id, d.reason) == ("i2", RouteReason.PREFIX_MISS_LEAST_LOADED)


def test_no_block_hashes_is_a_miss_and_no_candidates() -> None:
    router = PrefixAffinityRouter()
    d = router.select(req("a", ()), views(3, 1), now=0)
    assert (d.instance_id, d.reason) == ("i1", RouteReason.PREFIX_MISS_LEAST_LOADED)
    assert router.select(req("a", ()), [], now=0).reason is RouteReason.NO_CANDIDATES
    assert router.select(req("a", ()), views(1, down=(0,)), now=0).reason is RouteReason.NO_CANDIDATES


def test_select_does_not_touch_the_index() -> None:
    router = PrefixAffinityRouter()
    router.on_routed(req("a", chain(*SYSTEM)), "i0", now=0)
    before = router.index.snapshot()
    probe = req("b", chain(*SYSTEM, 1))
    first = router.select(probe, views(0, 0), now=5)
    assert router.select(probe, views(0, 0), now=6) == first
    assert router.index.snapshot() == before


def test_bounded_memory_evicts_and_forget() -> None:
    router = build_router(
        {"name": "prefix-affinity", "params": {"max_blocks_per_instance": 8}}, random.Random()
    )
    assert isinstance(router, PrefixAffinityRouter)
    for k in range(20):
        router.on_routed(req(f"r{k}", chain(k, k + 1, k + 2)), "i0", now=float(k))
        assert router.index.blocks_held("i0") <= 8
    d = router.select(req("new", chain(19, 20, 21)), views(0, 0), now=30)
    assert (d.instance_id, d.reason) == ("i0", RouteReason.PREFIX_MATCH)
    d = router.select(req("old", chain(0, 1, 2)), views(0, 0), now=30)
    assert d.reason is RouteReason.PREFIX_MISS_LEAST_LOADED  # evicted long ago
    router.forget("i0")
    assert router.index.blocks_held("i0") == 0


@pytest.mark.parametrize(
    "params",
    [
        {"cache_threshold": 1.5},
        {"cache_threshold": -0.1},
        {"balance_abs_threshold": -1},
        {"balance_rel_threshold": 0.5},
        {"max_blocks_per_instance": 0},
        {"max_blocks_per_instance": 2.5},
        {"cache_threshold": "high"},
        {"cache_treshold": 0.5},
    ],
)
def test_bad_params(params: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicyConfig, match="prefix-affinity"):
        build_router({"name": "prefix-affinity", "params": params}, random.Random())


@pytest.mark.parametrize(
    ("cached", "loads", "want"),
    [
        ({"i2": 900}, (0, 0, 5), ("i2", RouteReason.KV_CACHE_MATCH)),  # the engine's word beats load
        ({"i0": 600, "i2": 900}, (0, 0, 0), ("i2", RouteReason.KV_CACHE_MATCH)),  # deepest wins
        ({"i0": 900, "i2": 900}, (4, 0, 1), ("i2", RouteReason.KV_CACHE_MATCH)),  # tie: fewer outstanding
        ({"i2": 500}, (0, 0, 0), ("i2", RouteReason.KV_CACHE_MATCH)),  # a real hit, however short
        ({}, (1, 0, 1), ("i1", RouteReason.KV_CACHE_MISS_LEAST_LOADED)),  # reported, and nobody holds it
        ({"i9": 1000}, (1, 0, 1), ("i1", RouteReason.KV_CACHE_MISS_LEAST_LOADED)),  # not a candidate
        ({"i2": 1000}, (0, 0, 40), ("i0", RouteReason.LOAD_IMBALANCE)),  # imbalance still wins
    ],
)
def test_precise_mode_uses_the_reported_cache_not_the_index(
    cached: dict[str, int], loads: tuple[int, ...], want: tuple[str, RouteReason]
) -> None:
    router = PrefixAffinityRouter()
    hashes = chain(*SYSTEM)
    router.on_routed(req("a", hashes), "i0", now=0)  # the approximate index believes i0 holds it all
    exact = RequestInfo("b", "m", prompt_tokens=1000, max_output_tokens=8, block_hashes=hashes,
                        cached_prefix_tokens=cached)  # fmt: skip
    d = router.select(exact, views(*loads), now=1)
    assert (d.instance_id, d.reason) == want


def test_precise_mode_has_its_own_threshold() -> None:
    exact = RequestInfo("b", "m", prompt_tokens=1000, max_output_tokens=8, cached_prefix_tokens={"i2": 500})
    strict = PrefixAffinityRouter(kv_cache_threshold=0.5)  # 500 / 1000 is not > 0.5
    d = strict.select(exact, views(0, 0, 0), now=1)
    assert (d.instance_id, d.reason) == ("i0", RouteReason.KV_CACHE_MISS_LEAST_LOADED)
    with pytest.raises(ValueError, match="kv_cache_threshold"):
        PrefixAffinityRouter(kv_cache_threshold=1.5)


def test_precise_mode_discounts_a_match_its_queue_would_evict() -> None:
    """i0 holds 1,200 of the prompt's tokens but its in-flight work overcommits its 5,000-token
    cache (9,000 + 800 + 100 = 9,900: sqrt(5,000 / 9,900) of 1,200 = 852 expected to survive); i1
    holds 1,000 and is idle: i1 wins. Without the discount, or with room on i0, i0 does."""
    exact = RequestInfo("b", "m", prompt_tokens=2000, max_output_tokens=100,
                        cached_prefix_tokens={"i0": 1200, "i1": 1000})  # fmt: skip

    def fleet(i0_tokens: int) -> list[InstanceView]:
        return [
            InstanceView("i0", outstanding_requests=3, outstanding_tokens=i0_tokens, kv_capacity_tokens=5000),
            InstanceView("i1", outstanding_requests=0, kv_capacity_tokens=5000),
        ]

    d = PrefixAffinityRouter().select(exact, fleet(9000), now=1)
    assert (d.instance_id, d.reason) == ("i1", RouteReason.KV_CACHE_MATCH)
    d = PrefixAffinityRouter().select(exact, fleet(3000), now=1)  # 3,000 + 800 + 100 fits
    assert (d.instance_id, d.reason) == ("i0", RouteReason.KV_CACHE_MATCH)
    off = build_router({"name": "prefix-affinity", "params": {"queue_discount": False}}, random.Random())
    d = off.select(exact, fleet(9000), now=1)
    assert (d.instance_id, d.reason) == ("i0", RouteReason.KV_CACHE_MATCH)
    with pytest.raises(InvalidPolicyConfig, match="queue_discount"):
        build_router({"name": "prefix-affinity", "params": {"queue_discount": "yes"}}, random.Random())
