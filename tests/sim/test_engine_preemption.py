"""vLLM's admission gate (``scheduler_reserve_full_isl``) and what a recompute preemption keeps:
with prefix caching a preempted request's full blocks stay cached, so its resume reuses those not
evicted meanwhile instead of recomputing its whole prompt and output."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from tokenplane.sim.engine import EngineConfig
from tokenplane.sim.workloads.base import RequestSpec

APPROX = 1e-9


def spec(rid: int, at: float, prompt: int, out: int) -> RequestSpec:
    return RequestSpec(rid, at, prompt, out)


def test_a_request_waits_until_its_whole_prompt_fits(fakes: SimpleNamespace) -> None:
    # 4 blocks of 16, chunks of 16 tokens. A (32 + 3) holds 3 blocks once it decodes; B's first
    # chunk fits the last block but its 40-token prompt (3 blocks) does not: vLLM admits it only
    # when A has finished (0.04). Without the gate it starts at 0.02 and is preempted.
    cfg = EngineConfig(kv_capacity_tokens=64, max_num_batched_tokens=16)
    specs = [spec(0, 0.0, 32, 3), spec(1, 0.001, 40, 2)]
    gated = fakes.make_fleet(specs, config=cfg)
    gated.run()
    loose = fakes.make_fleet(specs, config=dataclasses.replace(cfg, reserve_full_prompt=False))
    loose.run()
    assert gated.by_id(1).scheduled_s == pytest.approx(0.04, abs=APPROX)
    assert gated.by_id(1).preemptions == 0
    assert loose.by_id(1).scheduled_s == pytest.approx(0.02, abs=APPROX)
    for h in (gated, loose):
        assert all(r.ok for r in h.fleet.records)
        fakes.assert_kv_clean(h.engines[0])


def test_a_preempted_request_resumes_from_its_cached_blocks(fakes: SimpleNamespace) -> None:
    # 4 blocks of 16, chunks of 16 tokens. B (31 + 3) is preempted when it needs a third block,
    # with two full blocks computed; A (16 + 10) never needs them, so when A finishes B finds both
    # cached and recomputes 1 token (one step) instead of 33 (three steps).
    cfg = EngineConfig(kv_capacity_tokens=64, max_num_batched_tokens=16, max_num_seqs=2)
    specs = [spec(0, 0.0, 16, 10), spec(1, 0.0, 31, 3)]
    cached = fakes.make_fleet(specs, config=cfg)
    cached.run()
    plain = fakes.make_fleet(specs, config=dataclasses.replace(cfg, enable_prefix_caching=False))
    plain.run()
    for h in (cached, plain):
        assert all(r.ok for r in h.fleet.records)
        assert h.by_id(1).preemptions == 1
        fakes.assert_kv_clean(h.engines[0])
    assert plain.by_id(1).finish_s - cached.by_id(1).finish_s == pytest.approx(0.02, abs=APPROX)
