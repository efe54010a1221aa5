"""The twin's router forgets an instance that left the fleet, as the gateway's does: one lost to a
fault (its KV cache is gone) and one the lifecycle stopped (the autoscaler removed it)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace

from tokenplane.core.routing import build_router
from tokenplane.core.routing.base import Router
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision
from tokenplane.sim.engine import ContinuousEngine, EngineConfig
from tokenplane.sim.faults import ClientSpec, ControlSpec, FaultSpec
from tokenplane.sim.fleet import Fleet, FleetContext
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.lifecycle import SERVING, STOPPED, Lifecycle, Timings
from tokenplane.sim.records import InstanceRecord, TbtHistogram
from tokenplane.sim.resilience import ResilientDispatch
from tokenplane.sim.workloads.base import RequestSpec


class RecordingRouter:
    """A real prefix-affinity router that also records which instances it was told to forget."""

    def __init__(self) -> None:
        self.inner: Router = build_router({"name": "prefix-affinity"}, random.Random(0))
        self.forgotten: list[str] = []

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        return self.inner.select(request, candidates, now=now)

    def on_routed(self, request: RequestInfo, instance_id: str, *, now: float) -> None:
        self.inner.on_routed(request, instance_id, now=now)

    def on_finished(self, request: RequestInfo, instance_id: str, *, now: float) -> None:
        self.inner.on_finished(request, instance_id, now=now)

    def forget(self, instance_id: str) -> None:
        self.forgotten.append(instance_id)
        self.inner.forget(instance_id)


def _engines(loop: EventLoop, fakes: SimpleNamespace, n: int = 2) -> list[ContinuousEngine]:
    tbt = TbtHistogram()
    return [
        ContinuousEngine(
            f"i{k}",
            EngineConfig(),
            fakes.ConstModel(0.01),
            schedule=loop.schedule,
            schedule_late=loop.schedule_late,
            record=InstanceRecord(f"i{k}", "FAKE", "m", 1.0),
            tbt=tbt,
        )
        for k in range(n)
    ]


def test_a_lost_instance_is_forgotten(fakes: SimpleNamespace) -> None:
    loop = EventLoop()
    engines = _engines(loop, fakes)
    router = RecordingRouter()
    hashes = (11, 12, 13)
    specs = [RequestSpec(k, 0.1 * k, 64, 5, block_hashes=hashes) for k in range(6)]
    ctx = FleetContext(loop, engines, router, fakes.ListWorkload(specs), "m", 16, TbtHistogram())
    path = ResilientDispatch(
        clients=ClientSpec(),
        controls=ControlSpec(),
        faults=[FaultSpec(kind="lose", instance=0, at_s=0.25, replace_after_s=0.01)],
    )
    fleet = Fleet(ctx, path)
    records = fleet.run().records
    assert router.forgotten == ["i0"]
    by_id = {r.request_id: r for r in records}
    assert {by_id[k].instance_id for k in (0, 1, 2)} == {"i0"}  # the shared prefix stuck to i0


def test_a_stopped_instance_is_forgotten(fakes: SimpleNamespace) -> None:
    loop = EventLoop()
    engines = _engines(loop, fakes)
    forgotten: list[str] = []
    lc = Lifecycle(
        loop, engines, [Timings(1.0, 0.0)] * 2, [SERVING, SERVING], land_to_warm=True,
        on_stopped=forgotten.append,
    )  # fmt: skip
    assert forgotten == []  # starting in a state is not leaving
    lc.drain(0, 1.0, park=False)  # idle: it stops at once
    assert lc.state[0] == STOPPED and forgotten == ["i0"]
