"""A model's shape from its Hugging Face ``config.json``: dense or mixture-of-experts.

Reads the fields the step-time model needs and returns them as :class:`~tokenplane.sim.catalog.
ModelSpec` keyword arguments, so a catalogue entry can be just ``hf_config: path/to/config.json``
(or the same mapping inline as ``config:``). Understood families:

* dense Llama / Mistral / Qwen2 (and anything with their field names): ``hidden_size``,
  ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
  ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``, ``torch_dtype``;
* Mixtral: ``num_local_experts`` experts of width ``intermediate_size`` in every layer,
  ``num_experts_per_tok`` per token;
* Qwen-MoE: ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
  ``shared_expert_intermediate_size``, ``decoder_sparse_step``, ``mlp_only_layers``;
* DeepSeek-V2/V3-style: ``n_routed_experts``, ``n_shared_experts`` (each ``moe_intermediate_size``
  wide), ``first_k_dense_replace``, ``moe_layer_freq``; and multi-head latent attention when
  ``kv_lora_rank`` is set (``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim``): the KV cache holds ``kv_lora_rank + qk_rope_head_dim`` values per token and layer.

The parameter count is computed from the shapes (embedding, LM head unless tied, attention and MLP
projections, routers, RMSNorm weights); biases (Qwen2's q/k/v) and Qwen-MoE's one-column shared
expert gate are left out (<0.1 % of the weights).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


class HfConfigError(ValueError):
    """A config.json that cannot be read or lacks a field the step-time model needs."""


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path`` (raises :class:`HfConfigError` naming the file)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HfConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise HfConfigError(f"{p}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise HfConfigError(f"{p}: expected a JSON object")
    return data


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise HfConfigError(f"config.json has no {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HfConfigError(f"config.json {key!r} must be a non-negative integer, got {value!r}")
    return value


def _moe_layer_flags(cfg: Mapping[str, Any], layers: int) -> tuple[int, list[bool]]:
    """(routed experts, which layers are MoE) from whichever family's fields are present."""
    if cfg.get("n_routed_experts"):  # DeepSeek-V2/V3
        experts = _int(cfg, "n_routed_experts")
        first_dense = _int(cfg, "first_k_dense_replace", 0)
        freq = max(1, _int(cfg, "moe_layer_freq", 1))
        return experts, [i >= first_dense and i % freq == 0 for i in range(layers)]
    if cfg.get("num_local_experts"):  # Mixtral: every layer
        return _int(cfg, "num_local_experts"), [True] * layers
    if cfg.get("num_experts"):  # Qwen-MoE
        experts = _int(cfg, "num_experts")
        step = max(1, _int(cfg, "decoder_sparse_step", 1))
        dense_only = set(cfg.get("mlp_only_layers") or [])
        return experts, [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]
    return 0, [False] * layers


def model_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`ModelSpec` keyword arguments (all but ``name`` and ``aliases``) from a config.json."""
    if not isinstance(cfg, Mapping):
        raise HfConfigError("a model config must be a mapping (the contents of config.json)")
    hidden = _int(cfg, "hidden_size")
    layers = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    vocab = _int(cfg, "vocab_size")
    if min(hidden, layers, heads, vocab) <= 0:
        raise HfConfigError(
            "config.json hidden_size, num_hidden_layers, num_attention_heads, vocab_size must be > 0"
        )
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    head_dim = _int(cfg, "head_dim", hidden // heads)
    dtype = str(cfg.get("torch_dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise HfConfigError(f"config.json torch_dtype {dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
    tie = bool(cfg.get("tie_word_embeddings", False))

    experts, moe_flags = _moe_layer_flags(cfg, layers)
    moe_layers = sum(moe_flags) if experts else 0
    fields: dict[str, Any] = {}
    if moe_layers:
        k = _int(cfg, "num_experts_per_tok")
        if not 0 < k <= experts:
            raise HfConfigError(f"config.json num_experts_per_tok must be in 1..{experts}, got {k}")
        if cfg.get("num_local_experts"):  # Mixtral's experts are intermediate_size wide
            expert_width = _int(cfg, "intermediate_size")
            shared = 0
        else:
            expert_width = _int(cfg, "moe_intermediate_size")
            if cfg.get("n_routed_experts"):
                shared = _int(cfg, "n_shared_experts", 0) * expert_width
            else:
                shared = _int(cfg, "shared_expert_intermediate_size", 0)
        fields.update(
            experts=experts,
            experts_per_token=k,
            expert_intermediate=expert_width,
            shared_intermediate=shared,
            moe_layers=moe_layers,
        )
    # The dense MLP width of the non-MoE layers (for Mixtral, unused: every layer is MoE).
    intermediate = _int(cfg, "intermediate_size", fields.get("expert_intermediate", 0))

    attn_params = 0
    kv_dim = 0
    if cfg.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek-V2/V3)
        kv_lora = _int(cfg, "kv_lora_rank")
        rope = _int(cfg, "qk_rope_head_dim")
        nope = _int(cfg, "qk_nope_head_dim")
        v_dim = _int(cfg, "v_head_dim", nope)
        q_lora = _int(cfg, "q_lora_rank", 0)
        q_out = heads * (nope + rope)
        q = hidden * q_lora + q_lora * q_out if q_lora else hidden * q_out
        attn_params = (
            q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
        )
        kv_dim = kv_lora + rope
        head_dim = nope + rope
        kv_heads = 1  # one latent per token, the same on every tensor-parallel rank
    if kv_heads <= 0 or head_dim <= 0:
        raise HfConfigError("config.json num_key_value_heads and head_dim must be > 0")

    fields.update(
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        dtype_bytes=_DTYPE_BYTES[dtype],
        tie_embeddings=tie,
        attn_params=attn_params,
        kv_dim=kv_dim,
    )
    fields["params_b"] = _param_count(fields) / 1e9
    return fields


def _param_count(f: Mapping[str, Any]) -> int:
    """Every weight: embeddings, LM head (unless tied), blocks, routers, RMSNorms."""
    h = f["hidden"]
    if f["attn_params"]:
        attn = f["attn_params"]
    else:
        attn = h * f["heads"] * f["head_dim"] * 2 + 2 * h * f["kv_heads"] * f["head_dim"]
    moe_layers = f.get("moe_layers", 0)
    dense_layers = f["layers"] - moe_layers
    total = f["layers"] * (attn + 2 * h) + h  # two RMSNorms per block, one final
    total += dense_layers * 3 * h * f["intermediate"]
    if moe_layers:
        per_moe = f["experts"] * 3 * h * f["expert_intermediate"] + 3 * h * f["shared_intermediate"]
        total += moe_layers * (per_moe + h * f["experts"])
    total += f["vocab"] * h * (1 if f["tie_embeddings"] else 2)
    return int(total)
