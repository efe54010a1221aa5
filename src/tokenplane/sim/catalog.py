"""Hardware and model catalogue for the fleet simulator.

:class:`GpuSpec` holds datasheet figures plus three calibrated efficiency parameters that the
step-time model (:mod:`tokenplane.sim.perf_model`) turns into seconds; :class:`ModelSpec` holds a
dense decoder-only transformer's shape. :class:`Catalog` looks both up by name (case-insensitive,
with aliases such as ``meta-llama/Llama-3.1-8B``) and accepts user additions and overrides from a
mapping or a YAML file, validated by pydantic.

Calibration (re-run with ``python -m tokenplane.sim.calibrate --traces DIR``):

* H100 and A100 efficiencies are least-squares fits (relative error) of the non-attention step
  time against Vidur's per-operator profiles (microsoft/vidur ``data/profiling/``, MIT):
  ``gpu-profiles/h100_meta-llama_Llama-2-7b-hf_mlp.csv`` + ``..._Llama-2-70b-hf_mlp.csv`` for H100
  and ``gpu-profiles/a100_meta-llama_Meta-Llama-3-8B_mlp.csv`` + ``..._Meta-Llama-3-70B_mlp.csv``
  for A100, TP 1/2/4/8, every profiled token count (the TP>1 rows separate the per-layer kernel
  floor from the weight-read time, which both scale with the layer count at TP1).
* H200 reuses the H100 (same Hopper SM) efficiencies; L40S, RTX 4090 and RTX PRO 6000 have no
  profiles: they get the mean of the fitted H100/A100 efficiencies (an assumption, to be refined by
  the engine-level calibration against the vLLM measurements).
* ``layer_overhead_s`` is the per-layer floor of the many tiny kernels (norms, rope, adds at one
  token). ``step_overhead_s`` fits to ~0 on the profiles, which hold GPU kernel time only: the
  serving engine's CPU time per step (scheduling, sampling) is for the engine-level calibration
  against the vLLM measurements to set.

Prices are approximate on-demand per-GPU list prices of large neo-clouds (Lambda, RunPod, CoreWeave
public price pages, 2025); they are assumptions for cost comparisons, not quotes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tokenplane.sim.errors import CatalogError as CatalogError
from tokenplane.sim.errors import UnknownHardware as UnknownHardware

GIB = 1024**3

# --- Calibrated efficiency constants --------------------------------------------------------------
# Fitted by tokenplane.sim.calibrate (TP 1/2/4/8, every token count) on the Vidur profiles
# gpu-profiles/h100_meta-llama_Llama-2-{7b,70b}-hf_mlp.csv (H100_*) and
# gpu-profiles/a100_meta-llama_Meta-Llama-3-{8B,70B}_mlp.csv (A100_*); rms log error 7.8 % / 4.9 %.
H100_MEM_EFFICIENCY = 0.855  # achieved / 3350 GB/s
H100_COMPUTE_EFFICIENCY = 0.685  # achieved / 989 TF/s on the block GEMMs
H100_STEP_OVERHEAD_S = 0.0  # fixed per-step cost (fit: 0; the profiles hold no CPU time)
H100_LAYER_OVERHEAD_S = 3.95e-5  # fixed per-layer kernel floor
H100_KNEE_SHARPNESS = 2.0  # p of the p-norm smooth max of weight-read and GEMM time (fixed)
A100_MEM_EFFICIENCY = 0.738  # achieved / 2039 GB/s
A100_COMPUTE_EFFICIENCY = 0.718  # achieved / 312 TF/s
A100_STEP_OVERHEAD_S = 0.0
A100_LAYER_OVERHEAD_S = 4.24e-5
A100_KNEE_SHARPNESS = 2.0
# GPUs without profiles: mean of the H100 and A100 fits (assumption, see module docstring).
DEFAULT_MEM_EFFICIENCY = (H100_MEM_EFFICIENCY + A100_MEM_EFFICIENCY) / 2
DEFAULT_COMPUTE_EFFICIENCY = (H100_COMPUTE_EFFICIENCY + A100_COMPUTE_EFFICIENCY) / 2
DEFAULT_STEP_OVERHEAD_S = (H100_STEP_OVERHEAD_S + A100_STEP_OVERHEAD_S) / 2
DEFAULT_LAYER_OVERHEAD_S = (H100_LAYER_OVERHEAD_S + A100_LAYER_OVERHEAD_S) / 2
DEFAULT_KNEE_SHARPNESS = (H100_KNEE_SHARPNESS + A100_KNEE_SHARPNESS) / 2

# Memory that vLLM cannot give to the KV cache besides the weights (activation peak of a
# 2048-token profiling run, sampler buffers, CUDA graphs, non-torch allocations), per GPU.
# Chosen so that RTX 4090 (24 GiB) + Llama-3.1-8B at gpu_memory_utilization 0.9 gives 41,307 KV
# tokens against the 2588 blocks x 16 = 41,408 that vLLM 0.19 reported
# (vllm-measurements/RTX4090_Llama-3.1-8B/meta.json): -0.2 %.
DEFAULT_ACTIVATION_RESERVE_GIB = 1.6


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator: datasheet figures plus calibrated efficiencies.

    ``interconnect_gbps`` is the total (bidirectional) GPU-to-GPU bandwidth: NVLink where present,
    otherwise the PCIe slot; ``None`` means unknown (TP is then costed at PCIe 4.0 x16).
    ``interconnect`` names the link kind and ``interconnect_latency_us`` the fixed cost of one
    collective on it (``None``: see :func:`tokenplane.sim.perf_model.collective_latency_s`).
    """

    name: str
    hbm_gib: float
    hbm_bw_gbps: float
    bf16_tflops: float
    price_per_hour: float
    interconnect_gbps: float | None = None
    interconnect: str = "pcie"  # "nvlink" or "pcie": the link tensor/expert-parallel traffic crosses
    interconnect_latency_us: float | None = None  # per collective; None: the kind's default
    mem_efficiency: float = DEFAULT_MEM_EFFICIENCY
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    layer_overhead_s: float = DEFAULT_LAYER_OVERHEAD_S
    knee_sharpness: float = DEFAULT_KNEE_SHARPNESS
    aliases: tuple[str, ...] = ()

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * GIB

    @property
    def effective_bw_bytes_s(self) -> float:
        return self.hbm_bw_gbps * 1e9 * self.mem_efficiency

    @property
    def effective_flops(self) -> float:
        return self.bf16_tflops * 1e12 * self.compute_efficiency


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer: Llama-style (GQA attention, gated MLP, RMSNorm), optionally with
    mixture-of-experts layers and multi-head latent attention (MLA).

    Dense models leave the MoE and MLA fields at 0. A MoE model has ``moe_layers`` layers whose MLP
    is ``experts`` routed experts (gated MLPs of width ``expert_intermediate``), of which each token
    uses ``experts_per_token``, plus an always-active shared expert of total width
    ``shared_intermediate`` (0: none); its other ``layers - moe_layers`` layers have a dense MLP of
    width ``intermediate``. ``attn_params`` (0: computed from the GQA shape) overrides one layer's
    attention projection weights, and ``kv_dim`` (0: ``2 x kv_heads x head_dim``) the values cached
    per token and layer; MLA caches ``kv_lora_rank + qk_rope_head_dim`` values per token and layer,
    the same latent on every tensor-parallel rank (``kv_heads`` is then 1).
    """

    name: str
    params_b: float
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int = 2
    tie_embeddings: bool = False
    aliases: tuple[str, ...] = field(default=())
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    moe_layers: int = 0
    attn_params: int = 0
    kv_dim: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.moe_layers > 0

    @property
    def weight_bytes(self) -> float:
        """All weights as stored (embedding and LM head included; every expert)."""
        return self.params_b * 1e9 * self.dtype_bytes

    @property
    def kv_values_per_layer(self) -> int:
        """Values cached per token and layer: K and V of each KV head, or MLA's latent."""
        return self.kv_dim or 2 * self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache of every layer for one token: 2 x layers x kv_heads x head_dim x dtype_bytes
        (layers x kv_dim x dtype_bytes for MLA)."""
        return self.layers * self.kv_values_per_layer * self.dtype_bytes

    @property
    def attn_matmul_params(self) -> int:
        """Weights of one block's attention projections (q, k, v, o for GQA)."""
        if self.attn_params:
            return self.attn_params
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers if self.is_moe else self.layers

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def shared_matmul_params(self) -> int:
        """Weights every step reads whatever the routing: attention of every layer, the dense
        layers' MLPs, and the MoE layers' shared expert and router."""
        dense_mlp = 3 * self.hidden * self.intermediate
        out = self.layers * self.attn_matmul_params + self.dense_layers * dense_mlp
        if self.is_moe:
            out += self.moe_layers * (3 * self.hidden * self.shared_intermediate + self.hidden * self.experts)
        return out

    @property
    def expert_matmul_params(self) -> int:
        """All routed experts' weights (0 for a dense model)."""
        return self.moe_layers * self.experts * self.expert_params if self.is_moe else 0

    @property
    def active_matmul_params(self) -> int:
        """Block GEMM weights one token goes through: shared weights plus its routed experts."""
        routed = self.moe_layers * self.experts_per_token * self.expert_params if self.is_moe else 0
        return self.shared_matmul_params + routed

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one dense block's GEMMs: q, k, v, o projections and the gated MLP (for a MoE
        model, the per-layer mean of the active weights)."""
        if self.is_moe:
            return self.active_matmul_params // self.layers
        return self.attn_matmul_params + 3 * self.hidden * self.intermediate

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def flops_per_token(self) -> float:
        """Non-attention forward FLOPs of one token through every block and the LM head
        (≈ 2 x active params)."""
        return 2.0 * (self.active_matmul_params + self.lm_head_params)

    @property
    def attn_flops_per_pair(self) -> float:
        """Attention FLOPs per (query, key) pair: QK^T and PV, 2 FLOPs per MAC, every layer."""
        return 4.0 * self.layers * self.heads * self.head_dim


# --- Built-in entries -----------------------------------------------------------------------------
# Datasheet figures: NVIDIA H100/H200/A100/L40S/RTX 4090 (Ada whitepaper)/RTX PRO 6000 Blackwell.
_BUILTIN_GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="h100",
        hbm_gib=80,
        hbm_bw_gbps=3350,
        bf16_tflops=989,
        price_per_hour=2.99,  # Lambda on-demand H100 SXM, 2025 (assumption)
        interconnect_gbps=900,  # NVLink 4
        interconnect="nvlink",
        mem_efficiency=H100_MEM_EFFICIENCY,
        compute_efficiency=H100_COMPUTE_EFFICIENCY,
        step_overhead_s=H100_STEP_OVERHEAD_S,
        layer_overhead_s=H100_LAYER_OVERHEAD_S,
        knee_sharpness=H100_KNEE_SHARPNESS,
        aliases=("h100-sxm", "h100-sxm5", "h100-80gb", "nvidia h100 80gb hbm3"),
    ),
    GpuSpec(
        name="h200",
        hbm_gib=141,  # 141 GB HBM3e (the datasheet's GB; taken as GiB, <5 % difference)
        hbm_bw_gbps=4800,
        bf16_tflops=989,
        price_per_hour=3.79,  # typical neo-cloud on-demand H200 SXM, 2025 (assumption)
        interconnect_gbps=900,
        interconnect="nvlink",
        mem_efficiency=H100_MEM_EFFICIENCY,  # same Hopper SM: H100 fit reused
        compute_efficiency=H100_COMPUTE_EFFICIENCY,
        step_overhead_s=H100_STEP_OVERHEAD_S,
        layer_overhead_s=H100_LAYER_OVERHEAD_S,
        knee_sharpness=H100_KNEE_SHARPNESS,
        aliases=("h200-sxm", "nvidia h200"),
    ),
    GpuSpec(
        name="a100",
        hbm_gib=80,
        hbm_bw_gbps=2039,
        bf16_tflops=312,
        price_per_hour=1.79,  # Lambda on-demand A100 80GB SXM, 2025 (assumption)
        interconnect_gbps=600,  # NVLink 3
        interconnect="nvlink",
        mem_efficiency=A100_MEM_EFFICIENCY,
        compute_efficiency=A100_COMPUTE_EFFICIENCY,
        step_overhead_s=A100_STEP_OVERHEAD_S,
        layer_overhead_s=A100_LAYER_OVERHEAD_S,
        knee_sharpness=A100_KNEE_SHARPNESS,
        aliases=("a100-80gb", "a100-sxm", "a100-sxm4-80gb", "nvidia a100-sxm4-80gb"),
    ),
    GpuSpec(
        name="l40s",
        hbm_gib=48,
        hbm_bw_gbps=864,
        bf16_tflops=362,  # dense BF16 (733 with sparsity)
        price_per_hour=1.03,  # typical neo-cloud on-demand L40S, 2025 (assumption)
        interconnect_gbps=64,  # PCIe 4.0 x16, no NVLink
        aliases=("nvidia l40s",),
    ),
    GpuSpec(
        name="rtx4090",
        hbm_gib=24,
        hbm_bw_gbps=1008,
        bf16_tflops=165.2,  # dense BF16 with FP32 accumulate (Ada whitepaper)
        price_per_hour=0.69,  # RunPod on-demand RTX 4090, 2025 (assumption)
        # No Vidur profile exists for this GPU: efficiencies grid-fitted to the real vLLM 0.19 run
        # in vllm-measurements/RTX4090_Llama-3.1-8B (python -m tokenplane.sim.calibrate
        # --engine-fit ...). `tokenplane validate` on that same run is therefore a fit check.
        mem_efficiency=0.95,
        compute_efficiency=0.85,
        interconnect_gbps=64,  # PCIe 4.0 x16, no NVLink
        aliases=("rtx-4090", "rtx 4090", "geforce rtx 4090", "nvidia geforce rtx 4090"),
    ),
    GpuSpec(
        name="rtxpro6000",
        hbm_gib=96,
        # 1597 GB/s as in vllm-measurements/RTXPRO6000_Llama-3.1-8B/config.json (the Server
        # Edition figure; the Workstation Edition datasheet says 1792 GB/s).
        hbm_bw_gbps=1597,
        # Assumption: ~504 dense BF16 TF/s (NVIDIA quotes ~4 PFLOPS sparse FP4 = 8x dense BF16).
        bf16_tflops=504,
        price_per_hour=1.79,  # typical neo-cloud on-demand RTX PRO 6000 Blackwell, 2025 (assumption)
        # Grid-fitted to vllm-measurements/RTXPRO6000_Llama-3.1-8B (see RTX 4090 above); of the
        # near-equal optima, the one closest to the H100/A100 profile fits.
        mem_efficiency=0.85,
        compute_efficiency=0.70,
        interconnect_gbps=128,  # PCIe 5.0 x16, no NVLink
        aliases=(
            "rtx-pro-6000",
            "rtx pro 6000",
            "rtxpro6000-blackwell",
            "nvidia rtx pro 6000 blackwell server edition",
        ),
    ),
)

# Shapes from the models' Hugging Face config.json; params_b from the model cards.
_BUILTIN_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="llama-3-8b",
        params_b=8.030261248,
        layers=32,
        hidden=4096,
        intermediate=14336,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        aliases=("meta-llama/meta-llama-3-8b", "meta-llama-3-8b", "llama3-8b"),
    ),
    ModelSpec(
        name="llama-3.1-8b",
        params_b=8.030261248,
        layers=32,
        hidden=4096,
        intermediate=14336,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        aliases=("meta-llama/llama-3.1-8b", "meta-llama-3.1-8b", "llama3.1-8b"),
    ),
    ModelSpec(
        name="llama-3-70b",
        params_b=70.553706496,
        layers=80,
        hidden=8192,
        intermediate=28672,
        heads=64,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        aliases=("meta-llama/meta-llama-3-70b", "meta-llama-3-70b", "llama-3.1-70b", "llama3-70b"),
    ),
    ModelSpec(
        name="llama-2-7b",
        params_b=6.738415616,
        layers=32,
        hidden=4096,
        intermediate=11008,
        heads=32,
        kv_heads=32,
        head_dim=128,
        vocab=32000,
        aliases=("meta-llama/llama-2-7b-hf", "llama-2-7b-hf", "llama2-7b"),
    ),
    ModelSpec(
        name="llama-2-70b",
        params_b=68.976648192,
        layers=80,
        hidden=8192,
        intermediate=28672,
        heads=64,
        kv_heads=8,
        head_dim=128,
        vocab=32000,
        aliases=("meta-llama/llama-2-70b-hf", "llama-2-70b-hf", "llama2-70b"),
    ),
    ModelSpec(
        name="qwen2.5-7b",
        params_b=7.615616512,
        layers=28,
        hidden=3584,
        intermediate=18944,
        heads=28,
        kv_heads=4,
        head_dim=128,
        vocab=152064,
        aliases=("qwen/qwen2.5-7b", "qwen/qwen2.5-7b-instruct", "qwen2.5-7b-instruct"),
    ),
    ModelSpec(
        name="tiny",
        params_b=0.00227,  # 2 x 0.725M block GEMM params + 2 x 0.41M embedding/LM head
        layers=2,
        hidden=256,
        intermediate=688,
        heads=4,
        kv_heads=2,
        head_dim=64,
        vocab=1600,
        aliases=("tiny-test", "tiny-llama-test"),
    ),
)


# --- Name normalisation ---------------------------------------------------------------------------
def _model_key(name: str) -> str:
    return name.strip().lower()


def _gpu_key(name: str) -> str:
    key = re.sub(r"[\s_\-]+", "", name.strip().lower())
    for prefix in ("nvidia", "geforce"):
        key = key.removeprefix(prefix)
    return key


def _model_candidates(name: str) -> list[str]:
    key = _model_key(name)
    out = [key]
    tail = key.rsplit("/", 1)[-1]
    out.append(tail)
    for suffix in ("-hf", "-instruct", "-chat", "-chat-hf"):
        if tail.endswith(suffix):
            out.append(tail.removesuffix(suffix))
    return out


# --- Config schema (pydantic) ---------------------------------------------------------------------
class GpuConfig(BaseModel):
    """A GPU entry in user configuration; every field optional when overriding a known GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hbm_gib: float = Field(gt=0)
    hbm_bw_gbps: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    price_per_hour: float = Field(ge=0)
    interconnect_gbps: float | None = Field(default=None, gt=0)
    interconnect: Literal["nvlink", "pcie"] = "pcie"
    interconnect_latency_us: float | None = Field(default=None, gt=0)
    mem_efficiency: float = Field(default=DEFAULT_MEM_EFFICIENCY, gt=0, le=1)
    compute_efficiency: float = Field(default=DEFAULT_COMPUTE_EFFICIENCY, gt=0, le=1)
    step_overhead_s: float = Field(default=DEFAULT_STEP_OVERHEAD_S, ge=0)
    layer_overhead_s: float = Field(default=DEFAULT_LAYER_OVERHEAD_S, ge=0)
    knee_sharpness: float = Field(default=DEFAULT_KNEE_SHARPNESS, ge=1)
    aliases: tuple[str, ...] = ()


