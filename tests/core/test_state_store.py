"""The in-process shared-state stores: exact sliding-window sums and plain gauges."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.state_store import LocalGaugeStore, SlidingWindowCounterStore


@pytest.mark.parametrize(
    ("adds", "read_at", "expected"),
    [
        ([(0.0, 1.0)], 0.0, 1.0),
        ([(0.0, 1.0)], 9.999, 1.0),
        ([(0.0, 1.0)], 10.0, 0.0),  # an entry counts for t <= now < t + window
        ([(0.0, 1.0), (5.0, 2.0)], 12.0, 2.0),
        ([(0.0, 3.0), (1.0, -1.0)], 2.0, 2.0),
    ],
)
def test_window_sums(adds: list[tuple[float, float]], read_at: float, expected: float) -> None:
    store = SlidingWindowCounterStore(10.0)
    for t, delta in adds:
        store.add("k", delta, now=t)
    assert store.get("k", now=read_at) == pytest.approx(expected)


def test_keys_are_independent_and_unknown_reads_zero() -> None:
    store = SlidingWindowCounterStore(1.0)
    assert store.add("a", 2.0, now=0.0) == 2.0
    assert store.get("b", now=0.0) == 0.0


def test_time_going_backwards_cannot_resurrect_entries() -> None:
    store = SlidingWindowCounterStore(10.0)
    store.add("k", 1.0, now=0.0)
    assert store.get("k", now=20.0) == 0.0
    assert store.get("k", now=5.0) == 0.0


def test_prune_drops_empty_keys() -> None:
    store = SlidingWindowCounterStore(1.0)
    store.add("a", 1.0, now=0.0)
    store.add("b", 1.0, now=5.0)
    assert store.prune(now=5.5) == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_bad_window_rejected(bad: float) -> None:
    with pytest.raises(InvalidPolicyConfig):
        SlidingWindowCounterStore(bad)


@given(
    st.lists(
        st.tuples(st.floats(0, 5, allow_nan=False), st.integers(-3, 5)),
        max_size=40,
    ),
    st.floats(0.1, 3.0),
)
def test_matches_brute_force(steps: list[tuple[float, int]], window: float) -> None:
    store = SlidingWindowCounterStore(window)
    now = 0.0
    log: list[tuple[float, int]] = []
    for dt, delta in steps:
        now += dt
        store.add("k", delta, now=now)
        log.append((now, delta))
        expected = sum(d for t, d in log if now - window < t <= now)
        assert store.get("k", now=now) == pytest.approx(expected, abs=1e-9)


def test_gauges() -> None:
    gauges = LocalGaugeStore()
    assert gauges.add("t", 1) == 1
    assert gauges.add("t", 2) == 3
    assert gauges.add("t", -3) == 0
    assert gauges.get("t") == 0
