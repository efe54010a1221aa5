"""The real-time driver: virtual time follows the loop clock at ``speed``, without drift."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tokenplane.emulator.realtime import RealtimeClock


def test_events_fire_at_their_virtual_time_and_do_not_drift() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock = RealtimeClock(speed=10.0)
        fired: list[tuple[float, float]] = []
        done = loop.create_future()

        def step(at: float, k: Any) -> None:
            fired.append((at, (loop.time() - clock.t0) * clock.speed))
            if k < 100:
                clock.schedule(at + 0.01, step, k + 1)  # 100 steps of 10 ms virtual = 0.1 s wall
            else:
                done.set_result(None)

        clock.schedule(0.0, step, 0)
        await done
        ideal = [round(0.01 * i, 9) for i in range(101)]
        assert [round(a, 9) for a, _ in fired] == ideal  # engine sees its ideal times
        last_at, last_real = fired[-1]
        assert last_real == pytest.approx(last_at, abs=0.3)  # 1.0 s virtual, within 30 ms wall
        assert all(real >= at - 0.02 for at, real in fired)  # never (much) early

    asyncio.run(main())


def test_now_is_monotonic_and_scaled() -> None:
    async def main() -> None:
        clock = RealtimeClock(speed=4.0)
        a = clock.now()
        await asyncio.sleep(0.05)
        b = clock.now()
        assert 0.15 < b - a < 0.6
        seen: list[float] = []
        clock.schedule(b + 10.0, lambda at, _: seen.append(at))  # far future: not yet
        await asyncio.sleep(0)
        assert not seen and clock.now() >= b

    asyncio.run(main())


def test_speed_must_be_positive() -> None:
    async def main() -> None:
        with pytest.raises(ValueError):
            RealtimeClock(speed=0)

    asyncio.run(main())
