"""Model shapes from Hugging Face config.json files: dense, Mixtral, Qwen-MoE and DeepSeek-style MoE.

The configs are small dicts with the public architecture facts of each model (its published
config.json fields), written here; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenplane.sim.catalog import Catalog, CatalogError, ModelSpec
from tokenplane.sim.hf_config import HfConfigError, load_hf_config, model_fields

QWEN_MOE_CONFIG = Path(__file__).parents[2] / "examples" / "models" / "qwen1.5-moe-a2.7b.config.json"

LLAMA_31_8B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rope_theta": 500000.0,
}
QWEN25_05B: dict[str, Any] = {  # tied embeddings
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
MISTRAL_NEMO: dict[str, Any] = {  # head_dim given explicitly (not hidden / heads = 160)
    "model_type": "mistral",
    "hidden_size": 5120,
    "head_dim": 128,
    "intermediate_size": 14336,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 131072,
    "torch_dtype": "bfloat16",
}
MIXTRAL_8X7B: dict[str, Any] = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "torch_dtype": "bfloat16",
}
# Qwen1.5-MoE-A2.7B: the example config.json, shared with the step-time tests.
QWEN15_MOE_A27B: dict[str, Any] = load_hf_config(QWEN_MOE_CONFIG)
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 102400,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

DEEPSEEK_V3: dict[str, Any] = {  # q_lora_rank set, 3 dense layers, 256 routed experts + 1 shared
    **DEEPSEEK_V2_LITE,
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "q_lora_rank": 1536,
    "vocab_size": 129280,
}


def _spec(cfg: dict[str, Any], name: str = "m") -> ModelSpec:
    return ModelSpec(name=name, **model_fields(cfg))


def _active_b(m: ModelSpec) -> float:
    embed = m.lm_head_params * (1 if m.tie_embeddings else 2)
    return (m.active_matmul_params + embed) / 1e9


def test_llama_config_matches_the_builtin_entry() -> None:
    m = _spec(LLAMA_31_8B)
    builtin = Catalog.default().model("llama-3.1-8b")
    for f in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab", "dtype_bytes"):
        assert getattr(m, f) == getattr(builtin, f), f
    assert m.params_b == pytest.approx(builtin.params_b, rel=1e-4)  # 8.030 B from the shapes alone
    assert m.kv_bytes_per_token == builtin.kv_bytes_per_token == 131072
    assert not m.is_moe and m.active_matmul_params == m.shared_matmul_params


@pytest.mark.parametrize(
    ("cfg", "params_b", "active_b", "kv_bytes"),
    [
        (QWEN25_05B, 0.494, 0.494, 2 * 24 * 2 * 64 * 2),  # model card 0.49 B (biases left out)
        (MISTRAL_NEMO, 12.25, 12.25, 2 * 40 * 8 * 128 * 2),  # model card 12.2 B
        (MIXTRAL_8X7B, 46.70, 12.88, 2 * 32 * 8 * 128 * 2),  # 46.7 B total, 12.9 B active
        (QWEN15_MOE_A27B, 14.32, 2.69, 2 * 24 * 16 * 128 * 2),  # 14.3 B total, 2.7 B active
        (DEEPSEEK_V2_LITE, 15.71, 2.66, 27 * (512 + 64) * 2),  # 15.7 B total; MLA latent 576 values
        (DEEPSEEK_V3, 671.0, 37.55, 61 * (512 + 64) * 2),  # 671 B total, 37 B active
    ],
    ids=[
        "qwen2.5-0.5b",
        "mistral-nemo",
        "mixtral-8x7b",
        "qwen1.5-moe-a2.7b",
        "deepseek-v2-lite",
        "deepseek-v3",
    ],
)
def test_param_counts_and_kv_size_match_the_model_cards(
    cfg: dict[str, Any], params_b: float, active_b: float, kv_bytes: int
) -> None:
    m = _spec(cfg)
    assert m.params_b == pytest.approx(params_b, rel=0.01)
    assert _active_b(m) == pytest.approx(active_b, rel=0.02)
    assert m.kv_bytes_per_token == kv_bytes
    assert m.flops_per_token == pytest.approx(2 * (m.active_matmul_params + m.lm_head_params))


def test_moe_layer_layouts() -> None:
    mixtral = _spec(MIXTRAL_8X7B)
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.moe_layers) == (8, 2, 32)
    assert mixtral.expert_intermediate == 14336 and mixtral.shared_intermediate == 0
    ds = _spec(DEEPSEEK_V2_LITE)
    assert (ds.moe_layers, ds.dense_layers) == (26, 1)  # first_k_dense_replace: 1
    assert ds.shared_intermediate == 2 * 1408  # two shared experts
    assert ds.kv_heads == 1 and ds.head_dim == 192  # one latent, the same on every TP rank
    every_other = _spec({**DEEPSEEK_V2_LITE, "moe_layer_freq": 2})
    assert every_other.moe_layers == len([i for i in range(1, 27) if i % 2 == 0])
    qwen = _spec({**QWEN15_MOE_A27B, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    assert qwen.moe_layers == len([i for i in range(24) if (i + 1) % 2 == 0 and i != 1])
    assert qwen.params_b < _spec(QWEN15_MOE_A27B).params_b


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers"),
        ({"torch_dtype": "int3"}, "torch_dtype"),
    ],
)
def test_bad_configs_name_the_field(change: dict[str, Any], needle: str) -> None:
    cfg = {k: v for k, v in {**MIXTRAL_8X7B, **change}.items() if v is not None}
    with pytest.raises(HfConfigError, match=needle):
        model_fields(cfg)


def test_catalogue_file_takes_models_from_config_json(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "mixtral.json").write_text(json.dumps(MIXTRAL_8X7B))
    (tmp_path / "cat.yaml").write_text(
        "models:\n"
        "  my-mixtral:\n    hf_config: models/mixtral.json\n    aliases: [org/My-Mixtral]\n"
        f"  my-llama:\n    config: {json.dumps(LLAMA_31_8B)}\n"
        "  llama-3-8b:\n    hf_config: models/mixtral.json\n"  # replaces the built-in entry whole
    )
    cat = Catalog.from_yaml(tmp_path / "cat.yaml")
    assert cat.model("org/my-mixtral").experts == 8  # path resolved against the file's folder
    assert cat.model("my-llama").params_b == pytest.approx(8.03, rel=1e-3)
    assert cat.model("meta-llama/Meta-Llama-3-8B").experts == 8  # the alias still leads to it
    assert load_hf_config(models / "mixtral.json") == MIXTRAL_8X7B


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("hf_config: missing.json", "models.x.hf_config: cannot read"),
        ("hf_config: bad.json", "models.x.hf_config"),
        ("config: {hidden_size: 8}", "models.x.config: config.json has no 'num_hidden_layers'"),
        ("hf_config: bad.json\n    config: {}", "not both"),
        ("hf_config: ok.json\n    layer: 3", "models.x.layer"),
    ],
)
def test_catalogue_config_errors_name_entry_and_field(tmp_path: Path, entry: str, needle: str) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "ok.json").write_text(json.dumps(LLAMA_31_8B))
    (tmp_path / "cat.yaml").write_text(f"models:\n  x:\n    {entry}\n")
    with pytest.raises(CatalogError) as info:
        Catalog.from_yaml(tmp_path / "cat.yaml")
    assert needle in str(info.value)
    assert str(tmp_path / "cat.yaml") in str(info.value)
