"""The control loop over a fake signal source and the in-memory pool registry: a demand step makes it
start instances, activate them once warm, and drain them (no request cut) on the way down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from tokenplane.control import (
    ControlLoop,
    InMemoryPoolRegistry,
    InstanceHandle,
    InstanceState,
    LoopEvent,
    LoopMetrics,
    SignalSample,
)
from tokenplane.core.autoscale import (
    ActionKind,
    PoolSignal,
    PoolSpec,
    ScaleAction,
    ScaleDecision,
    ScaleReason,
    TokenplaneParams,
    TokenplaneScaler,
)

WARMUP_S = 3.0
CAPACITY_RPS = 10.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeActuator:
    """Instances with URLs that turn ready ``warmup_s`` after they were started."""

    name = "fake"
    tracks_instances = True

    def __init__(self, clock: Clock, warmup_s: float) -> None:
        self.clock = clock
        self.warmup_s = warmup_s
        self.started: dict[str, float] = {}
        self.stopped: list[tuple[float, str]] = []
        self._n = 0

    async def start(self, n: int) -> list[InstanceHandle]:
        out = []
        for _ in range(n):
            self._n += 1
            iid = f"i{self._n}"
            self.started[iid] = self.clock()
            out.append(InstanceHandle(iid, InstanceState.STARTING, f"http://fake/{iid}", self.clock()))
        return out

    async def stop(self, ids: Sequence[str]) -> None:
        for i in ids:
            self.started.pop(i)
            self.stopped.append((self.clock(), i))

    async def list(self) -> list[InstanceHandle]:
        now = self.clock()
        return [
            InstanceHandle(
                i,
                InstanceState.READY if now - t >= self.warmup_s else InstanceState.STARTING,
                f"http://fake/{i}",
                t,
            )
            for i, t in self.started.items()
        ]

    async def close(self) -> None:
        self.started.clear()


class Registry(InMemoryPoolRegistry):
    """Refuses to remove an instance that still has requests in flight (that would cut them)."""

    async def remove(self, instance_id: str) -> None:
        assert self.in_flight.get(instance_id, 0) == 0, f"{instance_id} removed with requests in flight"
        await super().remove(instance_id)


class Demand:
    """A scripted arrival rate; instances drain their in-flight work one request per tick."""

    def __init__(self, registry: Registry, rate: float) -> None:
        self.registry = registry
        self.rate = rate
        self.history: list[tuple[float, float]] = []

    async def sample(self, now: float) -> SignalSample:
        self.history.append((now - 1.0, self.rate))
        routable = self.registry.routable()
        for iid in self.registry.urls:
            if iid in self.registry.draining:
                self.registry.in_flight[iid] = max(0, self.registry.in_flight.get(iid, 0) - 1)
            else:
                self.registry.in_flight[iid] = 2
        served = min(self.rate, CAPACITY_RPS * len(routable))
        return SignalSample(
            instances=self.registry.views(),
            arrivals=tuple(self.history[-30:]),
            throughput_rps=served if routable else None,
        )


def _loop(
    clock: Clock, **kw: object
) -> tuple[ControlLoop, FakeActuator, Registry, Demand, CollectorRegistry]:
    spec = PoolSpec(
        max_instances=6,
        min_instances=1,
        capacity_rps=CAPACITY_RPS,
        cold_start_s=WARMUP_S,
        warm_activation_s=0.5,
    )
    params = TokenplaneParams(
        decision_interval_s=1.0, cooldown_s=5.0, stabilisation_s=5.0, burst_k=0.0, learn_capacity=False
    )
    act = FakeActuator(clock, WARMUP_S)
    reg = Registry("m")
    demand = Demand(reg, 5.0)
    prom = CollectorRegistry()
    loop = ControlLoop(
        TokenplaneScaler(params),
        spec,
        act,
        demand,
        registry=reg,
        interval_s=1.0,
        clock=clock,
        pool="m",
        metrics=LoopMetrics(prom, "m"),
        **kw,  # type: ignore[arg-type]
    )
    return loop, act, reg, demand, prom


async def _run(loop: ControlLoop, clock: Clock, ticks: int) -> list[LoopEvent]:
    out = []
    for _ in range(ticks):
        clock.t += 1.0
        out.append(await loop.step())
    return out


def _done(events: list[LoopEvent], kind: str) -> list[str]:
    return [i for e in events for i in e.done.get(kind, ())]


def test_demand_step_starts_activates_then_drains(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    loop, act, reg, demand, prom = _loop(clock)

    async def body() -> None:
        with caplog.at_level(logging.INFO, logger="tokenplane.control"):
            # Bootstrap at 5 req/s: one instance, cold-started, then activated once warm.
            boot = await _run(loop, clock, 8)
            assert _done(boot, "start_cold") == ["i1"]
            assert _done(boot, "activate_warm") == ["i1"]
            first_activation = next(e for e in boot if e.done.get("activate_warm"))
            assert first_activation.t - act.started["i1"] >= WARMUP_S
            assert reg.routable() == ["i1"]

            # A step to 40 req/s: more cold starts, each activated only after its warm-up.
            demand.rate = 40.0
            up = await _run(loop, clock, 12)
            started = _done(up, "start_cold")
            activated = _done(up, "activate_warm")
            assert len(started) >= 3 and sorted(activated) == sorted(started)
            rising = {e.reason for e in up if e.done.get("start_cold")}
            assert rising <= {"forecast_rise", "queue_growing", "at_max"}
            for e in up:
                for iid in e.done.get("activate_warm", ()):
                    assert e.t - act.started[iid] >= WARMUP_S
            peak = len(reg.routable())
            assert peak >= 5

            # Back to 5 req/s: drains (after the cooldown), removed only when empty, then stopped.
            demand.rate = 5.0
            down = await _run(loop, clock, 40)
            drained = _done(down, "drain") + _done(down, "drain_to_warm")
            assert drained
            assert {e.reason for e in down if e.done.get("drain")} <= {"overprovisioned", "at_min"}
            assert len(reg.routable()) < peak
            stopped = {i for _, i in act.stopped}
            assert set(_done(down, "drain")) <= stopped
            for iid in _done(down, "drain"):
                ops = [op for op, i in reg.ops if i == iid]
                assert ops[-2:] == ["drain", "remove"]

    asyncio.run(body())
    lines = [r.getMessage() for r in caplog.records if "autoscaler decision" in r.getMessage()]
    assert any("reason=forecast_rise" in m or "reason=queue_growing" in m for m in lines)
    assert any("reason=overprovisioned" in m for m in lines)
    assert all("target_serving=" in m and "note=" in m for m in lines)
    assert prom.get_sample_value(
        "tokenplane_autoscaler_decisions_total", {"pool": "m", "reason": "overprovisioned"}
    )
    assert prom.get_sample_value("tokenplane_autoscaler_actions_total", {"pool": "m", "action": "start_cold"})
    assert (
        prom.get_sample_value("tokenplane_autoscaler_target_serving_instances", {"pool": "m"})
        == loop.events[-1].target_serving
    )


def test_a_draining_instance_keeps_its_requests_until_empty() -> None:
    clock = Clock()
    loop, act, reg, demand, _ = _loop(clock, max_drain_s=100.0)

    async def body() -> None:
        demand.rate = 40.0
        await _run(loop, clock, 15)
        demand.rate = 5.0
        for _ in range(40):
            clock.t += 1.0
            event = await loop.step()
            for iid in event.done.get("drain", ()):
                # Drained this tick: still registered (in flight), not stopped yet.
                assert iid in reg.urls and iid in reg.draining
                assert iid in act.started
                assert loop.phases()[iid] == "draining"

    asyncio.run(body())
    assert act.stopped


def test_dry_run_decides_but_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    loop, act, reg, _demand, _ = _loop(clock, dry_run=True)

    async def body() -> None:
        with caplog.at_level(logging.INFO, logger="tokenplane.control"):
            events = await _run(loop, clock, 3)
        assert all(e.dry_run for e in events)
        assert events[0].reason in ("at_min", "forecast_rise")
        assert events[0].done.get("start_cold") == ("(new 1)",)

    asyncio.run(body())
    assert act.started == {} and reg.ops == []
    assert loop.scaler.state.recommendations == ()  # type: ignore[attr-defined]
    msgs = [r.getMessage() for r in caplog.records]
    assert any("dry_run" in m and "op=start" in m for m in msgs)
    assert any("autoscaler decision" in m and "dry_run=true" in m for m in msgs)


def test_adopted_static_instances_count_and_are_released_on_drain() -> None:
    clock = Clock()
    loop, act, reg, demand, _ = _loop(clock)

    async def body() -> None:
        await reg.add("http://static-a", "static-a")
        await reg.add("http://static-b", "static-b")
        demand.rate = 1.0
        events = await _run(loop, clock, 30)
        assert events[0].current_serving == 2
        assert "static-a" in _done(events, "drain") or "static-b" in _done(events, "drain")
        assert len(reg.routable()) == 1

    asyncio.run(body())
    assert act.stopped == []  # not the actuator's to stop


def test_actuator_failure_is_logged_and_the_loop_goes_on() -> None:
    clock = Clock()
    loop, act, _reg, _demand, prom = _loop(clock)

    async def broken(n: int) -> list[InstanceHandle]:
        raise RuntimeError("quota exceeded")

    act.start = broken  # type: ignore[method-assign]

    async def body() -> None:
        events = await _run(loop, clock, 2)
        assert all(e.errors and "quota exceeded" in e.errors[0] for e in events)

    asyncio.run(body())
    assert prom.get_sample_value("tokenplane_autoscaler_errors_total", {"pool": "m", "op": "start"}) == 2


def test_the_signal_carries_every_measure_of_the_sample() -> None:
    """SignalSample and PoolSignal share PoolMeasures' fields; the loop copies all of them."""
    from tokenplane.core.autoscale.signals import PoolMeasures, PoolSignal

    assert set(PoolMeasures.__struct_fields__) <= set(SignalSample.__struct_fields__)
    assert set(PoolMeasures.__struct_fields__) <= set(PoolSignal.__struct_fields__)
    sample = SignalSample(
        queued=3,
        arrivals=((0.0, 1.5), (10.0, 2.5)),
        tokens_per_s_demand=1.0,
        prompt_tokens_per_s=1.5,
        throughput_rps=2.0,
        throughput_tps=3.0,
        ttft_attainment=0.4,
        tbt_attainment=0.5,
        ttft_p90_s=0.6,
        tbt_p90_s=0.7,
        utilisation=0.8,
    )
    assert all(getattr(sample, f) != getattr(PoolMeasures(), f) for f in PoolMeasures.__struct_fields__)
    loop, *_ = _loop(Clock())
    signal = loop.signal(sample, {}, now=5.0)
    assert signal.now == 5.0
    for field in PoolMeasures.__struct_fields__:
        assert getattr(signal, field) == getattr(sample, field), field


