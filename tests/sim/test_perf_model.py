"""Step-time model: roofline shape, ordering across GPUs and TP, and the H100 profile check."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.perf_model import StepTimeModel, allreduce_time_s

CAT = Catalog.default()


def _model(gpu: str, model: str, tp: int = 1) -> StepTimeModel:
    return StepTimeModel(CAT.gpu(gpu), CAT.model(model), tp)


def _traces() -> Path | None:
    try:
        from tokenplane.sim.workloads.traces import traces_dir
    except ImportError:  # pragma: no cover - fallback while the loader is absent
        env = os.environ.get("TOKENPLANE_TRACES")
        cand = Path(env) if env else Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
        return cand if cand.is_dir() else None
    return traces_dir()


@given(
    gpu=st.sampled_from(["h100", "h200", "a100", "l40s", "rtx4090", "rtxpro6000"]),
    model=st.sampled_from(["llama-3-8b", "llama-2-7b", "qwen2.5-7b", "tiny"]),
    tp=st.sampled_from([1, 2, 4]),
    a=st.integers(0, 65536),
    b=st.integers(0, 65536),
)
def test_linear_time_monotone(gpu: str, model: str, tp: int, a: int, b: int) -> None:
    m = _model(gpu, model, tp)
    lo, hi = min(a, b), max(a, b)
    assert m.linear_time(lo) <= m.linear_time(hi)
    assert m.linear_time(hi) == m.linear_time(hi)  # memoised value is stable


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100", "l40s", "rtx4090", "rtxpro6000"])
def test_memory_bound_flat(gpu: str) -> None:
    m = _model(gpu, "llama-3-8b")
    assert m.linear_time(64) == pytest.approx(m.linear_time(1), rel=0.15)


def test_compute_bound_slope_8b_h100() -> None:
    m = _model("h100", "llama-3-8b")
    assert 1.7 <= m.linear_time(8192) / m.linear_time(4096) <= 2.1
    assert 1.7 <= m.linear_time(32768) / m.linear_time(16384) <= 2.1


def test_decode_ordering_h200_h100_a100() -> None:
    times = {}
    for g in ("h200", "h100", "a100"):
        m = _model(g, "llama-3-8b")
        times[g] = m.step_time(64, decode_context_tokens=64 * 2000, prefill_attn_pairs=0)
        assert m.decode_kv_s_per_token > 0
    assert times["h200"] < times["h100"] < times["a100"]


def test_tp4_faster_than_tp2_for_70b() -> None:
    for n in (1, 64, 512, 2048, 8192):
        t2 = _model("h100", "llama-3-70b", 2).step_time(n, 100_000, n * 1000)
        t4 = _model("h100", "llama-3-70b", 4).step_time(n, 100_000, n * 1000)
        assert t4 < t2


def test_step_time_composition_and_constants() -> None:
    m = _model("h100", "llama-3-8b")
    spec = CAT.model("llama-3-8b")
    g = CAT.gpu("h100")
    assert m.step_time(100, 5000, 7000) == pytest.approx(
        m.linear_time(100) + 5000 * m.decode_kv_s_per_token + 7000 * m.prefill_s_per_pair
    )
    assert m.decode_kv_s_per_token == pytest.approx(131072 / (3350e9 * g.mem_efficiency))
    assert m.prefill_s_per_pair == pytest.approx(4 * 32 * 32 * 128 / (989e12 * g.compute_efficiency))
    assert m.linear_time(0) == 0.0
    assert 50 < m.knee_tokens < 1000
    assert spec.kv_bytes_per_token == 131072
    # 8B decode of a small batch on H100: ~5-8 ms per step (weights ~16 GB at ~3 TB/s).
    assert 0.004 < m.linear_time(8) < 0.009


def test_allreduce_model() -> None:
    assert allreduce_time_s(1 << 20, 1, 900) == 0.0
    small, big = allreduce_time_s(8192, 8, 900), allreduce_time_s(64 << 20, 8, 900)
    assert 10e-6 < small < 60e-6
    assert 150e-6 < big < 500e-6
    assert allreduce_time_s(64 << 20, 2, 64) > big  # PCIe is slower than NVLink
    assert _model("h100", "llama-3-8b", 2).allreduce_time(128) > 0
    assert _model("h100", "llama-3-8b", 1).allreduce_time(128) == 0


def test_rejects_bad_tp() -> None:
    with pytest.raises(ValueError):
        _model("h100", "llama-3-8b", 0)


@pytest.mark.traces
def test_linear_time_vs_h100_llama2_7b_profile() -> None:
    traces = _traces()
    path = traces / "gpu-profiles" / "h100_meta-llama_Llama-2-7b-hf_mlp.csv" if traces else None
    if path is None or not path.is_file():
        pytest.skip("public traces absent: set TOKENPLANE_TRACES or provide ../shared/traces/gpu-profiles")
    from tokenplane.sim.calibrate import load_profile

    prof = load_profile(path)
    # Sanity on the profile parsing against the README's quoted figures (ms).
    quoted = {1: 5.6, 128: 6.4, 512: 12.1, 2048: 41.0}
    m = StepTimeModel(CAT.gpu("h100"), CAT.model("llama-2-7b"), 1, include_lm_head=False)
    for n, ms in quoted.items():
        measured = prof.times[1][n]
        assert measured * 1e3 == pytest.approx(ms, rel=0.03)
        assert m.linear_time(n) == pytest.approx(measured, rel=0.15), n
    with path.open() as f:
        assert "num_tensor_parallel_workers" in next(csv.reader(f))
