"""Circuit breakers: trips, cooldown with backoff, probes, latency outliers, and legal transitions."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tokenplane.core.breaker import (
    LEGAL_TRANSITIONS,
    BreakerBoard,
    BreakerConfig,
    BreakerEvent,
    BreakerFilter,
    BreakerReason,
    BreakerState,
    filter_allowed,
)
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.views import InstanceView, RequestInfo

CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def fail_n(board: BreakerBoard, iid: str, n: int, now: float) -> list[BreakerEvent]:
    events: list[BreakerEvent] = []
    for _ in range(n):
        events += board.on_result(iid, False, None, now=now)
    return events


def test_consecutive_failures_open() -> None:
    board = BreakerBoard(BreakerConfig(consecutive_failures=3))
    assert fail_n(board, "a", 2, 0.0) == []
    board.on_result("a", True, 0.1, now=0.0)  # success resets the run
    events = fail_n(board, "a", 3, 1.0)
    assert [(e.to_state, e.reason) for e in events] == [(OPEN, BreakerReason.CONSECUTIVE_FAILURES)]
    assert not board.allow("a", now=1.0) and board.state("a", now=1.0) is OPEN


def test_error_rate_opens_over_window() -> None:
    board = BreakerBoard(BreakerConfig(consecutive_failures=100, min_requests=10, error_rate=0.5))
    events = []
    for i in range(10):
        events += board.on_result("a", i % 2 == 0, 0.1, now=float(i))
    assert [e.reason for e in events] == [BreakerReason.ERROR_RATE]


def test_old_failures_leave_the_window() -> None:
    board = BreakerBoard(BreakerConfig(consecutive_failures=100, min_requests=4, error_rate=0.5, window_s=10))
    fail_n(board, "a", 1, 0.0)
    fail_n(board, "a", 1, 1.0)
    for t in (20.0, 21.0, 22.0):
        assert board.on_result("a", True, 0.1, now=t) == ()
    assert board.on_result("a", False, None, now=23.0) == ()  # 1 of 4 in the window


def test_cooldown_half_open_probe_close() -> None:
    board = BreakerBoard(BreakerConfig(consecutive_failures=1, cooldown_s=5, half_open_probes=1))
    fail_n(board, "a", 1, 0.0)
    assert not board.allow("a", now=4.9)
    assert board.allow("a", now=5.0) and board.state("a", now=5.0) is HALF
    events = board.on_attempt("a", now=6.0)
    assert [(e.to_state, e.reason, e.at_s) for e in events] == [(HALF, BreakerReason.COOLDOWN_ELAPSED, 5.0)]
    assert not board.allow("a", now=6.0)  # the one probe slot is taken
    events = board.on_result("a", True, 0.1, now=6.5)
    assert [(e.to_state, e.reason) for e in events] == [(CLOSED, BreakerReason.PROBE_SUCCEEDED)]
    assert board.allow("a", now=6.5)


def test_failed_probe_reopens_with_backoff() -> None:
    board = BreakerBoard(BreakerConfig(consecutive_failures=1, cooldown_s=5, cooldown_multiplier=2))
    fail_n(board, "a", 1, 0.0)
    board.on_attempt("a", now=5.0)
    events = board.on_result("a", False, None, now=5.5)
    assert [(e.from_state, e.to_state, e.reason) for e in events] == [
        (HALF, OPEN, BreakerReason.PROBE_FAILED)
    ]
    assert not board.allow("a", now=14.0) and board.allow("a", now=15.5)  # 10 s cooldown now
    assert [e.to_state for e in board.tick(15.5)] == [HALF]


def pool(board: BreakerBoard, latencies: dict[str, float], n: int, t0: float = 0.0) -> list[BreakerEvent]:
    events: list[BreakerEvent] = []
    for i in range(n):
        for iid, lat in latencies.items():
            events += board.on_result(iid, True, lat, now=t0 + i * 0.1)
    return events


def test_latency_outlier_opens_slow_instance_only() -> None:
    board = BreakerBoard(BreakerConfig(latency_min_samples=5, latency_k=3.0))
    events = pool(board, {"a": 0.2, "b": 0.25, "c": 0.22, "slow": 1.5}, 6)
    assert [(e.instance_id, e.reason) for e in events] == [("slow", BreakerReason.LATENCY_OUTLIER)]


def test_whole_pool_slow_is_not_an_outlier() -> None:
    board = BreakerBoard(BreakerConfig(latency_min_samples=5))
    assert pool(board, {"a": 2.0, "b": 2.1, "c": 2.2}, 10) == []


def test_latency_ejection_is_capped() -> None:
    cfg = BreakerConfig(latency_min_samples=3, max_latency_ejection_fraction=0.25)
    board2 = BreakerBoard(cfg)
    events = pool(
        board2, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1, "e": 0.1, "f": 0.1, "s1": 1.0, "s2": 1.0}, 4
    )
    assert len([e for e in events if e.reason is BreakerReason.LATENCY_OUTLIER]) == 2  # 0.25 × 8
    board3 = BreakerBoard(cfg)
    events = pool(board3, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1, "s1": 1.0, "s2": 1.0, "s3": 1.0}, 4)
    assert len([e for e in events if e.reason is BreakerReason.LATENCY_OUTLIER]) == 1  # floor(0.25 × 7)


def test_slow_probe_keeps_it_open() -> None:
    board = BreakerBoard(BreakerConfig(latency_min_samples=3, cooldown_s=1.0))
    pool(board, {"a": 0.1, "b": 0.1, "c": 0.1, "slow": 1.0}, 4)
    assert board.state("slow", now=0.5) is OPEN
    pool(board, {"a": 0.1, "b": 0.1, "c": 0.1}, 3, t0=1.0)
    board.on_attempt("slow", now=2.0)
    events = board.on_result("slow", True, 1.0, now=2.1)
    assert [e.reason for e in events] == [BreakerReason.PROBE_SLOW]


def _pool_then_slow_result(refresh: float, at: float) -> list[BreakerEvent]:
    """a, b, c and d answer in 0.1 s twice (to t=0.1); at t=0.2 a, b and c take 1.0 s (their means:
    0.4 s); then d takes 3.0 s at ``at`` (its mean: 1.07 s, over 5 × 0.1 but not 5 × 0.4)."""
    cfg = BreakerConfig(latency_min_samples=2, latency_k=5.0, window_s=10, median_refresh_s=refresh)
    board = BreakerBoard(cfg)
    events = pool(board, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1}, 2)
    events += pool(board, {"a": 1.0, "b": 1.0, "c": 1.0}, 1, t0=0.2)
    return events + list(board.on_result("d", True, 3.0, now=at))


def test_pool_median_is_at_most_median_refresh_s_old() -> None:
    # Fresh, the median is 0.4 s: d is no outlier.
    assert _pool_then_slow_result(0.0, at=0.2) == []
    # Within the refresh, d is judged against the median computed at t=0.1 (0.1 s): an outlier.
    tripped = _pool_then_slow_result(1.0, at=0.2)
    assert [(e.instance_id, e.reason) for e in tripped] == [("d", BreakerReason.LATENCY_OUTLIER)]
    # Once the refresh has passed, the median is recomputed first.
    assert _pool_then_slow_result(1.0, at=1.2) == []


def test_pool_median_is_recomputed_when_an_instance_joins() -> None:
    # The median cached while only a and b counted (None: too few) must not hide c's arrival.
    board = BreakerBoard(BreakerConfig(latency_min_samples=3, median_refresh_s=30.0))
    events = pool(board, {"a": 0.1, "b": 0.1, "c": 0.1, "slow": 1.0}, 3)
    assert [(e.instance_id, e.reason) for e in events] == [("slow", BreakerReason.LATENCY_OUTLIER)]


def test_filter_drops_open_and_full_half_open() -> None:
    board = BreakerBoard(BreakerConfig(consecutive_failures=1, cooldown_s=5))
    views = [InstanceView("a"), InstanceView("b"), InstanceView("c")]
    assert filter_allowed(views, board, now=0.0) is views
    fail_n(board, "b", 1, 0.0)
    fail_n(board, "c", 1, 0.0)
    board.on_attempt("c", now=5.0)
    kept = BreakerFilter(board).filter(RequestInfo("r", "m", 1, 1), views, now=5.0)
    assert [v.instance_id for v in kept] == ["a", "b"]  # b half-open with a free slot; c's slot taken


def test_config_validation() -> None:
    with pytest.raises(InvalidPolicyConfig):
        BreakerConfig(error_rate=0).validate()
    with pytest.raises(InvalidPolicyConfig):
        BreakerConfig.from_params({"cooldown_s": 10, "max_cooldown_s": 5})
    with pytest.raises(InvalidPolicyConfig):
        BreakerConfig.from_params({"cooldwn_s": 1})
    assert BreakerConfig.from_params({"half_open_probes": 2}).half_open_probes == 2
    for refresh in (-0.1, 31.0):  # within [0, window_s]
        with pytest.raises(InvalidPolicyConfig, match="median_refresh_s"):
            BreakerConfig.from_params({"median_refresh_s": refresh})
    assert BreakerConfig.from_params({"median_refresh_s": 0}).median_refresh_s == 0


class BreakerMachine(RuleBasedStateMachine):
    """Random attempts, results and time steps; every reported transition must be legal and chained."""

    def __init__(self) -> None:
        super().__init__()
        cfg = BreakerConfig(
            consecutive_failures=2, min_requests=3, window_s=5, latency_min_samples=2, cooldown_s=1,
            max_cooldown_s=4, half_open_probes=2,
        )  # fmt: skip
        self.board = BreakerBoard(cfg)
        self.now = 0.0
        self.last: dict[str, BreakerState] = {}

    def _check(self, events: tuple[BreakerEvent, ...]) -> None:
        for e in events:
            assert (e.from_state, e.to_state) in LEGAL_TRANSITIONS
            assert self.last.get(e.instance_id, CLOSED) is e.from_state
            assert e.at_s <= self.now
            self.last[e.instance_id] = e.to_state

    @rule(iid=st.sampled_from("abcd"))
    def attempt(self, iid: str) -> None:
        self._check(self.board.on_attempt(iid, now=self.now))

    @rule(iid=st.sampled_from("abcd"), ok=st.booleans(), lat=st.one_of(st.none(), st.floats(0.01, 5.0)))
    def result(self, iid: str, ok: bool, lat: float | None) -> None:
        self._check(self.board.on_result(iid, ok, lat, now=self.now))

    @rule(dt=st.floats(0.0, 3.0))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def tick(self) -> None:
        self._check(self.board.tick(self.now))

    @rule(iid=st.sampled_from("abcd"))
    def forget(self, iid: str) -> None:
        self.board.forget(iid)
        self.last.pop(iid, None)

    @invariant()
    def reads_agree(self) -> None:
        for iid in "abcd":
            state = self.board.state(iid, now=self.now)
            allowed = self.board.allow(iid, now=self.now)
            if state is OPEN:
                assert not allowed
            if state is CLOSED:
                assert allowed
            recorded = self.last.get(iid, CLOSED)
            assert state is recorded or (recorded is OPEN and state is HALF)

    @invariant()
    def all_closed_means_every_instance_allowed(self) -> None:
        closed = all(s is CLOSED for s in self.last.values())
        assert self.board.all_closed is closed
        if closed:
            assert all(self.board.allow(iid, now=self.now + dt) for iid in "abcd" for dt in (0.0, 100.0))


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_release_frees_a_probe_slot_without_a_verdict() -> None:
    board = BreakerBoard(BreakerConfig(consecutive_failures=1, cooldown_s=1.0, half_open_probes=1))
    board.on_result("i", False, None, now=0.0)
    assert board.state("i", now=0.5) is BreakerState.OPEN
    board.on_attempt("i", now=1.5)  # half-open: the probe slot is taken
    assert not board.allow("i", now=1.6)
    board.release("i")  # its client left: neither success nor failure
    assert board.state("i", now=1.7) is BreakerState.HALF_OPEN
    assert board.allow("i", now=1.7)
    for _ in range(10):  # releases never open a breaker
        board.release("j")
    assert board.allow("j", now=2.0)
