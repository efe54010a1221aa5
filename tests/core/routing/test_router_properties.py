"""Hypothesis properties that hold for every router the registry builds."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.core.routing import WeightedRouter, build_router
from tokenplane.core.routing.base import Router
from tokenplane.core.routing.placement import WorkflowAffinityScorer
from tokenplane.core.routing.prefix_affinity import PrefixAffinityRouter
from tokenplane.core.routing.scorers import (
    KvUsageScorer,
    OutstandingTokensScorer,
    PrefixOverlapScorer,
    QueueDepthScorer,
)
from tokenplane.core.views import InstanceView, RequestInfo, RouteReason, WorkflowContext

CONFIGS: list[object] = [
    "round-robin",
    "random",
    "least-requests",
    "least-tokens",
    "power-of-two",
    {"name": "power-of-two", "params": {"load": "tokens"}},
    {"name": "prefix-affinity", "params": {"max_blocks_per_instance": 6, "balance_abs_threshold": 3}},
    {"name": "weighted", "params": {"record_scores": True, "max_blocks_per_instance": 6}},
    {
        "name": "weighted",
        "params": {
            "filters": ["ready", "kv-below", {"name": "queue-below", "params": {"max_waiting": 4}}],
            "scorers": [
                {"name": "prefix-overlap", "weight": 2},
                {"name": "outstanding-tokens", "weight": 0.5},
                {"name": "queue-depth", "weight": 0},
            ],
            "picker": {"name": "random-top", "params": {"top_k": 3}},
            "record_scores": True,
        },
    },
]
DETERMINISTIC = {"round-robin", "least-requests", "least-tokens", "prefix-affinity", "weighted"}

views = st.builds(
    InstanceView,
    instance_id=st.sampled_from([f"i{k}" for k in range(8)]),
    ready=st.booleans(),
    healthy=st.booleans(),
    outstanding_requests=st.integers(0, 60),
    outstanding_tokens=st.integers(0, 5000),
    running=st.integers(0, 20),
    waiting=st.integers(0, 8),
    kv_usage=st.floats(-0.5, 1.5) | st.just(float("nan")),
)
candidate_lists = st.lists(views, max_size=8, unique_by=lambda v: v.instance_id)
requests = st.builds(
    RequestInfo,
    request_id=st.just("r"),
    model=st.just("m"),
    prompt_tokens=st.integers(0, 100),
    max_output_tokens=st.just(8),
    block_hashes=st.lists(st.integers(0, 5), max_size=10).map(
        lambda bs: tuple(hash((0, *bs[:k])) for k in range(1, len(bs) + 1))
    ),
)
steps = st.lists(st.tuples(requests, candidate_lists), min_size=1, max_size=15)


def usable_ids(cands: list[InstanceView]) -> set[str]:
    return {v.instance_id for v in cands if v.ready and v.healthy}


def state_of(router: Router) -> object:
    if isinstance(router, PrefixAffinityRouter | WeightedRouter):
        return router.index.snapshot()
    return getattr(router, "cursor", None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.sampled_from(CONFIGS), steps=steps, seed=st.integers(0, 2**32))
def test_every_router_picks_a_usable_candidate_or_no_candidates(
    config: object, steps: list[tuple[RequestInfo, list[InstanceView]]], seed: int
) -> None:
    router = build_router(config, random.Random(seed))  # type: ignore[arg-type]
    for t, (request, cands) in enumerate(steps):
        before = state_of(router)
        d = router.select(request, cands, now=float(t))
        assert state_of(router) == before  # select never changes policy state
        ok = usable_ids(cands)
        if d.instance_id is None:
            assert d.reason is RouteReason.NO_CANDIDATES
            if not (isinstance(router, WeightedRouter) and router.filters):  # queue-below may empty it
                assert not ok
        else:
            assert d.instance_id in ok
            assert d.reason is not RouteReason.NO_CANDIDATES
        if router.name in DETERMINISTIC and not (
            isinstance(router, WeightedRouter) and router.picker.name == "random-top"
        ):
            assert router.select(request, cands, now=float(t)) == d
        if d.scores is not None:
            assert router.name == "weighted"
            assert all(0.0 <= s <= 1.0 for s in d.scores.values())
            assert set(d.scores) <= ok
        if d.instance_id is not None:
            router.on_routed(request, d.instance_id, now=float(t))
            if isinstance(router, PrefixAffinityRouter | WeightedRouter):
                for iid in router.index.instances:
                    assert router.index.blocks_held(iid) <= router.index.max_blocks_per_instance
            router.on_finished(request, d.instance_id, now=float(t) + 0.5)


@settings(max_examples=100, deadline=None)
@given(
    request=requests,
    cands=candidate_lists,
    history=st.lists(st.tuples(requests, st.sampled_from(["i0", "i1", "i2"]))),
)
def test_scores_are_within_unit_interval(
    request: RequestInfo, cands: list[InstanceView], history: list[tuple[RequestInfo, str]]
) -> None:
    prefix = PrefixOverlapScorer()
    for t, (past, iid) in enumerate(history):
        prefix.index.insert(iid, past.block_hashes, now=float(t))
    for scorer in (prefix, QueueDepthScorer(), OutstandingTokensScorer(), KvUsageScorer()):
        scores = scorer.score(request, cands, now=0.0)
        assert len(scores) == len(cands)
        assert all(0.0 <= s <= 1.0 for s in scores), (scorer.name, scores)


@settings(max_examples=30, deadline=None)
@given(
    config=st.sampled_from(["random", "power-of-two", CONFIGS[-1]]),
    steps=steps,
    seed=st.integers(0, 2**32),
)
def test_same_seed_same_sequence(
    config: object, steps: list[tuple[RequestInfo, list[InstanceView]]], seed: int
) -> None:
    def run() -> list[object]:
        router = build_router(config, random.Random(seed))  # type: ignore[arg-type]
        out = []
        for t, (request, cands) in enumerate(steps):
            d = router.select(request, cands, now=float(t))
            out.append(d)
            if d.instance_id is not None:
                router.on_routed(request, d.instance_id, now=float(t))
        return out

    assert run() == run()


# -- forget: every router has it; it drops exactly the forgotten instance's state -----------------

FORGET_CONFIGS: list[object] = [*CONFIGS, {"name": "seven-axis", "params": {"max_blocks_per_instance": 6}}]
workflow_requests = st.builds(
    RequestInfo,
    request_id=st.just("r"),
    model=st.just("m"),
    prompt_tokens=st.integers(0, 100),
    max_output_tokens=st.just(8),
    block_hashes=requests.map(lambda r: r.block_hashes),
    workflow=st.none() | st.builds(WorkflowContext, workflow_id=st.sampled_from(["w0", "w1", "w2"])),
)
IDS = ["i0", "i1", "i2", "i3"]


def per_instance_state(router: Router) -> dict[str, list[object]]:
    """What a router keeps per instance: prefix-index entries and workflow affinities."""
    held: dict[str, list[object]] = {}
    if isinstance(router, PrefixAffinityRouter | WeightedRouter):
        for iid, entries in router.index.snapshot().items():
            if entries:
                held.setdefault(iid, []).append(entries)
    if isinstance(router, WeightedRouter):
        for scorer, _ in router.scorers:
            if isinstance(scorer, WorkflowAffinityScorer):
                for wid, iid in sorted(scorer.snapshot().items()):
                    held.setdefault(iid, []).append(wid)
    return held


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=st.sampled_from(FORGET_CONFIGS),
    history=st.lists(st.tuples(workflow_requests, st.sampled_from(IDS)), max_size=12),
    victim=st.sampled_from([*IDS, "never-seen"]),
    seed=st.integers(0, 2**32),
)
def test_forget_drops_the_instance_and_nothing_else(
    config: object, history: list[tuple[RequestInfo, str]], victim: str, seed: int
) -> None:
    router = build_router(config, random.Random(seed))  # type: ignore[arg-type]
    for t, (request, iid) in enumerate(history):
        router.on_routed(request, iid, now=float(t))
        router.on_finished(request, iid, now=t + 0.5)
    before, cursor = per_instance_state(router), state_of(router)
    if isinstance(router, PrefixAffinityRouter | WeightedRouter):
        cursor = None  # the index is compared per instance below
    router.forget(victim)
    after = per_instance_state(router)
    assert victim not in after
    assert after == {iid: state for iid, state in before.items() if iid != victim}
    if cursor is not None:
        assert state_of(router) == cursor  # routers without per-instance state: a no-op
    survivors = [InstanceView(iid) for iid in IDS if iid != victim]
    d = router.select(RequestInfo("r", "m", 1, 1), survivors, now=100.0)
    assert d.instance_id in {v.instance_id for v in survivors}


@pytest.mark.parametrize(
    ("config", "prefix_aware"),
    [
        ("round-robin", False),
        ("random", False),
        ("least-requests", False),
        ("least-tokens", False),
        ("power-of-two", False),
        ("prefix-affinity", True),
        ("weighted", True),
        ("seven-axis", True),
    ],
)
def test_forget_table(config: str, prefix_aware: bool) -> None:
    router = build_router(config, random.Random(0))
    chain = (11, 12, 13)
    step = RequestInfo("r", "m", 48, 8, block_hashes=chain, workflow=WorkflowContext("w"))
    router.on_routed(step, "a", now=0.0)
    router.on_routed(RequestInfo("s", "m", 48, 8, block_hashes=(21, 22)), "b", now=1.0)
    assert ("a" in per_instance_state(router)) is prefix_aware
    router.forget("a")
    router.forget("a")  # twice, and an unknown one: harmless
    router.forget("nobody")
    assert "a" not in per_instance_state(router)
    assert ("b" in per_instance_state(router)) is prefix_aware
