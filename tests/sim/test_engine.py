from __future__ import annotations

import random
from collections import deque
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.sim.engine import EngineConfig
from tokenplane.sim.workloads.base import RequestSpec

APPROX = 1e-9


def spec(
    rid: int,
    at: float,
    prompt: int,
    out: int,
    hashes: tuple[int, ...] = (),
    hb: int = 16,
) -> RequestSpec:
    return RequestSpec(rid, at, prompt, out, block_hashes=hashes, hash_block_tokens=hb)


def test_config_rejects_non_positive_limits() -> None:
    with pytest.raises(ValueError):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(ValueError):
        EngineConfig(kv_capacity_tokens=0)


def test_single_request_timeline(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([spec(0, 0.0, 100, 10)])
    res = h.run()
    (r,) = res.records
    assert r.ok and r.reason == "" and r.instance_id == "i0"
    assert r.scheduled_s == 0.0
    assert r.first_token_s == pytest.approx(0.01, abs=APPROX)  # one prefill step
    assert r.finish_s == pytest.approx(0.10, abs=APPROX)  # + 9 decode steps
    assert r.tpot_s == pytest.approx(0.01, abs=APPROX)
    assert r.preemptions == 0 and r.prefix_hit_tokens == 0
    inst = h.engines[0].record
    assert inst.steps == 10
    assert inst.busy_s == pytest.approx(0.10, abs=APPROX)
    assert res.tbt.total == 9
    assert res.tbt.percentile(50) == pytest.approx(0.01, rel=0.02)
    fakes.assert_kv_clean(h.engines[0])
    assert not h.engines[0].busy


def test_single_output_token_finishes_at_first_token(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([spec(0, 0.5, 100, 1)])
    (r,) = h.run().records
    assert r.first_token_s == pytest.approx(0.51, abs=APPROX)
    assert r.finish_s == r.first_token_s
    assert h.tbt.total == 0
    fakes.assert_kv_clean(h.engines[0])


def test_chunked_prefill_takes_one_step_per_budget_chunk(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([spec(0, 0.0, 5000, 3)], config=EngineConfig(max_num_batched_tokens=2048))
    (r,) = h.run().records
    assert r.ttft_s == pytest.approx(0.03, abs=APPROX)  # 2048 + 2048 + 904
    assert r.finish_s == pytest.approx(0.05, abs=APPROX)
    assert h.engines[0].record.steps == 5


def test_chunked_prefill_pairs_cost(fakes: SimpleNamespace) -> None:
    model = fakes.LinearModel(0.0, 0.0, prefill_s_per_pair=1e-6)
    h = fakes.make_fleet([spec(0, 0.0, 30, 1)], config=EngineConfig(max_num_batched_tokens=20), model=model)
    (r,) = h.run().records
    # chunk 1: 20 tokens over 0 cached -> 20*21/2 pairs; chunk 2: 10 tokens over 20 -> 10*20 + 10*11/2
    assert r.ttft_s == pytest.approx(1e-6 * (210 + 200 + 55), abs=APPROX)


def test_requests_arriving_during_a_step_share_the_next_step(fakes: SimpleNamespace) -> None:
    specs = [spec(0, 0.0, 1000, 5), spec(1, 0.005, 100, 5), spec(2, 0.005, 100, 5)]
    h = fakes.make_fleet(specs)
    h.run()
    a, b, c = (h.by_id(i) for i in range(3))
    assert a.first_token_s == pytest.approx(0.01, abs=APPROX)
    assert b.scheduled_s == c.scheduled_s == pytest.approx(0.01, abs=APPROX)
    assert b.first_token_s == c.first_token_s == pytest.approx(0.02, abs=APPROX)
    assert b.finish_s == c.finish_s == pytest.approx(0.06, abs=APPROX)
    assert a.finish_s == pytest.approx(0.05, abs=APPROX)
    assert h.tbt.total == 12


def test_simultaneous_arrivals_share_the_first_step(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([spec(0, 0.0, 100, 10), spec(1, 0.0, 100, 10)])
    h.run()
    a, b = h.by_id(0), h.by_id(1)
    assert a.ttft_s == pytest.approx(0.01, abs=APPROX)
    assert b.ttft_s == pytest.approx(a.ttft_s, abs=APPROX)


def test_arrival_mid_decode_joins_at_next_step_boundary(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([spec(0, 0.0, 100, 10), spec(1, 0.045, 100, 10)])
    h.run()
    a, b = h.by_id(0), h.by_id(1)
    assert a.finish_s == pytest.approx(0.10, abs=APPROX)  # unaffected by a constant step time
    assert b.scheduled_s == pytest.approx(0.05, abs=APPROX)
    assert b.first_token_s == pytest.approx(0.06, abs=APPROX)
    assert b.finish_s == pytest.approx(0.15, abs=APPROX)
    assert h.engines[0].record.steps == 15
    assert h.tbt.total == 18


def test_arrival_exactly_at_run_start_joins_immediately(fakes: SimpleNamespace) -> None:
    # A's decode run starts at 0.01; B arriving then is admitted in the step starting at 0.01.
    h = fakes.make_fleet([spec(0, 0.0, 100, 10), spec(1, 0.01, 100, 2)])
    h.run()
    b = h.by_id(1)
    assert b.scheduled_s == pytest.approx(0.01, abs=APPROX)
    assert b.first_token_s == pytest.approx(0.02, abs=APPROX)
    assert h.by_id(0).finish_s == pytest.approx(0.10, abs=APPROX)


def test_arrival_when_batch_is_full_waits_for_a_finish(fakes: SimpleNamespace) -> None:
    cfg = EngineConfig(max_num_seqs=1)
    h = fakes.make_fleet([spec(0, 0.0, 100, 10), spec(1, 0.0, 100, 10), spec(2, 0.03, 50, 3)], config=cfg)
    h.run()
    a, b, c = (h.by_id(i) for i in range(3))
    assert a.finish_s == pytest.approx(0.10, abs=APPROX)
    assert b.scheduled_s == pytest.approx(0.10, abs=APPROX)
    assert b.first_token_s == pytest.approx(0.11, abs=APPROX)
    assert b.finish_s == pytest.approx(0.20, abs=APPROX)
    assert c.scheduled_s == pytest.approx(0.20, abs=APPROX)  # FCFS behind b
    assert c.finish_s == pytest.approx(0.23, abs=APPROX)


def test_repeated_prompt_hits_prefix_cache(fakes: SimpleNamespace) -> None:
    model = fakes.LinearModel(0.001, 1e-4)
    hashes = tuple(range(100, 110))
    specs = [spec(0, 0.0, 160, 2, hashes), spec(1, 1.0, 160, 2, hashes), spec(2, 2.0, 168, 2, hashes)]
    h = fakes.make_fleet(specs, model=model)
    h.run()
    a, b, c = (h.by_id(i) for i in range(3))
    assert a.prefix_hit_tokens == 0 and a.prefix_bound_tokens == 0
    # 10 hashes x 16 tokens cover the whole 160-token prompt: capped to leave one block to compute
    assert b.prefix_hit_tokens == 144 == b.prefix_bound_tokens
    assert c.prefix_hit_tokens == 160 == c.prefix_bound_tokens
    assert a.ttft_s == pytest.approx(0.001 + 1e-4 * 160, abs=APPROX)
    assert b.ttft_s == pytest.approx(0.001 + 1e-4 * 16, abs=APPROX)
    assert c.ttft_s == pytest.approx(0.001 + 1e-4 * 8, abs=APPROX)
    kv = h.engines[0].kv
    fakes.assert_kv_clean(h.engines[0])
    assert kv.evictable == 10  # the cached prompt stays, unreferenced
    assert set(kv.entries) == set(hashes)


def test_prefix_hits_with_coarser_hash_blocks_and_partial_chain(fakes: SimpleNamespace) -> None:
    # hash blocks of 64 tokens over 16-token KV blocks; the second prompt diverges after 2 hash blocks
    specs = [spec(0, 0.0, 300, 2, (1, 2, 3, 4), hb=64), spec(1, 1.0, 300, 2, (1, 2, 9, 10), hb=64)]
    h = fakes.make_fleet(specs)
    h.run()
    assert h.by_id(1).prefix_hit_tokens == 128 == h.by_id(1).prefix_bound_tokens
    kv = h.engines[0].kv
    fakes.assert_kv_clean(h.engines[0])
    assert kv.entries.keys() == {1, 2, 3, 4, 9, 10}
    assert kv.evictable == 6 * 4


def test_hash_blocks_not_a_multiple_of_the_kv_block_are_ignored(fakes: SimpleNamespace) -> None:
    specs = [spec(0, 0.0, 300, 2, (1, 2, 3), hb=24), spec(1, 1.0, 300, 2, (1, 2, 3), hb=24)]
    h = fakes.make_fleet(specs)
    h.run()
    assert h.by_id(1).prefix_hit_tokens == 0
    assert h.by_id(1).prefix_bound_tokens == 72  # the fleet's bound is only an upper bound
    assert h.engines[0].kv.entries == {}
    fakes.assert_kv_clean(h.engines[0])


def test_concurrent_identical_prompts_register_once(fakes: SimpleNamespace) -> None:
    hashes = tuple(range(20))
    h = fakes.make_fleet([spec(i, 0.001 * i, 320, 4, hashes) for i in range(3)])
    h.run()
    assert all(r.ok for r in h.fleet.records)
    kv = h.engines[0].kv
    fakes.assert_kv_clean(h.engines[0])
    assert len(kv.entries) == 20 and kv.evictable == 20


def test_prefix_caching_disabled_with_hashed_prompts(fakes: SimpleNamespace) -> None:
    hashes = tuple(range(6))
    cfg = EngineConfig(enable_prefix_caching=False)
    h = fakes.make_fleet([spec(0, 0.0, 100, 10, hashes), spec(1, 1.0, 100, 10, hashes)], config=cfg)
    h.run()
    assert all(r.ok for r in h.fleet.records)
    assert h.by_id(1).prefix_hit_tokens == 0
    fakes.assert_kv_clean(h.engines[0])


def test_kv_pressure_preempts_but_everything_completes(fakes: SimpleNamespace) -> None:
    # 20 blocks of 16 tokens; each request ends at 299 tokens of context (19 blocks)
    cfg = EngineConfig(kv_capacity_tokens=320)
    specs = [spec(i, 0.0, 100, 200) for i in range(4)]
    h = fakes.make_fleet(specs, config=cfg)
    h.run()
    recs = h.fleet.records
    assert all(r.ok for r in recs)
    assert sum(r.preemptions for r in recs) > 0
    for r in recs:
        assert r.arrival_s <= r.scheduled_s <= r.first_token_s <= r.finish_s
    fakes.assert_kv_clean(h.engines[0])


def test_recompute_prefill_emits_the_next_token(fakes: SimpleNamespace) -> None:
    # 3 blocks of 16 tokens. A and B each need a second block at their first decode step; B (newest)
    # is preempted after its first token, waits for A to finish at 0.17, recomputes 17 tokens
    # (0.17-0.18, emitting token 2 as vLLM does), then decodes tokens 3..17: 15 steps -> 0.33.
    cfg = EngineConfig(kv_capacity_tokens=48, max_num_seqs=2)
    h = fakes.make_fleet([spec(0, 0.0, 16, 17), spec(1, 0.005, 16, 17)], config=cfg)
    h.run()
    a, b = h.by_id(0), h.by_id(1)
    assert a.finish_s == pytest.approx(0.17, abs=APPROX)
    assert (b.preemptions, b.first_token_s) == (1, pytest.approx(0.02, abs=APPROX))
    assert b.finish_s == pytest.approx(0.33, abs=APPROX)  # the engine gives 0.34


def test_kv_pressure_with_shared_prefixes_stays_consistent(fakes: SimpleNamespace) -> None:
    cfg = EngineConfig(kv_capacity_tokens=640, max_num_batched_tokens=64)
    specs = [
        spec(i, 0.002 * i, 200 + 7 * i, 150, tuple(range(12)) if i % 2 else (50, 51, 52)) for i in range(8)
    ]
    h = fakes.make_fleet(specs, config=cfg)
    h.run()
    assert all(r.ok for r in h.fleet.records)
    assert sum(r.preemptions for r in h.fleet.records) > 0
    fakes.assert_kv_clean(h.engines[0])


def test_tbt_weights_count_every_token_after_the_first(fakes: SimpleNamespace) -> None:
    rng = random.Random(7)
    specs = [spec(i, rng.uniform(0, 0.5), rng.randint(10, 3000), rng.randint(1, 60)) for i in range(30)]
    specs.sort(key=lambda s: s.arrival_s)
    h = fakes.make_fleet(specs, model=fakes.LinearModel(0.004, 2e-6, 1e-8, 1e-12), engines=2)
    h.run()
    assert all(r.ok and r.preemptions == 0 for r in h.fleet.records)
    assert h.tbt.total == sum(s.output_tokens - 1 for s in specs)


def test_closed_form_run_matches_step_by_step_sum(fakes: SimpleNamespace) -> None:
    model = fakes.LinearModel(0.002, 1e-5, decode_kv_s_per_token=1e-6, prefill_s_per_pair=1e-9)
    prompt, out = 300, 50
    h = fakes.make_fleet([spec(0, 0.25, prompt, out)], model=model)
    h.run()
    (r,) = h.fleet.records
    t = 0.25 + model.linear_time(prompt) + 1e-9 * (prompt * (prompt + 1) // 2)
    assert r.first_token_s == pytest.approx(t, abs=APPROX)
    for j in range(out - 1):
        t += model.linear_time(1) + 1e-6 * (prompt + j)
    assert r.finish_s == pytest.approx(t, abs=APPROX)
    assert abs(r.finish_s - t) < 1e-9
    assert h.engines[0].record.steps == out


def test_outstanding_tokens_and_views(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([spec(0, 0.0, 100, 10), spec(1, 0.001, 50, 5)])
    h.run()
    e = h.engines[0]
    v = e.view()
    assert (v.running, v.waiting, v.outstanding_requests, v.outstanding_tokens) == (0, 0, 0, 0)
    assert v.kv_capacity_tokens == EngineConfig().kv_capacity_tokens
    # the router saw the first request outstanding when the second arrived
    second = h.router.seen_views[1][0]
    assert second.outstanding_requests == 1 and second.outstanding_tokens == 110
    assert second.kv_usage > 0


def test_fits_checks_capacity_and_max_model_len(fakes: SimpleNamespace) -> None:
    h = fakes.make_fleet([], config=EngineConfig(kv_capacity_tokens=1000, max_model_len=500))
    e = h.engines[0]
    assert e.capacity_tokens == 992  # whole blocks only
    assert e.fits(spec(0, 0, 400, 100))
    assert not e.fits(spec(0, 0, 400, 101))
    h = fakes.make_fleet([], config=EngineConfig(kv_capacity_tokens=1000))
    assert h.engines[0].fits(spec(0, 0, 900, 92))
    assert not h.engines[0].fits(spec(0, 0, 900, 93))


# -- reference model -----------------------------------------------------------------------------


def reference_timeline(
    specs: list[RequestSpec], model: object, max_seqs: int, budget: int
) -> dict[int, tuple[float, float, float]]:
    """Naive step-by-step continuous batching with ample KV and no prefix caching.

    Returns request id -> (scheduled, first token, finish).
    """
    lt = model.linear_time  # type: ignore[attr-defined]
    b = model.decode_kv_s_per_token  # type: ignore[attr-defined]
    pp = model.prefill_s_per_pair  # type: ignore[attr-defined]
    pending = deque(specs)
    waiting: deque[RequestSpec] = deque()
    running: list[dict] = []  # admission order
    out: dict[int, list[float]] = {}
    t = 0.0
    while pending or waiting or running:
        if not waiting and not running:
            t = max(t, pending[0].arrival_s)
        while pending and pending[0].arrival_s <= t:
            waiting.append(pending.popleft())
        decoders = [s for s in running if s["ctx"] is not None]
        left = budget - len(decoders)
        chunks: list[tuple[dict, int]] = []
        pairs = 0
        for s in running:
            if s["ctx"] is None and left > 0:
                c = min(s["spec"].prompt_tokens - s["computed"], left)
                pairs += c * s["computed"] + c * (c + 1) // 2
                chunks.append((s, c))
                left -= c
        while waiting and left > 0 and len(running) < max_seqs:
            sp = waiting.popleft()
            s = {"spec": sp, "computed": 0, "ctx": None, "gen": 0}
            running.append(s)
            out[sp.request_id] = [t, 0.0, 0.0]
            c = min(sp.prompt_tokens, left)
            pairs += c * (c + 1) // 2
            chunks.append((s, c))
            left -= c
        ntok = len(decoders) + sum(c for _, c in chunks)
        t += lt(ntok) + b * sum(s["ctx"] for s in decoders) + pp * pairs
        for s in decoders:
            s["ctx"] += 1
            s["gen"] += 1
            if s["gen"] >= s["spec"].output_tokens:
                out[s["spec"].request_id][2] = t
                running.remove(s)
        for s, c in chunks:
            s["computed"] += c
            if s["computed"] >= s["spec"].prompt_tokens:
                s["ctx"] = s["computed"]
                s["gen"] = 1
                out[s["spec"].request_id][1] = t
                if s["spec"].output_tokens <= 1:
                    out[s["spec"].request_id][2] = t
                    running.remove(s)
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 12),
    max_seqs=st.integers(1, 6),
    budget=st.sampled_from([32, 100, 512, 2048]),
    kv_coef=st.sampled_from([0.0, 1e-6]),
)
def test_engine_matches_step_by_step_reference(
    fakes: SimpleNamespace, seed: int, n: int, max_seqs: int, budget: int, kv_coef: float
) -> None:
    rng = random.Random(seed)
    t = 0.0
    specs = []
    for i in range(n):
        t += rng.expovariate(30.0)
        specs.append(spec(i, t, rng.randint(1, 400), rng.randint(1, 40)))
    model = fakes.LinearModel(0.003, 1e-5, decode_kv_s_per_token=kv_coef, prefill_s_per_pair=1e-10)
    cfg = EngineConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, kv_capacity_tokens=10**6)
    h = fakes.make_fleet(specs, config=cfg, model=model)
    h.run()
    want = reference_timeline(specs, model, max_seqs, budget)
    for r in h.fleet.records:
        sched, first, fin = want[r.request_id]
        assert r.ok and r.preemptions == 0
        assert r.scheduled_s == pytest.approx(sched, abs=1e-9), r
        assert r.first_token_s == pytest.approx(first, abs=1e-9), r
        assert r.finish_s == pytest.approx(fin, abs=1e-9), r
    assert h.tbt.total == sum(s.output_tokens - 1 for s in specs)
    fakes.assert_kv_clean(h.engines[0])
