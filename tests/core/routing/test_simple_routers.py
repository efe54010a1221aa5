"""Round-robin, random, least-requests, least-tokens and power-of-two over real values."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tokenplane.core.routing import (
    LeastRequestsRouter,
    LeastTokensRouter,
    PowerOfTwoRouter,
    RandomRouter,
    RoundRobinRouter,
    build_router,
)
from tokenplane.core.routing.candidates import usable
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason

REQ = RequestInfo("r", "m", prompt_tokens=10, max_output_tokens=10)


def views(*loads: int, tokens: tuple[int, ...] = (), down: tuple[int, ...] = ()) -> list[InstanceView]:
    return [
        InstanceView(
            f"i{i}",
            outstanding_requests=load,
            outstanding_tokens=tokens[i] if tokens else 0,
            healthy=i not in down,
        )
        for i, load in enumerate(loads)
    ]


def drive(router: object, cands: list[InstanceView], n: int) -> list[str | None]:
    out = []
    for k in range(n):
        d: RouteDecision = router.select(REQ, cands, now=float(k))  # type: ignore[attr-defined]
        out.append(d.instance_id)
        if d.instance_id is not None:
            router.on_routed(REQ, d.instance_id, now=float(k))  # type: ignore[attr-defined]
    return out


def test_usable_returns_same_object_when_nothing_removed() -> None:
    cands = views(1, 2, 3)
    assert usable(cands) is cands
    cands[1] = InstanceView("i1", ready=False)
    assert [v.instance_id for v in usable(cands)] == ["i0", "i2"]


@pytest.mark.parametrize(
    ("down", "expected"),
    [
        ((), ["i0", "i1", "i2", "i0", "i1", "i2"]),
        ((1,), ["i0", "i2", "i2", "i0", "i0", "i2"]),
        ((0, 1, 2), [None] * 6),
    ],
)
def test_round_robin_cycles(down: tuple[int, ...], expected: list[str | None]) -> None:
    assert drive(RoundRobinRouter(), views(0, 0, 0, down=down), 6) == expected


def test_round_robin_skips_unusable_fairly_over_time() -> None:
    counts = Counter(drive(RoundRobinRouter(), views(0, 0, 0, 0, down=(3,)), 300))
    assert set(counts) == {"i0", "i1", "i2"}
    assert max(counts.values()) - min(counts.values()) <= 2


def test_round_robin_cursor_moves_only_on_routed() -> None:
    rr = RoundRobinRouter()
    cands = views(0, 0, 0)
    assert {rr.select(REQ, cands, now=0).instance_id for _ in range(5)} == {"i0"}
    rr.on_routed(REQ, "i0", now=0)
    assert rr.select(REQ, cands, now=0) == RouteDecision("i1", RouteReason.ROUND_ROBIN)


@pytest.mark.parametrize(
    ("loads", "down", "expected"),
    [
        ((5, 3, 9), (), "i1"),
        ((5, 3, 3), (), "i1"),  # tie -> lowest index
        ((5, 0, 9), (1,), "i0"),  # the minimum is unhealthy
        ((0,), (), "i0"),
        ((7, 7, 7), (), "i0"),
    ],
)
def test_least_requests_picks_min(loads: tuple[int, ...], down: tuple[int, ...], expected: str) -> None:
    d = LeastRequestsRouter().select(REQ, views(*loads, down=down), now=0)
    assert d == RouteDecision(expected, RouteReason.LEAST_REQUESTS)


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [((500, 100, 900), "i1"), ((0, 0, 0), "i0"), ((300, 200, 200), "i1")],
)
def test_least_tokens_picks_min(tokens: tuple[int, ...], expected: str) -> None:
    d = LeastTokensRouter().select(REQ, views(0, 0, 0, tokens=tokens), now=0)
    assert d == RouteDecision(expected, RouteReason.LEAST_TOKENS)


def test_least_load_handles_huge_loads() -> None:
    big = 1 << 70
    d = LeastRequestsRouter().select(REQ, views(big + 2, big + 1), now=0)
    assert d.instance_id == "i1"


@pytest.mark.parametrize(
    "router", [RoundRobinRouter(), RandomRouter(random.Random(0)), PowerOfTwoRouter(random.Random(0))]
)
def test_empty_or_all_unusable_is_no_candidates(router: object) -> None:
    for cands in ([], views(1, 2, down=(0, 1))):
        d = router.select(REQ, cands, now=0)  # type: ignore[attr-defined]
        assert d == RouteDecision(None, RouteReason.NO_CANDIDATES)
        assert not d.routed


def test_random_is_roughly_uniform_and_skips_unusable() -> None:
    counts = Counter(drive(RandomRouter(random.Random(3)), views(0, 0, 0, 0, down=(2,)), 6000))
    assert set(counts) == {"i0", "i1", "i3"}
    assert all(1700 < c < 2300 for c in counts.values())


def test_random_same_seed_same_sequence() -> None:
    a = drive(RandomRouter(random.Random(42)), views(*range(16)), 200)
    b = drive(RandomRouter(random.Random(42)), views(*range(16)), 200)
    assert a == b


def test_power_of_two_never_picks_the_more_loaded_of_its_pair() -> None:
    loads = (10, 0, 5, 7, 3)
    cands = views(*loads)
    seed = 11
    router = PowerOfTwoRouter(random.Random(seed))
    shadow = random.Random(seed)  # replays the router's draws
    for _ in range(500):
        n = len(cands)
        i = int(shadow.random() * n)
        j = int(shadow.random() * (n - 1))
        j += j >= i
        d = router.select(REQ, cands, now=0)
        assert d.reason is RouteReason.POWER_OF_TWO
        assert d.instance_id in {f"i{i}", f"i{j}"}
        assert loads[int(d.instance_id[1:])] == min(loads[i], loads[j])


def test_power_of_two_never_picks_the_global_max() -> None:
    cands = views(1, 2, 3, 100)
    router = PowerOfTwoRouter(random.Random(5))
    assert "i3" not in {router.select(REQ, cands, now=0).instance_id for _ in range(500)}


def test_power_of_two_by_tokens() -> None:
    cands = views(0, 0, tokens=(900, 100))
    router = build_router({"name": "power-of-two", "params": {"load": "tokens"}}, random.Random(1))
    assert {router.select(REQ, cands, now=0).instance_id for _ in range(50)} == {"i1"}


def test_power_of_two_small_pools() -> None:
    router = PowerOfTwoRouter(random.Random(0))
    assert router.select(REQ, views(4), now=0).instance_id == "i0"
    assert {router.select(REQ, views(4, 1, 0, down=(1, 2)), now=0).instance_id for _ in range(20)} == {"i0"}
    assert {router.select(REQ, views(4, 1, 0, down=(2,)), now=0).instance_id for _ in range(20)} == {"i1"}


def test_power_of_two_same_seed_same_sequence() -> None:
    cands = views(*[k % 7 for k in range(32)])
    a = drive(PowerOfTwoRouter(random.Random(9)), cands, 300)
    b = drive(PowerOfTwoRouter(random.Random(9)), cands, 300)
    assert a == b
