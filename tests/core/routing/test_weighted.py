"""The weighted profile: filters, scorers, pickers, and the shared prefix index."""

from __future__ import annotations

import math
import random

import pytest
from block_chains import chain
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.registry import BuildContext, PluginSpec, build
from tokenplane.core.routing import WeightedRouter, build_router
from tokenplane.core.routing.base import FILTERS, PICKERS, SCORERS
from tokenplane.core.routing.filters import KvBelowFilter, QueueBelowFilter, ReadyFilter
from tokenplane.core.routing.pickers import MaxScorePicker, RandomTopPicker
from tokenplane.core.routing.prefix_affinity import surviving_depths
from tokenplane.core.routing.scorers import (
    KvUsageScorer,
    OutstandingTokensScorer,
    PrefixOverlapScorer,
    QueueDepthScorer,
)
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason

REQ = RequestInfo("r", "m", prompt_tokens=10, max_output_tokens=10)


def req(hashes: tuple[int, ...]) -> RequestInfo:
    return RequestInfo("r", "m", prompt_tokens=16 * len(hashes), max_output_tokens=8, block_hashes=hashes)


def iv(iid: str, **kw: object) -> InstanceView:
    return InstanceView(iid, **kw)  # type: ignore[arg-type]


def weighted(params: dict[str, object], seed: int = 0) -> WeightedRouter:
    router = build_router({"name": "weighted", "params": params}, random.Random(seed))
    assert isinstance(router, WeightedRouter)
    return router


# -- filters ------------------------------------------------------------------------------------


def test_ready_filter() -> None:
    cands = [iv("a"), iv("b", ready=False), iv("c", healthy=False)]
    assert [v.instance_id for v in ReadyFilter().filter(REQ, cands, now=0)] == ["a"]


@pytest.mark.parametrize(
    ("kv", "limit", "kept"),
    [
        ((0.2, 0.95, 0.5), 0.9, ["a", "c"]),
        ((0.2, 0.9, 0.5), 0.9, ["a", "b", "c"]),  # inclusive
        ((0.95, 0.99), 0.9, ["a", "b"]),  # all above: keep the originals
    ],
)
def test_kv_below(kv: tuple[float, ...], limit: float, kept: list[str]) -> None:
    cands = [iv(chr(97 + i), kv_usage=k) for i, k in enumerate(kv)]
    out = KvBelowFilter(limit).filter(REQ, cands, now=0)
    assert [v.instance_id for v in out] == kept


def test_kv_below_keeps_same_object() -> None:
    cands = [iv("a", kv_usage=0.1)]
    assert KvBelowFilter(0.9).filter(REQ, cands, now=0) is cands


@pytest.mark.parametrize(
    ("waiting", "limit", "kept"),
    [((0, 5, 10), 5, ["a", "b"]), ((9, 10), 5, []), ((0, 0), 0, ["a", "b"])],
)
def test_queue_below(waiting: tuple[int, ...], limit: int, kept: list[str]) -> None:
    cands = [iv(chr(97 + i), waiting=w) for i, w in enumerate(waiting)]
    assert [v.instance_id for v in QueueBelowFilter(limit).filter(REQ, cands, now=0)] == kept


# -- scorers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cands", "expected"),
    [
        ([iv("a", waiting=2, running=2), iv("b", running=2), iv("c")], [0.0, 0.5, 1.0]),
        ([iv("a"), iv("b")], [1.0, 1.0]),
    ],
)
def test_queue_depth(cands: list[InstanceView], expected: list[float]) -> None:
    assert QueueDepthScorer().score(REQ, cands, now=0) == expected


def test_outstanding_tokens() -> None:
    cands = [iv("a", outstanding_tokens=300), iv("b", outstanding_tokens=75), iv("c", outstanding_tokens=-5)]
    assert OutstandingTokensScorer().score(REQ, cands, now=0) == [0.0, 0.75, 1.0]


def test_kv_usage_is_clamped() -> None:
    cands = [iv(c, kv_usage=k) for c, k in zip("abcde", (0.25, 1.7, -0.5, math.nan, 1.0), strict=True)]
    assert KvUsageScorer().score(REQ, cands, now=0) == [0.75, 0.0, 1.0, 0.0, 0.0]


def test_prefix_overlap_uses_the_shared_index() -> None:
    scorer = PrefixOverlapScorer()
    scorer.index.insert("a", chain(1, 2, 3, 4), now=0)
    scorer.index.insert("b", chain(1, 2), now=0)
    cands = [iv("a"), iv("b"), iv("c")]
    assert scorer.score(req(chain(1, 2, 3, 4)), cands, now=0) == [1.0, 0.5, 0.0]
    assert scorer.score(req(()), cands, now=0) == [0.0, 0.0, 0.0]


