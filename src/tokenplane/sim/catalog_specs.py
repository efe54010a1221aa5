"""GPU and model specifications for the fleet simulator: :class:`GpuSpec` (datasheet figures plus
three calibrated efficiencies) and :class:`ModelSpec` (a decoder-only transformer's shape), the
calibrated efficiency constants, and how names are normalised for lookup.

Calibration (re-run with ``python -m tokenplane.sim.calibrate --traces DIR``):

* H100 and A100 efficiencies are least-squares fits (relative error) of the non-attention step
  time against Vidur's per-operator profiles (microsoft/vidur ``data/profiling/``, MIT):
  ``gpu-profiles/h100_meta-llama_Llama-2-7b-hf_mlp.csv`` + ``..._Llama-2-70b-hf_mlp.csv`` for H100
  and ``gpu-profiles/a100_meta-llama_Meta-Llama-3-8B_mlp.csv`` + ``..._Meta-Llama-3-70B_mlp.csv``
  for A100, TP 1/2/4/8, every profiled token count (the TP>1 rows separate the per-layer kernel
  floor from the weight-read time, which both scale with the layer count at TP1).
* H200 reuses the H100 (same Hopper SM) efficiencies; L40S, RTX 4090 and RTX PRO 6000 have no
  profiles: they get the mean of the fitted H100/A100 efficiencies (an assumption, to be refined by
  the engine-level calibration against the vLLM measurements). A catalogue entry defined from its
  own figures that states its ``memory_type`` gets a memory efficiency scaled from that mean by
  published bandwidth-bound benchmark fractions instead (:mod:`tokenplane.sim.memory_tech`).
* ``layer_overhead_s`` is the per-layer floor of the many tiny kernels (norms, rope, adds at one
  token). ``step_overhead_s`` fits to ~0 on the profiles, which hold GPU kernel time only: the
  serving engine's CPU time per step (scheduling, sampling) is for the engine-level calibration
  against the vLLM measurements to set.

Prices are approximate on-demand per-GPU list prices of large neo-clouds (Lambda, RunPod, CoreWeave
public price pages, 2025); they are assumptions for cost comparisons, not quotes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
# Decode attention's KV reads relative to the weight reads' ``mem_efficiency`` (1: the same fraction
# of the datasheet bandwidth, the model before this term). Left at 1 because no shared profile
# measures it. Public evidence that paged decode attention reads below the weight GEMMs' fraction:
# FlashAttention-2 paged batch decode on an H100 SXM, Llama-3-70B shape, 64 sequences of 128 and
# 256 tokens (microsoft/onnxruntime PR 21414, nvbench): about 13 us per call plus its bytes at
# ~2.3 TB/s (0.68 of 3.35 TB/s, ~0.8 of the H100 weight-read fit) at those short lengths, while
# FlashInfer's blog (2024-02-02) reports close to 100 % for long single-sequence decodes. The
# figure depends on the kernel, the sequence lengths and the GPU; a catalogue entry may set a
# measured one. With the shared vLLM runs, no one value brings both within 5 % at the documented
# mean weight efficiency (README, "Any model, any GPU").
DEFAULT_KV_READ_EFFICIENCY = 1.0

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
    # Decode attention (paged KV reads) reaches this fraction of what the weight reads reach
    # (``mem_efficiency``): a step's KV bytes cost kv_bytes / (hbm_bw * mem_efficiency * this).
    kv_read_efficiency: float = DEFAULT_KV_READ_EFFICIENCY
    # The memory technology ("gddr6x", "hbm3"...; None: not stated). A catalogue entry that gives
    # it without a mem_efficiency takes its prior from it (tokenplane.sim.memory_tech).
    memory_type: str | None = None
    # Measured best dense BF16 matmul TFLOP/s (None: not stated). A catalogue entry that gives it
    # without a compute_efficiency takes its prior from it (tokenplane.sim.matmul_prior).
    matmul_tflops: float | None = None
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


# --- Name normalisation ---------------------------------------------------------------------------
def model_key(name: str) -> str:
    return name.strip().lower()


def gpu_key(name: str) -> str:
    key = re.sub(r"[\s_\-]+", "", name.strip().lower())
    for prefix in ("nvidia", "geforce"):
        key = key.removeprefix(prefix)
    return key


def model_candidates(name: str) -> list[str]:
    key = model_key(name)
    out = [key]
    tail = key.rsplit("/", 1)[-1]
    out.append(tail)
    for suffix in ("-hf", "-instruct", "-chat", "-chat-hf"):
        if tail.endswith(suffix):
            out.append(tail.removesuffix(suffix))
    return out
