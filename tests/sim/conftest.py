"""Fakes shared by the simulator tests: step-time models, routers, workloads and a fleet harness.

They are handed out through the session-scoped ``fakes`` fixture (tests/ has no packages, so a
plain module import would depend on sys.path); session scope keeps them usable under hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason
from tokenplane.sim.engine import ContinuousEngine, EngineConfig
from tokenplane.sim.fleet import Fleet, FleetContext, FleetResult
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.workloads.base import RequestSpec


class ConstModel:
    """Every step costs ``dt`` regardless of its contents."""

    decode_kv_s_per_token = 0.0
    prefill_s_per_pair = 0.0

    def __init__(self, dt: float = 0.01) -> None:
        self.dt = dt

    def linear_time(self, num_tokens: int) -> float:
        return self.dt


class LinearModel:
    """``a + per_token * n`` plus KV-read and attention-pair terms."""

    def __init__(
        self, a: float, per_token: float, decode_kv_s_per_token: float = 0.0, prefill_s_per_pair: float = 0.0
    ) -> None:
        self.a = a
        self.per_token = per_token
        self.decode_kv_s_per_token = decode_kv_s_per_token
        self.prefill_s_per_pair = prefill_s_per_pair

    def linear_time(self, num_tokens: int) -> float:
        return self.a + self.per_token * num_tokens


class RoundRobin:
    name = "fake_rr"

    def __init__(self) -> None:
        self.i = 0
        self.routed: list[tuple[str, str]] = []
        self.finished: list[tuple[str, str]] = []
        self.seen_views: list[tuple[InstanceView, ...]] = []

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        self.seen_views.append(tuple(candidates))
        return RouteDecision(candidates[self.i % len(candidates)].instance_id, RouteReason.ROUND_ROBIN)

    def on_routed(self, request: RequestInfo, instance_id: str, *, now: float) -> None:
        self.i += 1
        self.routed.append((request.request_id, instance_id))

    def on_finished(self, request: RequestInfo, instance_id: str, *, now: float) -> None:
        self.finished.append((request.request_id, instance_id))


class NoInstance:
    name = "fake_none"

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        return RouteDecision(None, RouteReason.NO_CANDIDATES)

    def on_routed(self, request: RequestInfo, instance_id: str, *, now: float) -> None:
        raise AssertionError("on_routed must not be called for an unrouted request")

    def on_finished(self, request: RequestInfo, instance_id: str, *, now: float) -> None:
        raise AssertionError("on_finished must not be called for an unrouted request")


@dataclass
class ListWorkload:
    """Open-loop specs from a list, plus optional follow-ups computed by ``follow``."""

    specs: Sequence[RequestSpec]
    follow: Callable[[RequestSpec, float, bool], Sequence[RequestSpec]] | None = None
    name: str = "fake_list"
    finished: list[tuple[int, float, bool]] = field(default_factory=list)

    def arrivals(self) -> Iterator[RequestSpec]:
        return iter(self.specs)

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        self.finished.append((spec.request_id, finish_s, ok))
        return self.follow(spec, finish_s, ok) if self.follow else ()


@dataclass
class Harness:
    loop: EventLoop
    fleet: Fleet
    engines: list[ContinuousEngine]
    tbt: TbtHistogram
    router: object
    workload: ListWorkload

    def run(self, until: float | None = None) -> FleetResult:
        return self.fleet.run(until=until)

    def by_id(self, request_id: int) -> RequestRecord:
        (rec,) = [r for r in self.fleet.records if r.request_id == request_id]
        return rec


def make_fleet(
    specs: Sequence[RequestSpec] | ListWorkload,
    *,
    config: EngineConfig | Sequence[EngineConfig] | None = None,
    model: object | None = None,
    engines: int = 1,
    router: object | None = None,
    sample_interval_s: float = 10.0,
    precise_kv: bool = False,
) -> Harness:
    loop = EventLoop()
    tbt = TbtHistogram()
    workload = specs if isinstance(specs, ListWorkload) else ListWorkload(list(specs))
    configs = list(config) if isinstance(config, Sequence) else [config or EngineConfig()] * engines
    engs = [
        ContinuousEngine(
            f"i{k}",
            cfg,
            model or ConstModel(),  # type: ignore[arg-type]
            schedule=loop.schedule,
            schedule_late=loop.schedule_late,
            record=InstanceRecord(f"i{k}", "FAKE", "m", 1.0),
            tbt=tbt,
        )
        for k, cfg in enumerate(configs)
    ]
    rt = router or RoundRobin()
    fleet = Fleet(
        FleetContext(
            loop=loop,
            engines=engs,
            router=rt,  # type: ignore[arg-type]
            workload=workload,
            model="m",
            block_size=configs[0].block_size,
            tbt=tbt,
            sample_interval_s=sample_interval_s,
            precise_kv=precise_kv,
        )
    )
    return Harness(loop, fleet, engs, tbt, rt, workload)


def assert_kv_clean(engine: ContinuousEngine) -> None:
    kv = engine.kv
    kv.check()
    assert kv.used_private == 0
    assert kv.referenced_cached == 0
    assert kv.free + kv.evictable == kv.total_blocks
    assert kv.usage == 0.0


@pytest.fixture(scope="session")
def fakes() -> SimpleNamespace:
    return SimpleNamespace(
        ConstModel=ConstModel,
        LinearModel=LinearModel,
        RoundRobin=RoundRobin,
        NoInstance=NoInstance,
        ListWorkload=ListWorkload,
        make_fleet=make_fleet,
        assert_kv_clean=assert_kv_clean,
    )
