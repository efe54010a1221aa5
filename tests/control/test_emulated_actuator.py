"""The emulated fleet starts and stops real ``python -m tokenplane.emulator`` processes."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tokenplane.control import EmulatedFleetActuator, InstanceState
from tokenplane.control.emulated import port_is_free

WARMUP_S = 1.0


async def _health(url: str) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
        http.get(url + "/health") as r,
    ):
        return r.status


async def _wait_health(url: str, limit_s: float = 20.0) -> float:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if await _health(url) == 200:
                return time.monotonic()
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(url)


def test_starts_two_instances_ready_after_health_and_warmup(tmp_path: object) -> None:
    act = EmulatedFleetActuator(
        ["--served-model-name", "emu-8b", "--speed", "20"],
        port_range=(20400, 20499),
        warmup_s=WARMUP_S,
        log_dir=str(tmp_path),
    )

    async def body() -> None:
        try:
            handles = await act.start(2)
            assert [h.state for h in handles] == [InstanceState.STARTING] * 2
            urls = [h.url for h in handles]
            assert len(set(urls)) == 2 and all(u and u.startswith("http://127.0.0.1:") for u in urls)
            healthy_at = await _wait_health(urls[0] or "")
            # Health answers, but the warm-up (weight loading) has not passed: still starting.
            listed = {h.instance_id: h for h in await act.list()}
            assert listed[handles[0].instance_id].state is InstanceState.STARTING
            await act.wait_ready([h.instance_id for h in handles], timeout_s=30)
            ready = {h.instance_id: h for h in await act.list()}
            assert all(h.state is InstanceState.READY for h in ready.values())
            assert time.monotonic() - healthy_at >= WARMUP_S - 0.2
            for h in ready.values():
                assert h.ready_at is not None and h.started_at is not None
                assert h.ready_at - h.started_at >= WARMUP_S
                assert await _health(h.url or "") == 200
            pids = [act._instances[h.instance_id].proc for h in handles]
            await act.stop([handles[0].instance_id])
            assert pids[0].returncode is not None
            assert [h.instance_id for h in await act.list()] == [handles[1].instance_id]
            port0 = int((urls[0] or "").rsplit(":", 1)[1])
            assert port_is_free("127.0.0.1", port0)
        finally:
            await act.close()
        assert await act.list() == []
        assert all(p.returncode is not None for p in pids)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_process_that_dies_disappears_from_the_list() -> None:
    act = EmulatedFleetActuator(["--speed", "20"], port_range=(20500, 20599), warmup_s=0.0)

    async def body() -> None:
        try:
            (h,) = await act.start(1)
            await act.wait_ready([h.instance_id], timeout_s=30)
            proc = act._instances[h.instance_id].proc
            proc.kill()
            await proc.wait()
            assert await act.list() == []
        finally:
            await act.close()

    asyncio.run(asyncio.wait_for(body(), 60))


def test_control_loop_drives_the_emulated_fleet() -> None:
    """Real processes: a step in demand starts instances, activates them after warm-up, and on the
    way down they drain and their processes stop."""
    from tokenplane.control import ControlLoop, InMemoryPoolRegistry, SignalSample
    from tokenplane.core.autoscale import PoolSpec, TokenplaneParams, TokenplaneScaler

    reg = InMemoryPoolRegistry("emu-8b")
    rate = [5.0]
    history: list[tuple[float, float]] = []

    class Demand:
        async def sample(self, now: float) -> SignalSample:
            history.append((now - 0.25, rate[0]))
            return SignalSample(instances=reg.views(), arrivals=tuple(history[-20:]))

    act = EmulatedFleetActuator(["--served-model-name", "emu-8b", "--speed", "20"], (20600, 20699), 0.5)
    spec = PoolSpec(
        max_instances=3, min_instances=1, capacity_rps=10.0, cold_start_s=1.0, warm_activation_s=0.1
    )
    params = TokenplaneParams(
        decision_interval_s=0.25,
        cooldown_s=0.5,
        stabilisation_s=0.5,
        burst_k=0.0,
        scale_down_step_fraction=1.0,
    )
    loop = ControlLoop(
        TokenplaneScaler(params), spec, act, Demand(), registry=reg, interval_s=0.25, pool="emu"
    )

    async def until(cond: object, limit_s: float = 30.0) -> None:
        deadline = time.monotonic() + limit_s
        while not cond():  # type: ignore[operator]
            assert time.monotonic() < deadline, loop.events[-1] if loop.events else "no events"
            await loop.step()
            await asyncio.sleep(0.25)

    async def body() -> None:
        try:
            await until(lambda: len(reg.routable()) == 1)
            rate[0] = 25.0
            await until(lambda: len(reg.routable()) == 3)
            for iid, url in reg.urls.items():
                assert await _health(url) == 200, iid
            procs = {i.id: i.proc for i in act._instances.values()}
            rate[0] = 1.0
            await until(lambda: len(reg.routable()) == 1 and len(act._instances) == 1)
            gone = [p for i, p in procs.items() if i not in reg.urls]
            assert len(gone) == 2 and all(p.returncode is not None for p in gone)
        finally:
            await act.close()
        done = [e.done for e in loop.events if e.done]
        kinds = [k for d in done for k in d]
        assert kinds.index("start_cold") < kinds.index("activate_warm") < kinds.index("drain")

    asyncio.run(asyncio.wait_for(body(), 90))
