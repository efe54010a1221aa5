from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.views import WorkflowContext
from tokenplane.sim.engine import EngineConfig
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.workloads.base import RequestSpec

APPROX = 1e-9


def test_closed_loop_follow_ups_are_driven_to_completion(fakes: SimpleNamespace) -> None:
    def follow(s: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        step = s.workflow.step if s.workflow else 1
        if step >= 3:
            return ()
        wf = WorkflowContext("w", step=step + 1, total_steps=3)
        # think for 1 s; the next prompt extends the previous context
        nxt = RequestSpec(
            s.request_id + 1, finish_s + 1.0, s.prompt_tokens + s.output_tokens + 16, 10,
            block_hashes=(*s.block_hashes, 100 + step), hash_block_tokens=16, workflow=wf,
        )  # fmt: skip
        return (nxt,)

    first = RequestSpec(0, 0.0, 100, 10, block_hashes=tuple(range(6)), hash_block_tokens=16,
                        workflow=WorkflowContext("w", 1, 3))  # fmt: skip
    wl = fakes.ListWorkload([first], follow=follow)
    h = fakes.make_fleet(wl)
    res = h.run()
    assert [r.request_id for r in res.records] == [0, 1, 2]
    assert all(r.ok for r in res.records)
    r0, r1, r2 = res.records
    assert r0.finish_s == pytest.approx(0.10, abs=APPROX)
    assert r1.arrival_s == pytest.approx(1.10, abs=APPROX)
    assert r2.arrival_s == pytest.approx(r1.finish_s + 1.0, abs=APPROX)
    # the follow-up reuses the cached blocks of the previous step's prompt
    assert r1.prefix_hit_tokens == 96 == r1.prefix_bound_tokens
    assert r2.prefix_hit_tokens == 112 == r2.prefix_bound_tokens
    assert [f[0] for f in wl.finished] == [0, 1, 2] and all(f[2] for f in wl.finished)
    assert len(h.router.routed) == len(h.router.finished) == 3
    fakes.assert_kv_clean(h.engines[0])


def test_follow_up_arrival_before_finish_is_clamped(fakes: SimpleNamespace) -> None:
    def follow(s: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return (RequestSpec(1, 0.0, 10, 2),) if s.request_id == 0 else ()

    h = fakes.make_fleet(fakes.ListWorkload([RequestSpec(0, 0.0, 100, 10)], follow=follow))
    res = h.run()
    assert res.records[1].arrival_s == pytest.approx(0.10, abs=APPROX)
    assert res.records[1].ok


def test_request_too_long_for_the_kv_fails(fakes: SimpleNamespace) -> None:
    cfg = EngineConfig(kv_capacity_tokens=320)
    specs = [RequestSpec(0, 0.0, 300, 21), RequestSpec(1, 0.1, 300, 20)]
    wl = fakes.ListWorkload(specs)
    h = fakes.make_fleet(wl, config=cfg)
    res = h.run()
    bad, good = res.records
    assert not bad.ok and bad.reason == "too_long" and bad.finish_s is None
    assert bad.instance_id == "i0" and bad.scheduled_s is None
    assert good.ok
    assert wl.finished[0] == (0, 0.0, False)
    assert h.router.routed == [("1", "i0")]  # the failed request was never sent
    fakes.assert_kv_clean(h.engines[0])


def test_request_longer_than_max_model_len_fails(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([RequestSpec(0, 0.0, 4000, 97)], config=EngineConfig(max_model_len=4096))
    (r,) = h.run().records
    assert not r.ok and r.reason == "too_long"


def test_router_without_instance_fails_request(fakes: SimpleNamespace) -> None:
    wl = fakes.ListWorkload([RequestSpec(0, 0.0, 100, 10), RequestSpec(1, 0.5, 100, 10)])
    h = fakes.make_fleet(wl, router=fakes.NoInstance(), engines=2)
    res = h.run()
    assert [(r.ok, r.reason, r.route_reason, r.instance_id) for r in res.records] == [
        (False, "no_instance", "no_candidates", None)
    ] * 2
    assert [f[2] for f in wl.finished] == [False, False]
    assert all(e.record.steps == 0 and e.record.busy_s == 0 for e in h.engines)


def test_round_robin_spreads_requests_and_records_instances(fakes: SimpleNamespace) -> None:
    specs = [RequestSpec(i, 0.001 * i, 100, 10) for i in range(4)]
    h = fakes.make_fleet(specs, engines=2)
    res = h.run()
    assert [r.instance_id for r in res.records] == ["i0", "i1", "i0", "i1"]
    assert all(r.route_reason == "round_robin" for r in res.records)
    assert len(res.instances) == 2
    # the run ends with its last completion, not at the sampler's next tick
    assert res.duration_s == pytest.approx(max(r.finish_s for r in res.records), abs=APPROX)
    for inst in res.instances:
        assert inst.alive_s == res.duration_s
        assert 0 < inst.busy_s <= inst.alive_s


def test_samples_and_until(fakes: SimpleNamespace) -> None:
    specs = [RequestSpec(i, 0.3 * i, 2000, 200) for i in range(10)]
    h = fakes.make_fleet(specs, sample_interval_s=0.5)
    res = h.run()
    samples = h.engines[0].record.samples
    assert len(samples) >= 6
    assert [s.t_s for s in samples] == pytest.approx([0.5 * (i + 1) for i in range(len(samples))])
    assert all(0.0 <= s.busy_fraction <= 1.0 and 0.0 <= s.kv_usage <= 1.0 for s in samples)
    assert samples[0].busy_fraction == pytest.approx(1.0)
    assert all(r.ok for r in res.records)

    h2 = fakes.make_fleet(specs, sample_interval_s=0.5)
    res2 = h2.run(until=1.0)
    assert res2.duration_s == 1.0
    assert res2.instances[0].busy_s == pytest.approx(1.0)
    assert not all(r.ok for r in res2.records)


# -- property: random small fleets ---------------------------------------------------------------


def random_case(seed: int) -> dict:
    rng = random.Random(seed)
    bs = rng.choice([8, 16])
    n_eng = rng.randint(1, 4)
    configs = [
        EngineConfig(
            max_num_seqs=rng.randint(1, 8),
            max_num_batched_tokens=rng.choice([16, 64, 200, 512]),
            block_size=bs,
            kv_capacity_tokens=rng.randint(4, 120) * bs,
            enable_prefix_caching=True,
        )
        for _ in range(n_eng)
    ]
    hb = rng.choice([bs, 2 * bs, 4 * bs, 24])
    specs = []
    t = 0.0
    for i in range(rng.randint(1, 25)):
        t += rng.choice([0.0, rng.expovariate(50.0)])
        prompt = rng.randint(1, 700)
        group = rng.randrange(4)
        diverge = rng.randint(0, 12)
        nh = prompt // hb + rng.choice([0, 0, 1])  # sometimes one hash too many
        hashes = tuple(group * 1000 + j if j < diverge else 10**6 + i * 100 + j for j in range(nh))
        specs.append(
            RequestSpec(i, t, prompt, rng.randint(1, 120), block_hashes=hashes, hash_block_tokens=hb)
        )
    return {"configs": configs, "specs": specs, "follow_seed": rng.random()}


def make_follow(p: float):
    def follow(s: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        if not ok or s.request_id >= 1000 or (s.request_id * 7919 % 100) / 100 > p:
            return ()
        return (
            RequestSpec(
                1000 + s.request_id, finish_s + 0.01, s.prompt_tokens + s.output_tokens, 5,
                block_hashes=s.block_hashes, hash_block_tokens=s.hash_block_tokens,
            ),
        )  # fmt: skip

    return follow


def run_case(fakes: SimpleNamespace, case: dict):
    wl = fakes.ListWorkload(case["specs"], follow=make_follow(case["follow_seed"]))
    model = fakes.LinearModel(0.002, 1e-5, 1e-7, 1e-10)
    h = fakes.make_fleet(wl, config=case["configs"], model=model)
    return h, h.run()


def snapshot(records: list[RequestRecord]) -> list[tuple]:
    return [
        (r.request_id, r.instance_id, r.arrival_s, r.scheduled_s, r.first_token_s, r.finish_s,
         r.prefix_hit_tokens, r.prefix_bound_tokens, r.preemptions, r.ok, r.reason)
        for r in records
    ]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_fleets_complete_consistently(fakes: SimpleNamespace, seed: int) -> None:
    case = random_case(seed)
    h, res = run_case(fakes, case)
    specs = {s.request_id: s for s in case["specs"]}
    caps = {e.id: e.capacity_tokens for e in h.engines}
    ok_tokens = 0
    for r in res.records:
        if r.ok:
            assert r.reason == ""
            assert r.arrival_s <= r.scheduled_s <= r.first_token_s <= r.finish_s, r
            if r.request_id in specs:
                assert r.output_tokens == specs[r.request_id].output_tokens
            ok_tokens += r.output_tokens - 1
        else:
            assert r.reason == "too_long", r
            assert r.prompt_tokens + r.output_tokens > caps[r.instance_id]
            assert r.finish_s is None and r.scheduled_s is None
        assert 0 <= r.prefix_hit_tokens <= r.prefix_bound_tokens, r
        assert r.prefix_hit_tokens < max(r.prompt_tokens, 1)
    # every request ended exactly once, and the workload heard of it
    assert sorted(f[0] for f in h.workload.finished) == sorted(r.request_id for r in res.records)
    assert len(h.router.finished) == sum(r.ok for r in res.records) == len(h.router.routed)
    assert res.tbt.total == ok_tokens
    for e in h.engines:
        fakes.assert_kv_clean(e)
        assert not e.busy and not e.waiting and not e.running and e.outstanding_tokens == 0
    # same inputs, same outputs
    _, res2 = run_case(fakes, random_case(seed))
    assert snapshot(res2.records) == snapshot(res.records)
    assert res2.tbt.counts == res.tbt.counts and res2.duration_s == res.duration_s
