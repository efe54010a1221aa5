"""Decode attention's KV-read efficiency (GpuSpec.kv_read_efficiency): the physics directions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.errors import CatalogError
from tokenplane.sim.perf_model import StepTimeModel

CAT = Catalog.default()
GPUS = ["h100", "a100", "l40s", "rtx4090", "rtxpro6000"]


def _steps(gpu: str, kv_eff: float, model: str = "llama-3-8b", tp: int = 1) -> StepTimeModel:
    spec = dataclasses.replace(CAT.gpu(gpu), kv_read_efficiency=kv_eff)
    return StepTimeModel(spec, CAT.model(model), tp)


@pytest.mark.parametrize("gpu", GPUS)
def test_efficiency_one_is_the_weight_read_bandwidth(gpu: str) -> None:
    g = CAT.gpu(gpu)
    assert g.kv_read_efficiency == 1.0  # built-in default: the model before this term
    m = _steps(gpu, 1.0)
    assert m.decode_kv_s_per_token == pytest.approx(131072 / (g.hbm_bw_gbps * 1e9 * g.mem_efficiency))
    assert m.step_time(32, 40_000, 0) == StepTimeModel(g, CAT.model("llama-3-8b")).step_time(32, 40_000, 0)


@given(
    gpu=st.sampled_from(GPUS),
    lo=st.floats(0.05, 1.0),
    hi=st.floats(0.05, 1.0),
    n=st.integers(1, 256),
    ctx=st.integers(1, 500_000),
)
def test_lower_kv_efficiency_lengthens_only_the_kv_part(
    gpu: str, lo: float, hi: float, n: int, ctx: int
) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    slow, fast = _steps(gpu, lo), _steps(gpu, hi)
    assert slow.step_time(n, ctx, 0) >= fast.step_time(n, ctx, 0)
    assert slow.linear_time(n) == fast.linear_time(n)  # weights, GEMMs, overheads unchanged
    assert slow.prefill_s_per_pair == fast.prefill_s_per_pair  # prefill attention is compute-bound
    # KV time is inversely proportional to the efficiency.
    assert slow.decode_kv_s_per_token * lo == pytest.approx(fast.decode_kv_s_per_token * hi)


@given(
    gpu=st.sampled_from(GPUS), kv_eff=st.floats(0.05, 1.0), a=st.integers(0, 10**6), b=st.integers(0, 10**6)
)
def test_more_kv_bytes_longer_step(gpu: str, kv_eff: float, a: int, b: int) -> None:
    m = _steps(gpu, kv_eff)
    lo, hi = min(a, b), max(a, b)
    assert m.step_time(64, lo, 0) <= m.step_time(64, hi, 0)


def test_kv_share_of_step_grows_as_efficiency_falls() -> None:
    # A PRO 6000-like decode step (~80 sequences x ~1,200 tokens): the KV reads are about as many
    # bytes as the weights, so halving their efficiency adds about as much as a weight read.
    full, half = _steps("rtxpro6000", 1.0), _steps("rtxpro6000", 0.5)
    ctx = 80 * 1200
    added = half.step_time(80, ctx, 0) - full.step_time(80, ctx, 0)
    assert added == pytest.approx(ctx * full.decode_kv_s_per_token)
    assert 0.5 < added / full.weights_read_s < 1.0


def test_tensor_parallel_still_splits_kv_reads() -> None:
    t1, t2 = _steps("h100", 0.8, "llama-3-70b", 1), _steps("h100", 0.8, "llama-3-70b", 2)
    assert t2.decode_kv_s_per_token == pytest.approx(t1.decode_kv_s_per_token / 2)


def test_catalogue_file_sets_and_bounds_it(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("gpus:\n  rtx4090:\n    kv_read_efficiency: 0.8\n")
    cat = Catalog.from_yaml(good)
    assert cat.gpu("rtx4090").kv_read_efficiency == 0.8
    assert cat.gpu("rtx4090").mem_efficiency == CAT.gpu("rtx4090").mem_efficiency  # merged
    for bad in ("0", "1.2", "-0.5"):
        p = tmp_path / "bad.yaml"
        p.write_text(f"gpus:\n  rtx4090:\n    kv_read_efficiency: {bad}\n")
        with pytest.raises(CatalogError, match="kv_read_efficiency"):
            Catalog.from_yaml(p)