def test_prefix_overlap_reads_the_engines_caches_in_precise_mode() -> None:
    """With ``cached_prefix_tokens`` (the gateway's tokenized prompt matched against KV events), the
    score is each instance's cached leading tokens over the prompt; the approximate index, which
    believes "a" holds everything, is not read."""
    scorer = PrefixOverlapScorer()
    scorer.index.insert("a", chain(1, 2, 3, 4), now=0)
    exact = RequestInfo(
        "r", "m", prompt_tokens=64, max_output_tokens=8, block_hashes=chain(1, 2, 3, 4),
        cached_prefix_tokens={"b": 48, "c": 640},
    )  # fmt: skip
    assert scorer.score(exact, [iv("a"), iv("b"), iv("c")], now=0) == [0.0, 0.75, 1.0]


def test_prefix_overlap_discounts_a_queue_that_overcommits_the_cache() -> None:
    """Precise mode counts only what survives the instance's queue, by prefix-affinity's rule: "a"
    holds more, but 8,000 tokens in flight against a 5,000-token cache leave sqrt(5000 / 8500) of
    it (1227 of 1600 tokens); "b" is idle and keeps its 1300."""
    exact = RequestInfo("r", "m", prompt_tokens=2000, max_output_tokens=100,
                        cached_prefix_tokens={"a": 1600, "b": 1300})  # fmt: skip
    a = iv("a", outstanding_requests=2, outstanding_tokens=8000, kv_capacity_tokens=5000)
    b = iv("b", kv_capacity_tokens=5000)
    assert PrefixOverlapScorer().score(exact, [a, b], now=0) == [1227 / 2000, 0.65]
    assert PrefixOverlapScorer(queue_discount=False).score(exact, [a, b], now=0) == [0.8, 0.65]
    # the other replicas' share counts as known work: half from here, half from a peer, same figure
    half = iv("a", outstanding_requests=1, outstanding_tokens=4000, kv_capacity_tokens=5000,
              peer_outstanding_requests=1, peer_outstanding_tokens=4000)  # fmt: skip
    assert PrefixOverlapScorer().score(exact, [half, b], now=0) == [1227 / 2000, 0.65]
    # and the weighted router picks by it: "b" wins with the discount, "a" without
    scorers = [{"name": "prefix-overlap"}]
    assert weighted({"scorers": scorers}).select(exact, [a, b], now=0).instance_id == "b"
    off = [{"name": "prefix-overlap", "params": {"queue_discount": False}}]
    assert weighted({"scorers": off}).select(exact, [a, b], now=0).instance_id == "a"


def test_prefix_overlap_rejects_unknown_params() -> None:
    with pytest.raises(InvalidPolicyConfig, match="prefix-overlap"):
        weighted({"scorers": [{"name": "prefix-overlap", "params": {"discount": True}}]})


_views = st.builds(
    InstanceView,
    instance_id=st.sampled_from(["i0", "i1", "i2", "i3"]),
    outstanding_requests=st.integers(0, 40),
    outstanding_tokens=st.integers(0, 50_000),
    running=st.integers(0, 40),
    waiting=st.integers(0, 40),
    kv_capacity_tokens=st.integers(0, 20_000),
    peer_outstanding_requests=st.integers(0, 40),
    peer_outstanding_tokens=st.integers(0, 50_000),
)


@given(
    cands=st.lists(_views, min_size=1, max_size=4, unique_by=lambda v: v.instance_id),
    cached=st.dictionaries(st.sampled_from(["i0", "i1", "i2", "i3"]), st.integers(0, 20_000)),
    prompt=st.integers(1, 20_000),
    out=st.integers(0, 4096),
)
def test_prefix_overlap_and_prefix_affinity_discount_alike(
    cands: list[InstanceView], cached: dict[str, int], prompt: int, out: int
) -> None:
    """One rule: the scorer's discounted score is prefix-affinity's surviving depth over the prompt,
    in [0, 1] and never above the undiscounted score."""
    request = RequestInfo("r", "m", prompt_tokens=prompt, max_output_tokens=out, cached_prefix_tokens=cached)
    on = PrefixOverlapScorer().score(request, cands, now=0)
    off = PrefixOverlapScorer(queue_discount=False).score(request, cands, now=0)
    kept = surviving_depths(request, cached, cands)
    for v, s, raw in zip(cands, on, off, strict=True):
        assert s == min(1.0, kept.get(v.instance_id, 0) / prompt)
        assert 0.0 <= s <= raw <= 1.0


# -- pickers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("scores", "expected"), [([0.1, 0.9, 0.3], 1), ([0.5, 0.5], 0), ([0.0], 0)])
def test_max_score(scores: list[float], expected: int) -> None:
    assert MaxScorePicker().pick(scores) == expected


