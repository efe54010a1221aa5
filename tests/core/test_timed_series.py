"""The array-backed (time, value) window agrees with the deque of pairs it replaced."""

from __future__ import annotations

import gc
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core import timed_series
from tokenplane.core.timed_series import TimedSeries

steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.floats(0.0, 3.0), st.floats(-5.0, 5.0)),
        st.tuples(st.just("expire"), st.floats(0.0, 10.0), st.just(0.0)),
        st.tuples(st.just("clear"), st.just(0.0), st.just(0.0)),
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(1, 8))
def test_matches_a_deque_of_pairs(ops: list[tuple[str, float, float]], compact_min: int) -> None:
    timed_series._COMPACT_MIN = compact_min  # small, so the front is cut off often
    try:
        series, model = TimedSeries(), deque[tuple[float, float]]()
        now = 0.0
        for op, x, v in ops:
            if op == "add":
                now += x
                series.append(now, v)
                model.append((now, v))
            elif op == "expire":
                horizon = now - x
                want = []
                while model and model[0][0] <= horizon:
                    want.append(model.popleft()[1])
                assert list(series.expire(horizon)) == want
            else:
                series.clear()
                model.clear()
            assert len(series) == len(model)
    finally:
        timed_series._COMPACT_MIN = 1024


def test_a_full_window_is_nothing_for_the_collector_to_walk() -> None:
    s = TimedSeries()
    for i in range(10_000):
        s.append(float(i), 1.0)
    # what a collection visits from each array: nothing per element (a deque of tuples: all 10,000)
    assert len(gc.get_referents(s._times)) <= 1 and len(gc.get_referents(s._values)) <= 1
    assert len(s.expire(4_999.0)) == 5_000 and len(s) == 5_000
