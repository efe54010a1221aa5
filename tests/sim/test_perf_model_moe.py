"""Step-time physics of mixture-of-experts models and of tensor/expert parallelism over a link."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.sim.catalog import Catalog, GpuSpec, ModelSpec
from tokenplane.sim.hf_config import load_hf_config, model_fields
from tokenplane.sim.perf_model import (
    StepTimeModel,
    all_to_all_time_s,
    allreduce_time_s,
    expected_distinct_experts,
)

CAT = Catalog.default()
H100 = CAT.gpu("h100")
PCIE_H100 = dataclasses.replace(H100, name="h100-pcie-link", interconnect="pcie", interconnect_gbps=128)

MIXTRAL = ModelSpec(
    name="mixtral-like",
    **model_fields(
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "vocab_size": 32000,
        }
    ),
)
# A fine-grained MoE that fits on one H100 (Qwen1.5-MoE-A2.7B's shape).
QWEN_MOE = ModelSpec(
    name="qwen-moe-like",
    **model_fields(
        load_hf_config(Path(__file__).parents[2] / "examples/models/qwen1.5-moe-a2.7b.config.json")
    ),
)


def _moe(experts: int, k: int, width: int, *, layers: int = 8, hidden: int = 1024) -> ModelSpec:
    return ModelSpec(
        name=f"moe-{experts}-{k}",
        params_b=1.0,
        layers=layers,
        hidden=hidden,
        intermediate=width,
        heads=8,
        kv_heads=8,
        head_dim=hidden // 8,
        vocab=32000,
        experts=experts,
        experts_per_token=k,
        expert_intermediate=width,
        moe_layers=layers,
    )


def test_expected_distinct_experts() -> None:
    assert expected_distinct_experts(1, 64, 6) == pytest.approx(6)
    assert expected_distinct_experts(0, 64, 6) == 0
    assert expected_distinct_experts(4096, 64, 6) == pytest.approx(64)
    # Two tokens picking 2 of 8: 8 * (1 - (6/8)^2) = 3.5 distinct on average.
    assert expected_distinct_experts(2, 8, 2) == pytest.approx(3.5)
    assert expected_distinct_experts(3, 8, 8) == 8


@given(b=st.integers(1, 5000), e=st.integers(1, 256), data=st.data())
def test_distinct_experts_bounded_and_monotonic(b: int, e: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, e))
    d = expected_distinct_experts(b, e, k)
    assert k - 1e-9 <= d <= min(e, b * k) + 1e-9
    assert expected_distinct_experts(b + 1, e, k) >= d - 1e-12


def test_more_experts_touched_more_bytes_per_step() -> None:
    m = StepTimeModel(H100, MIXTRAL, 2)
    touched = [m.experts_touched(n) for n in (1, 2, 4, 16)]
    reads = [m.weight_read_time(n) for n in (1, 2, 4, 16)]
    assert touched == sorted(touched) and touched[0] == pytest.approx(2) and touched[-1] > 7.9
    assert reads == sorted(reads) and reads[-1] > 1.5 * reads[0]
    # One token reads the shared weights and 2 of 8 experts: about the active size, not the total.
    active_bytes = (MIXTRAL.active_matmul_params + MIXTRAL.lm_head_params) * 2 / 2
    bw = H100.hbm_bw_gbps * 1e9 * H100.mem_efficiency
    assert reads[0] == pytest.approx(active_bytes / bw, rel=1e-6)
    # ... and the decode step time follows: 16 sequences cost more than 1 beyond their FLOPs.
    assert m.linear_time(16) - m.linear_time(1) > 0.5 * (reads[-1] - reads[0])
    dense = StepTimeModel(H100, CAT.model("llama-3-70b"), 2)
    assert dense.weight_read_time(1) == dense.weight_read_time(4096)  # dense: every weight, always


def test_moe_with_all_experts_touched_reads_like_dense_of_same_total_size() -> None:
    moe = _moe(16, 2, 512)
    same_total = dataclasses.replace(moe, name="dense", experts=0, experts_per_token=0, moe_layers=0)
    same_total = dataclasses.replace(same_total, intermediate=16 * 512)
    assert moe.expert_matmul_params + moe.shared_matmul_params == pytest.approx(
        same_total.shared_matmul_params, rel=0.01
    )  # the routers' hidden x E weights are the difference
    m, d = StepTimeModel(H100, moe), StepTimeModel(H100, same_total)
    assert m.weight_read_time(4096) == pytest.approx(d.weight_read_time(4096), rel=0.01)
    every_expert = StepTimeModel(H100, _moe(16, 16, 512))  # k = E: one token touches them all
    assert every_expert.weight_read_time(1) == pytest.approx(d.weight_read_time(1), rel=0.01)


def test_flops_come_from_active_parameters() -> None:
    moe = _moe(16, 2, 512)
    active_dense = dataclasses.replace(
        moe, name="active", experts=0, experts_per_token=0, moe_layers=0, intermediate=2 * 512
    )
    assert moe.flops_per_token == pytest.approx(active_dense.flops_per_token, rel=0.01)
    # Compute-bound (every expert touched, huge batch): the MoE costs what its active size costs.
    n = 1 << 16
    big_moe, big_active = StepTimeModel(H100, moe), StepTimeModel(H100, active_dense)
    gemm_moe = big_moe.linear_time(n) - big_moe.linear_time(n - 1024)
    gemm_active = big_active.linear_time(n) - big_active.linear_time(n - 1024)
    assert gemm_moe == pytest.approx(gemm_active, rel=0.15)


def test_nvlink_all_reduce_is_faster_than_pcie() -> None:
    for n in (1, 64, 2048):
        nv = StepTimeModel(H100, CAT.model("llama-3.1-8b"), 2).allreduce_time(n)
        pcie = StepTimeModel(PCIE_H100, CAT.model("llama-3.1-8b"), 2).allreduce_time(n)
        assert 0 < nv < pcie
    big = 64 << 20
    assert allreduce_time_s(big, 4, 900) < allreduce_time_s(big, 4, 128) < allreduce_time_s(big, 4, 64)
    slow_link = dataclasses.replace(PCIE_H100, interconnect_latency_us=200.0)
    assert StepTimeModel(slow_link, CAT.model("llama-3.1-8b"), 2).allreduce_time(1) > 2 * 32 * 200e-6


@pytest.mark.parametrize("gpu", ["h100", "a100", "l40s"])
def test_tp2_tpot_between_half_and_all_of_tp1(gpu: str) -> None:
    g = CAT.gpu(gpu)
    for spec, batches in ((CAT.model("llama-3.1-8b"), (1, 8, 32, 128)), (QWEN_MOE, (8, 32, 128, 256))):
        tp1, tp2 = StepTimeModel(g, spec, 1), StepTimeModel(g, spec, 2)
        for batch in batches:
            context = batch * 1500
            t1 = tp1.step_time(batch, decode_context_tokens=context, prefill_attn_pairs=0)
            t2 = tp2.step_time(batch, decode_context_tokens=context, prefill_attn_pairs=0)
            assert t1 / 2 < t2 < t1, (gpu, spec.name, batch, t1, t2)


def test_tp2_does_not_pay_for_a_small_moe_at_batch_one_on_h100() -> None:
    # 2.7 B active parameters read in ~2.7 ms at TP1; TP2 halves that but adds 48 all-reduces of
    # ~30 us each (the fitted NCCL latency): latency-bound, TP2 is slower. It pays from batch ~4.
    tp1, tp2 = StepTimeModel(H100, QWEN_MOE, 1), StepTimeModel(H100, QWEN_MOE, 2)
    assert tp2.step_time(1, 1500, 0) > tp1.step_time(1, 1500, 0)
    assert tp2.step_time(8, 8 * 1500, 0) < tp1.step_time(8, 8 * 1500, 0)


def test_expert_parallel_all_to_all() -> None:
    dense = StepTimeModel(H100, CAT.model("llama-3.1-8b"), 2, expert_parallel=True)
    assert dense.all_to_all_time(256) == 0 and not dense.expert_parallel
    assert StepTimeModel(H100, MIXTRAL, 1, expert_parallel=True).all_to_all_time(256) == 0
    nv = StepTimeModel(H100, MIXTRAL, 4, expert_parallel=True)
    pcie = StepTimeModel(PCIE_H100, MIXTRAL, 4, expert_parallel=True)
    tp_only = StepTimeModel(H100, MIXTRAL, 4)
    for n in (1, 256, 4096):
        assert 0 < nv.all_to_all_time(n) < pcie.all_to_all_time(n)
        assert nv.all_to_all_time(n) < nv.all_to_all_time(n + 512)
        # EP replaces the MoE layers' second all-reduce: fewer all-reduces than TP alone.
        assert nv.allreduce_time(n) < tp_only.allreduce_time(n)
    assert nv.weight_read_time(64) == pytest.approx(tp_only.weight_read_time(64))  # same bytes per rank
    assert all_to_all_time_s(1 << 20, 1, 900) == 0
    assert all_to_all_time_s(1 << 20, 4, 900) < all_to_all_time_s(1 << 20, 4, 64)


_GPUS = [H100, PCIE_H100, CAT.gpu("a100"), CAT.gpu("l40s")]


@settings(max_examples=60, deadline=None)
@given(
    gpu=st.sampled_from(_GPUS),
    spec=st.sampled_from([MIXTRAL, QWEN_MOE, _moe(64, 6, 256), CAT.model("llama-3.1-8b")]),
    tp=st.sampled_from([1, 2, 4, 8]),
    ep=st.booleans(),
    n=st.integers(1, 8192),
    dn=st.integers(1, 512),
    ctx=st.integers(0, 500_000),
    dctx=st.integers(1, 100_000),
)
def test_step_time_is_monotonic_in_batch_and_context(
    gpu: GpuSpec, spec: ModelSpec, tp: int, ep: bool, n: int, dn: int, ctx: int, dctx: int
) -> None:
    m = StepTimeModel(gpu, spec, tp, expert_parallel=ep)
    base = m.step_time(n, ctx, ctx)
    assert base > 0
    assert m.step_time(n + dn, ctx, ctx) >= base
    assert m.step_time(n, ctx + dctx, ctx) > base
    assert m.step_time(n, ctx, ctx + dctx) > base
    assert m.weight_read_time(n + dn) >= m.weight_read_time(n)