class Scripted:
    """An autoscaler that returns scripted actions, one list per step (the core's protocol)."""

    name = "scripted"

    def __init__(self, script: list[tuple[ScaleAction, ...]]) -> None:
        self.script = script
        self.seen: list[PoolSignal] = []

    @property
    def state(self) -> None:
        return None

    def observe(self, signal: PoolSignal, spec: PoolSpec) -> None:
        self.seen.append(signal)

    def decide(self, signal: PoolSignal, spec: PoolSpec, *, now: float) -> ScaleDecision:
        actions = self.script.pop(0) if self.script else ()
        return ScaleDecision(
            target_serving=len(signal.serving),
            target_warm=0,
            reason=ScaleReason.STEADY,
            actions=actions or (ScaleAction(ActionKind.NOOP),),
        )

    def commit(self, decision: ScaleDecision, *, now: float) -> None:
        pass


def test_cancel_warming_stops_the_newest_starting_instances_as_the_twin_does() -> None:
    """One core, two shells: CANCEL_WARMING stops warming instances, newest first, at once (never
    registered with the gateway, so nothing to drain); the older one lands and is served."""
    clock = Clock()
    act = FakeActuator(clock, warmup_s=10.0)
    reg = Registry("m")
    spec = PoolSpec(max_instances=6, min_instances=0, capacity_rps=CAPACITY_RPS, cold_start_s=10.0)
    scaler = Scripted(
        [
            (ScaleAction(ActionKind.START_COLD, 1),),
            (ScaleAction(ActionKind.START_COLD, 1),),
            (ScaleAction(ActionKind.CANCEL_WARMING, 1),),
        ]
    )
    loop = ControlLoop(
        scaler, spec, act, Demand(reg, 1.0), registry=reg, interval_s=1.0, clock=clock, pool="m"
    )

    async def body() -> list[LoopEvent]:
        return await _run(loop, clock, 3)

    events = asyncio.run(body())
    assert _done(events, "cancel_warming") == ["i2"]
    assert act.stopped == [(3.0, "i2")]  # stopped at the decision: no longer costs
    assert loop.phases() == {"i1": "warming"}
    assert "i2" not in reg.urls and not [op for op in reg.ops if op[1] == "i2"]
    assert scaler.seen[-1].warming == ("i1", "i2")  # both were warming when the cancel was decided
