"""The built-in catalogue entries: datasheet figures of the GPUs and Hugging Face shapes of the
models the twin knows by name (see :mod:`tokenplane.sim.catalog_specs` for the fields and where the
efficiency constants come from)."""

from __future__ import annotations

from tokenplane.sim.catalog_specs import (
    A100_COMPUTE_EFFICIENCY,
    A100_KNEE_SHARPNESS,
    A100_LAYER_OVERHEAD_S,
    A100_MEM_EFFICIENCY,
    A100_STEP_OVERHEAD_S,
    H100_COMPUTE_EFFICIENCY,
    H100_KNEE_SHARPNESS,
    H100_LAYER_OVERHEAD_S,
    H100_MEM_EFFICIENCY,
    H100_STEP_OVERHEAD_S,
    GpuSpec,
    ModelSpec,
)

# --- Built-in entries -----------------------------------------------------------------------------
# Datasheet figures: NVIDIA H100/H200/A100/L40S/RTX 4090 (Ada whitepaper)/RTX PRO 6000 Blackwell.
BUILTIN_GPUS: tuple[GpuSpec, ...] = (
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
        # --engine-fit ...). `tokenplane validate` on that same run is therefore a fit check. Refitted
        # (0.95 -> 0.90) once the twin reserved a whole prompt at admission and kept a preempted
        # request's blocks cached, as vLLM does: the old fit made up for the extra recompute.
        mem_efficiency=0.90,
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
BUILTIN_MODELS: tuple[ModelSpec, ...] = (
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