def test_random_top_stays_in_the_top_k() -> None:
    picker = RandomTopPicker(random.Random(1), top_k=2)
    picks = {picker.pick([0.1, 0.9, 0.3, 0.8]) for _ in range(200)}
    assert picks == {1, 3}
    assert RandomTopPicker(random.Random(1), top_k=10).pick([0.2]) == 0


# -- the profile --------------------------------------------------------------------------------


def test_profile_prefers_the_cached_instance_and_records_totals() -> None:
    router = weighted(
        {
            "scorers": [
                {"name": "prefix-overlap", "weight": 3},
                {"name": "queue-depth", "weight": 1},
            ],
            "record_scores": True,
        }
    )
    hashes = chain(1, 2, 3, 4)
    router.on_routed(req(hashes), "b", now=0)
    cands = [iv("a"), iv("b", running=4), iv("c", running=2)]
    d = router.select(req(hashes), cands, now=1)
    assert d.instance_id == "b" and d.reason is RouteReason.WEIGHTED_SCORE
    assert d.scores == pytest.approx({"a": 0.25, "b": 0.75, "c": 0.125})


def test_profile_filters_and_no_candidates() -> None:
    router = weighted({"filters": ["ready", {"name": "queue-below", "params": {"max_waiting": 3}}]})
    assert router.select(REQ, [iv("a", waiting=9)], now=0) == RouteDecision(None, RouteReason.NO_CANDIDATES)
    assert router.select(REQ, [], now=0).reason is RouteReason.NO_CANDIDATES
    d = router.select(REQ, [iv("a", waiting=9), iv("b", waiting=1, healthy=False), iv("c", waiting=2)], now=0)
    assert d.instance_id == "c"
    assert d.scores is None


def test_default_profile_builds_and_routes() -> None:
    router = build_router("weighted", random.Random(0))
    d = router.select(REQ, [iv("a", kv_usage=0.9), iv("b", kv_usage=0.1)], now=0)
    assert d.instance_id == "b"


def test_index_is_updated_only_in_on_routed() -> None:
    router = weighted({"scorers": [{"name": "prefix-overlap"}]})
    hashes = chain(1, 2)
    router.select(req(hashes), [iv("a"), iv("b")], now=0)
    assert len(router.index) == 0
    router.on_routed(req(hashes), "b", now=0)
    assert router.select(req(hashes), [iv("a"), iv("b")], now=1).instance_id == "b"
    router.forget("b")
    assert len(router.index) == 0


def test_weighted_random_top_same_seed_same_sequence() -> None:
    params = {"scorers": ["queue-depth"], "picker": {"name": "random-top", "params": {"top_k": 3}}}
    cands = [iv(f"i{k}", waiting=k % 4) for k in range(12)]
    a, b = weighted(params, seed=4), weighted(params, seed=4)
    picks = [a.select(REQ, cands, now=0) for _ in range(50)]
    assert picks == [b.select(REQ, cands, now=0) for _ in range(50)]
    assert {d.instance_id for d in picks} == {"i0", "i4", "i8"}  # the three with waiting == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"scorers": []}, "at least one scorer"),
        ({"scorers": [{"name": "nope"}]}, "unknown scorer 'nope'"),
        ({"scorers": [{"name": "kv-usage", "weight": -1}]}, "weight"),
        ({"scorers": [{"name": "kv-usage", "weight": "heavy"}]}, "weight"),
        ({"scorers": "kv-usage"}, "must be a list"),
        ({"filters": [{"name": "kv-below", "params": {"max_kv_usage": 2}}]}, "max_kv_usage"),
        ({"filters": [{"name": "queue-below", "params": {"max_waiting": -1}}]}, "max_waiting"),
        ({"filters": [{"kind": "scorer", "name": "kv-usage"}]}, "expected kind 'filter'"),
        ({"picker": {"name": "random-top", "params": {"top_k": 0}}}, "top_k"),
        ({"picker": {"name": "max-score", "params": {"x": 1}}}, "unknown params"),
        ({"scorer": []}, "unknown params"),
        ({"record_scores": "yes"}, "record_scores"),
    ],
)
def test_bad_profiles(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidPolicyConfig, match=message):
        build_router({"name": "weighted", "params": params}, random.Random())


def test_parts_build_through_the_registry() -> None:
    ctx = BuildContext(random.Random())
    assert isinstance(
        build(PluginSpec("filter", "kv-below", {"max_kv_usage": 0.5}), ctx, FILTERS), KvBelowFilter
    )
    assert isinstance(build(PluginSpec("scorer", "kv-usage"), ctx, SCORERS), KvUsageScorer)
    assert isinstance(build(PluginSpec("picker", "random-top", {"top_k": 4}), ctx, PICKERS), RandomTopPicker)
