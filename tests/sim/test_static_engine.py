"""Static (request-level) batching, hand-checked with fake step-time models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from tokenplane.sim.engine import EngineConfig
from tokenplane.sim.fleet import Fleet, FleetContext, FleetResult
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.static_engine import DEFAULT_STATIC_MAX_LEN, StaticEngine
from tokenplane.sim.workloads.base import RequestSpec


@dataclass
class StaticHarness:
    fleet: Fleet
    engine: StaticEngine
    tbt: TbtHistogram

    def run(self) -> FleetResult:
        return self.fleet.run()

    def rec(self, request_id: int) -> RequestRecord:
        (r,) = [r for r in self.fleet.records if r.request_id == request_id]
        return r


def make_static(
    fakes: SimpleNamespace, specs: Sequence[RequestSpec], config: EngineConfig, model: object
) -> StaticHarness:
    loop = EventLoop()
    tbt = TbtHistogram()
    engine = StaticEngine(
        "s0",
        config,
        model,  # type: ignore[arg-type]
        schedule=loop.schedule,
        schedule_late=loop.schedule_late,
        record=InstanceRecord("s0", "FAKE", "m", 1.0),
        tbt=tbt,
    )
    fleet = Fleet(
        FleetContext(
            loop=loop,
            engines=[engine],
            router=fakes.RoundRobin(),
            workload=fakes.ListWorkload(list(specs)),
            model="m",
            block_size=config.block_size,
            tbt=tbt,
        )
    )
    return StaticHarness(fleet, engine, tbt)


BIG = EngineConfig(kv_capacity_tokens=1_000_000, max_model_len=1000)


def test_one_batch_hand_checked(fakes: SimpleNamespace) -> None:
    model = fakes.LinearModel(0.01, 0.0001, decode_kv_s_per_token=1e-6, prefill_s_per_pair=1e-8)
    specs = [
        # A one-token blocker at t=0 keeps the engine busy while the three others arrive.
        RequestSpec(0, 0.0, 10, 1),
        RequestSpec(1, 0.002, 100, 2),
        RequestSpec(2, 0.003, 50, 5),
        RequestSpec(3, 0.004, 80, 10),
        # Arrives during the three-request batch: waits for its longest member.
        RequestSpec(4, 0.02, 20, 3),
    ]
    h = make_static(fakes, specs, BIG, model)
    result = h.run()
    assert all(r.ok for r in result.records)

    # Blocker: prefill 1 x 10 tokens = 0.01 + 0.001 + 1e-8 * 10 * 11 / 2; one token, no decode.
    t1 = 0.01 + 0.001 + 1e-8 * 55
    blocker = h.rec(0)
    assert blocker.scheduled_s == 0.0
    assert blocker.first_token_s == pytest.approx(t1)
    assert blocker.finish_s == pytest.approx(t1)

    # Batch of three: b = 3, prompts padded to 100 -> prefill linear(300) + pairs 3 * 100 * 101 / 2.
    first = t1 + (0.01 + 0.0001 * 300) + 1e-8 * 3 * 100 * 101 / 2
    # m padded decode steps: m * linear(3) + kv * 3 * (m * 100 + m (m - 1) / 2).
    step = 0.01 + 0.0001 * 3
    finish = {
        1: first + 1 * step + 1e-6 * 3 * (1 * 100 + 0),
        2: first + 4 * step + 1e-6 * 3 * (4 * 100 + 6),
        3: first + 9 * step + 1e-6 * 3 * (9 * 100 + 36),
    }
    for rid in (1, 2, 3):
        r = h.rec(rid)
        assert r.scheduled_s == pytest.approx(t1), rid
        assert r.first_token_s == pytest.approx(first), rid
        assert r.finish_s == pytest.approx(finish[rid]), rid
    # All three share one first-token time; each finishes at its own last token.
    assert h.rec(1).first_token_s == h.rec(2).first_token_s == h.rec(3).first_token_s
    assert h.rec(1).finish_s < h.rec(2).finish_s < h.rec(3).finish_s

    # The next batch starts only when the longest one ends.
    late = h.rec(4)
    assert late.arrival_s < finish[1]  # it was waiting while batch members finished
    assert late.scheduled_s == pytest.approx(finish[3])
    t3 = finish[3]
    first3 = t3 + (0.01 + 0.0001 * 20) + 1e-8 * 20 * 21 / 2
    assert late.first_token_s == pytest.approx(first3)
    assert late.finish_s == pytest.approx(first3 + 2 * (0.01 + 0.0001) + 1e-6 * (2 * 20 + 1))

    assert result.duration_s == pytest.approx(late.finish_s)
    # Busy the whole time (the engine never idled between batches).
    assert h.engine.record.busy_s == pytest.approx(late.finish_s)
    assert h.engine.record.steps == 1 + 10 + 3
    assert not h.engine.busy and not h.engine.batch and not h.engine.waiting
    assert h.engine.outstanding_tokens == 0


def test_const_model_batch_finishes_at_own_last_token(fakes: SimpleNamespace) -> None:
    dt = 0.01
    specs = [RequestSpec(0, 0.0, 10, 1)] + [
        RequestSpec(i, 0.001, 10, o) for i, o in ((1, 2), (2, 5), (3, 10))
    ]
    h = make_static(fakes, specs, BIG, fakes.ConstModel(dt))
    h.run()
    start = dt  # the blocker's single prefill step
    for rid, o in ((1, 2), (2, 5), (3, 10)):
        r = h.rec(rid)
        assert r.scheduled_s == pytest.approx(start)
        assert r.first_token_s == pytest.approx(start + dt)
        assert r.finish_s == pytest.approx(start + dt + (o - 1) * dt)
        assert r.tpot_s == pytest.approx(dt)
    # TBT: every decode gap is dt, weighted by the tokens after the first.
    assert h.tbt.total == 1 + 4 + 9
    assert h.tbt.percentile(50) == pytest.approx(dt, rel=0.02)


def test_same_instant_arrivals_share_the_first_batch(fakes: SimpleNamespace) -> None:
    specs = [RequestSpec(i, 0.0, 10, o) for i, o in enumerate((2, 5, 10))]
    h = make_static(fakes, specs, BIG, fakes.ConstModel(0.01))
    h.run()
    firsts = [h.rec(i).first_token_s for i in range(3)]
    assert firsts == pytest.approx([0.01, 0.01, 0.01])


def test_slots_limited_by_kv_capacity_over_max_model_len(fakes: SimpleNamespace) -> None:
    cfg = EngineConfig(kv_capacity_tokens=10_000, max_model_len=3000, static_batch_size=32)
    specs = [RequestSpec(0, 0.0, 10, 1)] + [RequestSpec(i, 0.001, 10, 2) for i in range(1, 8)]
    h = make_static(fakes, specs, cfg, fakes.ConstModel(0.01))
    assert h.engine.slots == 3  # 10_000 // 3000
    assert h.engine.reserve == 3000
    h.run()
    starts: dict[float, list[int]] = {}
    for r in h.fleet.records:
        starts.setdefault(round(r.scheduled_s, 9), []).append(r.request_id)
    assert sorted(starts.values()) == [[0], [1, 2, 3], [4, 5, 6], [7]]


def test_slots_limited_by_static_batch_size(fakes: SimpleNamespace) -> None:
    cfg = EngineConfig(kv_capacity_tokens=1_000_000, max_model_len=1000, static_batch_size=2)
    h = make_static(fakes, [], cfg, fakes.ConstModel())
    assert h.engine.slots == 2


def test_at_least_one_slot_and_default_reserve(fakes: SimpleNamespace) -> None:
    h = make_static(fakes, [], EngineConfig(kv_capacity_tokens=1000), fakes.ConstModel())
    assert h.engine.reserve == DEFAULT_STATIC_MAX_LEN
    assert h.engine.slots == 1
    h = make_static(
        fakes, [], EngineConfig(kv_capacity_tokens=4 * DEFAULT_STATIC_MAX_LEN), fakes.ConstModel()
    )
    assert h.engine.slots == 4


def test_fits_uses_max_model_len(fakes: SimpleNamespace) -> None:
    cfg = EngineConfig(kv_capacity_tokens=1_000_000, max_model_len=1000)
    specs = [RequestSpec(0, 0.0, 900, 100), RequestSpec(1, 1.0, 900, 101), RequestSpec(2, 2.0, 1001, 1)]
    h = make_static(fakes, specs, cfg, fakes.ConstModel())
    assert h.engine.fits(specs[0])
    assert not h.engine.fits(specs[1])
    assert not h.engine.fits(specs[2])
    h.run()
    assert h.rec(0).ok
    assert not h.rec(1).ok and h.rec(1).reason == "too_long"
    assert not h.rec(2).ok and h.rec(2).reason == "too_long"


def test_fits_defaults_to_the_static_max_len(fakes: SimpleNamespace) -> None:
    h = make_static(fakes, [], EngineConfig(kv_capacity_tokens=1_000_000), fakes.ConstModel())
    assert h.engine.fits(RequestSpec(0, 0.0, DEFAULT_STATIC_MAX_LEN - 1, 1))
    assert not h.engine.fits(RequestSpec(0, 0.0, DEFAULT_STATIC_MAX_LEN, 1))


def test_view_reports_batch_and_queue(fakes: SimpleNamespace) -> None:
    cfg = EngineConfig(kv_capacity_tokens=8000, max_model_len=2000)  # 4 slots
    specs = [RequestSpec(0, 0.0, 10, 50)] + [RequestSpec(i, 0.001, 10, 2) for i in range(1, 6)]
    h = make_static(fakes, specs, cfg, fakes.ConstModel(0.01))
    seen = []

    def probe(now: float, _: object) -> None:
        v = h.engine.view()
        seen.append((v.running, v.waiting, v.outstanding_requests, v.kv_usage, v.kv_capacity_tokens))

    h.fleet.loop.schedule(0.1, probe)
    h.run()
    # At 0.1 the blocker (50 tokens, 0.5 s) is still running alone; five wait.
    assert seen == [(1, 5, 6, 0.25, 8000)]
    assert all(r.ok for r in h.fleet.records)
