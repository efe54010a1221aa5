from __future__ import annotations

from typing import Any

from tokenplane.sim.kernel import EventLoop


def test_events_run_in_time_order_and_ties_in_insertion_order() -> None:
    loop = EventLoop()
    seen: list[tuple[float, Any]] = []

    def cb(t: float, arg: Any) -> None:
        seen.append((t, arg))

    for at, arg in [(2.0, "c"), (1.0, "a"), (2.0, "d"), (1.0, "b"), (0.5, "z"), (2.0, "e")]:
        loop.schedule(at, cb, arg)
    assert len(loop) == 6 and loop.peek_time() == 0.5
    loop.run()
    assert seen == [(0.5, "z"), (1.0, "a"), (1.0, "b"), (2.0, "c"), (2.0, "d"), (2.0, "e")]
    assert loop.now == 2.0 and len(loop) == 0 and loop.peek_time() is None


def test_events_scheduled_from_callbacks_at_the_same_time_run_after_earlier_ones() -> None:
    loop = EventLoop()
    seen: list[str] = []

    def first(t: float, _: Any) -> None:
        seen.append("first")
        loop.schedule(t, lambda t2, a: seen.append(a), "child")

    loop.schedule(1.0, first)
    loop.schedule(1.0, lambda t, a: seen.append(a), "sibling")
    loop.run()
    assert seen == ["first", "sibling", "child"]


def test_scheduling_in_the_past_is_clamped_to_now() -> None:
    loop = EventLoop()
    times: list[float] = []

    def cb(t: float, _: Any) -> None:
        times.append(t)
        if len(times) == 1:
            loop.schedule(t - 5.0, cb)

    loop.schedule(3.0, cb)
    loop.run()
    assert times == [3.0, 3.0]


def test_until_stops_before_later_events_and_run_resumes() -> None:
    loop = EventLoop()
    seen: list[float] = []
    for at in (1.0, 2.0, 3.0, 4.0):
        loop.schedule(at, lambda t, _: seen.append(t))
    loop.run(until=2.0)  # events at exactly `until` still run
    assert seen == [1.0, 2.0]
    assert loop.now == 2.0 and len(loop) == 2
    loop.run(until=2.5)
    assert seen == [1.0, 2.0] and loop.now == 2.5
    loop.run()
    assert seen == [1.0, 2.0, 3.0, 4.0] and loop.now == 4.0


def test_until_past_the_last_event_leaves_now_at_the_last_event() -> None:
    loop = EventLoop()
    loop.schedule(1.0, lambda t, _: None)
    loop.run(until=10.0)
    assert loop.now == 1.0


def test_on_progress_is_called_every_16384_events() -> None:
    loop = EventLoop()
    for i in range(2 * 16384 + 5):
        loop.schedule(float(i), lambda t, _: None)
    calls: list[float] = []
    loop.run(on_progress=calls.append)
    assert calls == [16383.0, 32767.0]
