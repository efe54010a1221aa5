"""Catalogue: shapes, KV sizes, lookups, overrides and KV capacity."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenplane.sim.catalog import (
    Catalog,
    CatalogError,
    GpuSpec,
    ModelSpec,
    UnknownHardware,
    kv_capacity_tokens,
)

CAT = Catalog.default()


@pytest.mark.parametrize(
    ("model", "kv_bytes"),
    [
        ("llama-3-8b", 131072),
        ("llama-3.1-8b", 131072),
        ("llama-3-70b", 327680),
        ("llama-2-7b", 524288),
        ("llama-2-70b", 327680),
        ("qwen2.5-7b", 57344),
    ],
)
def test_kv_bytes_per_token(model: str, kv_bytes: int) -> None:
    assert CAT.model(model).kv_bytes_per_token == kv_bytes


@pytest.mark.parametrize(
    ("model", "params_b"),
    [
        ("llama-3-8b", 8.03),
        ("llama-3-70b", 70.55),
        ("llama-2-7b", 6.74),
        ("llama-2-70b", 68.98),
        ("qwen2.5-7b", 7.62),
    ],
)
def test_shapes_match_param_counts(model: str, params_b: float) -> None:
    m = CAT.model(model)
    embed = m.lm_head_params * (1 if m.tie_embeddings else 2)
    from_shape = (m.layers * m.layer_matmul_params + embed) / 1e9
    assert from_shape == pytest.approx(params_b, rel=0.01)  # norms are the remainder
    assert m.flops_per_token == pytest.approx(2 * m.params_b * 1e9, rel=0.1)
    assert m.weight_bytes == pytest.approx(2 * m.params_b * 1e9)


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("LLAMA-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3-70B", "llama-3-70b"),
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("tiny", "tiny"),
    ],
)
def test_model_aliases(alias: str, name: str) -> None:
    assert CAT.model(alias).name == name


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("H100", "h100"),
        ("h100-sxm", "h100"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("RTX4090", "rtx4090"),
        ("RTXPRO6000", "rtxpro6000"),
        ("A100-80GB", "a100"),
        ("L40S", "l40s"),
        ("h200", "h200"),
    ],
)
def test_gpu_aliases(alias: str, name: str) -> None:
    assert CAT.gpu(alias).name == name


def test_gpu_datasheet_figures() -> None:
    h100, h200, a100 = CAT.gpu("h100"), CAT.gpu("h200"), CAT.gpu("a100")
    assert (h100.hbm_gib, h100.hbm_bw_gbps, h100.bf16_tflops) == (80, 3350, 989)
    assert (h200.hbm_gib, h200.hbm_bw_gbps) == (141, 4800)
    assert (a100.hbm_bw_gbps, a100.bf16_tflops) == (2039, 312)
    for name in CAT.gpu_names:
        g = CAT.gpu(name)
        assert 0 < g.mem_efficiency <= 1 and 0 < g.compute_efficiency <= 1
        assert g.price_per_hour > 0


def test_unknown_names_list_known() -> None:
    with pytest.raises(UnknownHardware) as ei:
        CAT.gpu("tpu-v9")
    assert isinstance(ei.value, KeyError)
    assert "h100" in str(ei.value) and "tpu-v9" in str(ei.value)
    with pytest.raises(KeyError, match="llama-3-8b"):
        CAT.model("gpt-9")


def test_kv_capacity_rtx4090_matches_vllm() -> None:
    # vLLM 0.19 reported 2588 blocks x 16 = 41,408 tokens (RTX4090, Llama-3.1-8B, util 0.9).
    tokens = kv_capacity_tokens(CAT.gpu("rtx4090"), CAT.model("llama-3.1-8b"), gpu_memory_utilization=0.9)
    assert tokens == pytest.approx(41_408, rel=0.10)
    assert kv_capacity_tokens(CAT.gpu("rtx4090"), CAT.model("llama-3.1-8b"), block_size=16) % 16 == 0


def test_kv_capacity_tp_and_edge_cases() -> None:
    h100, m70 = CAT.gpu("h100"), CAT.model("llama-3-70b")
    assert kv_capacity_tokens(h100, m70, tp=1) == 0  # 141 GB of weights do not fit
    tp2, tp4 = kv_capacity_tokens(h100, m70, tp=2), kv_capacity_tokens(h100, m70, tp=4)
    assert 0 < tp2 < tp4
    assert tp4 > 2 * tp2  # weights take a smaller share per GPU
    # More ranks than KV heads: heads are replicated, capacity grows less than linearly.
    m8 = CAT.model("llama-3-8b")
    assert kv_capacity_tokens(h100, m8, tp=16) < 2 * kv_capacity_tokens(h100, m8, tp=8)
    with pytest.raises(ValueError):
        kv_capacity_tokens(h100, m8, tp=0)


def test_overrides_add_and_merge() -> None:
    cat = CAT.with_overrides(
        {
            "gpus": {
                "MI300X": {"hbm_gib": 192, "hbm_bw_gbps": 5300, "bf16_tflops": 1307, "price_per_hour": 3.5},
                "h100": {"price_per_hour": 1.99},
            },
            "models": {
                "my-model": {
                    **{k: 1 for k in ("layers", "heads", "kv_heads")},
                    "params_b": 1.0,
                    "hidden": 2048,
                    "intermediate": 5632,
                    "head_dim": 64,
                    "vocab": 32000,
                }
            },
        }
    )
    assert cat.gpu("mi300x").hbm_gib == 192
    assert cat.gpu("H100").price_per_hour == 1.99
    assert cat.gpu("h100").hbm_bw_gbps == 3350  # untouched fields kept
    assert cat.model("my-model").hidden == 2048
    assert CAT.gpu("h100").price_per_hour != 1.99  # the original is unchanged


def test_from_yaml_adds_gpu(tmp_path: Path) -> None:
    p = tmp_path / "cat.yaml"
    p.write_text(
        "gpus:\n  B200:\n    hbm_gib: 180\n    hbm_bw_gbps: 8000\n    bf16_tflops: 2250\n"
        "    price_per_hour: 5.5\n    interconnect_gbps: 1800\n    aliases: [nvidia-b200]\n"
    )
    cat = Catalog.from_yaml(p)
    assert cat.gpu("NVIDIA-B200").bf16_tflops == 2250
    assert isinstance(cat.gpu("b200"), GpuSpec)
    assert isinstance(cat.model("llama-3-8b"), ModelSpec)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpus:\n  h100:\n    hbm_gb: 80\n", "gpus.h100.hbm_gb"),
        ("gpus:\n  newgpu:\n    hbm_gib: 80\n", "gpus.newgpu.hbm_bw_gbps"),
        ("gpus:\n  h100:\n    mem_efficiency: 1.5\n", "gpus.h100.mem_efficiency"),
        ("models:\n  llama-3-8b:\n    layers: many\n", "models.llama-3-8b.layers"),
        ("tpus: {}\n", "tpus"),
        ("- a\n- b\n", "mapping"),
        ("gpus: [\n", "cannot read"),
    ],
)
def test_bad_yaml_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(CatalogError, match=None) as ei:
        Catalog.from_yaml(p)
    assert needle in str(ei.value)