class ModelConfig(BaseModel):
    """A model entry in user configuration; every field optional when overriding a known model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    params_b: float = Field(gt=0)
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab: int = Field(gt=0)
    dtype_bytes: int = Field(default=2, gt=0)
    tie_embeddings: bool = False
    aliases: tuple[str, ...] = ()
    experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    expert_intermediate: int = Field(default=0, ge=0)
    shared_intermediate: int = Field(default=0, ge=0)
    moe_layers: int = Field(default=0, ge=0)
    attn_params: int = Field(default=0, ge=0)
    kv_dim: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check_moe(self) -> ModelConfig:
        if self.experts or self.moe_layers:
            if not 0 < self.moe_layers <= self.layers:
                raise ValueError(f"moe_layers must be in 1..layers ({self.layers}) for a MoE model")
            if not 0 < self.experts_per_token <= self.experts:
                raise ValueError(f"experts_per_token must be in 1..experts ({self.experts})")
            if self.expert_intermediate <= 0:
                raise ValueError("expert_intermediate must be > 0 for a MoE model")
        return self


class CatalogConfig(BaseModel):
    """Top level of a catalogue YAML file: ``gpus:`` and ``models:`` keyed by name."""

    model_config = ConfigDict(extra="forbid")

    gpus: dict[str, dict[str, Any]] = Field(default_factory=dict)
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)


def _format_validation_error(prefix: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        parts.append(f"{loc}: {e['msg']}")
    return "invalid catalogue entry: " + "; ".join(parts)


def _hf_fields(where: str, fields: dict[str, Any], base_dir: str | Path | None) -> dict[str, Any] | None:
    """Pop ``hf_config``/``config`` from a model entry and return the shape they give (or None)."""
    from tokenplane.sim.hf_config import HfConfigError, load_hf_config, model_fields

    path = fields.pop("hf_config", None)
    inline = fields.pop("config", None)
    if path is None and inline is None:
        return None
    if path is not None and inline is not None:
        raise CatalogError(f"invalid catalogue entry: {where}: give hf_config or config, not both")
    try:
        if path is not None:
            if not isinstance(path, str):
                raise HfConfigError("hf_config must be a path to a config.json")
            file = Path(path)
            if not file.is_absolute() and base_dir is not None:
                file = Path(base_dir) / file
            return model_fields(load_hf_config(file))
        return model_fields(inline)
    except HfConfigError as e:
        key = "hf_config" if path is not None else "config"
        raise CatalogError(f"invalid catalogue entry: {where}.{key}: {e}") from e


class Catalog:
    """Immutable name → :class:`GpuSpec` / :class:`ModelSpec` lookup with aliases."""

    def __init__(self, gpus: Iterable[GpuSpec], models: Iterable[ModelSpec]) -> None:
        self._gpus: dict[str, GpuSpec] = {}
        self._models: dict[str, ModelSpec] = {}
        self._gpu_alias: dict[str, str] = {}
        self._model_alias: dict[str, str] = {}
        for g in gpus:
            self._gpus[g.name] = g
        for m in models:
            self._models[m.name] = m
        for g in self._gpus.values():
            for a in (g.name, *g.aliases):
                self._gpu_alias[_gpu_key(a)] = g.name
        for m in self._models.values():
            for a in (m.name, *m.aliases):
                self._model_alias[_model_key(a)] = m.name

    # -- construction --
    @classmethod
    def default(cls) -> Catalog:
        return cls(_BUILTIN_GPUS, _BUILTIN_MODELS)

    def with_overrides(self, mapping: Mapping[str, Any], *, base_dir: str | Path | None = None) -> Catalog:
        """A new catalogue with ``mapping['gpus']`` / ``mapping['models']`` added or merged in.

        An entry whose name matches a known GPU/model (aliases included) overrides only the fields
        it gives; a new name must give every required field. A GPU entry with ``replace: true`` is
        defined from its own figures only (a known GPU's calibrated efficiencies are then not
        inherited: they default to the documented means; its name and aliases are kept). A model
        entry with ``hf_config: PATH`` (a Hugging Face config.json; relative to ``base_dir``,
        default the working directory) or ``config: {...}`` (the same fields inline) takes its
        whole shape from that config (see :mod:`tokenplane.sim.hf_config`; a known model's name
        and aliases are kept); other fields it gives (``aliases``, ``params_b``...) are applied on
        top. Raises :class:`CatalogError` naming the offending field.
        """
        try:
            cfg = CatalogConfig.model_validate(mapping)
        except ValidationError as e:
            raise CatalogError(_format_validation_error("", e)) from e
        gpus = dict(self._gpus)
        models = dict(self._models)
        for name, raw in cfg.gpus.items():
            fields = dict(raw or {})
            replace = fields.pop("replace", False)
            if not isinstance(replace, bool):
                raise CatalogError(f"invalid catalogue entry: gpus.{name}.replace: must be true or false")
            existing = self._find_gpu(name)
            base: dict[str, Any] = {}
            if existing is not None:
                if not replace:
                    base = dataclasses.asdict(existing)
                    base.pop("name")
                else:  # its own figures only; the known names still lead to it
                    base = {"aliases": existing.aliases}
                gpus.pop(existing.name)
            try:
                gc = GpuConfig.model_validate({**base, **fields})
            except ValidationError as e:
                raise CatalogError(_format_validation_error(f"gpus.{name}", e)) from e
            new_name = existing.name if existing is not None else _gpu_key(name)
            gpus[new_name] = GpuSpec(name=new_name, **gc.model_dump())
        for name, raw in cfg.models.items():
            fields = dict(raw or {})
            existing_m = self._find_model(name)
            base = {}
            hf = _hf_fields(f"models.{name}", fields, base_dir)
            if existing_m is not None:
                if hf is None:
                    base = dataclasses.asdict(existing_m)
                    base.pop("name")
                else:  # a whole new shape; the known names still lead to it
                    base = {"aliases": existing_m.aliases}
                models.pop(existing_m.name)
            try:
                mc = ModelConfig.model_validate({**base, **(hf or {}), **fields})
            except ValidationError as e:
                raise CatalogError(_format_validation_error(f"models.{name}", e)) from e
            new_name = existing_m.name if existing_m is not None else _model_key(name)
            models[new_name] = ModelSpec(name=new_name, **mc.model_dump())
        return Catalog(gpus.values(), models.values())

    @classmethod
    def from_yaml(cls, path: str | Path, base: Catalog | None = None) -> Catalog:
        """The default (or ``base``) catalogue with the YAML file's ``gpus:``/``models:`` merged in."""
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise CatalogError(f"cannot read catalogue file {p}: {e}") from e
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise CatalogError(f"catalogue file {p}: top level must be a mapping with gpus:/models:")
        try:
            return (base or cls.default()).with_overrides(data, base_dir=p.parent)
        except CatalogError as e:
            raise CatalogError(f"{p}: {e}") from e

    # -- lookup --
    def _find_gpu(self, name: str) -> GpuSpec | None:
        key = self._gpu_alias.get(_gpu_key(name))
        return None if key is None else self._gpus[key]

    def _find_model(self, name: str) -> ModelSpec | None:
        for cand in _model_candidates(name):
            key = self._model_alias.get(cand)
            if key is not None:
                return self._models[key]
        return None

    def gpu(self, name: str | GpuSpec) -> GpuSpec:
        if isinstance(name, GpuSpec):
            return name
        g = self._find_gpu(name)
        if g is None:
            raise UnknownHardware("gpu", name, self._gpus)
        return g

    def model(self, name: str | ModelSpec) -> ModelSpec:
        if isinstance(name, ModelSpec):
            return name
        m = self._find_model(name)
        if m is None:
            raise UnknownHardware("model", name, self._models)
        return m

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._gpus))

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._models))


def kv_capacity_tokens(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB,
    block_size: int | None = None,
) -> int:
    """KV-cache capacity in tokens of one replica spread over ``tp`` GPUs, as vLLM sizes it.

    Per GPU, ``hbm x utilization - weights / tp - activation reserve`` bytes go to the KV cache, and
    each rank holds a 1/tp share of every token's KV (``1/kv_heads`` when ``tp > kv_heads``: KV
    heads are then replicated). Rounded down to whole ``block_size`` blocks when given; never
    negative.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    per_rank_free = gpu.hbm_bytes * gpu_memory_utilization - model.weight_bytes / tp
    per_rank_free -= activation_reserve_gib * GIB
    if per_rank_free <= 0:
        return 0
    kv_per_token_per_rank = model.kv_bytes_per_token * max(1.0, tp / model.kv_heads) / tp
    tokens = int(per_rank_free // kv_per_token_per_rank)
    if block_size:
        tokens -= tokens % block_size
    return tokens
