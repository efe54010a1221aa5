"""Roofline step-time model of one engine replica (one model on ``tp`` GPUs).

One engine step batches ``num_tokens`` tokens (prefill chunk tokens plus one per decoding
sequence). Its time is::

    step_time = linear_time(num_tokens)                      # GEMMs, elementwise ops, TP all-reduce
              + decode_kv_s_per_token * decode_context_tokens # decode attention: KV reads
              + prefill_s_per_pair * prefill_attn_pairs       # prefill attention: QK^T and PV FLOPs

``linear_time`` is a p-norm smooth maximum of the weight-read time (memory-bound: flat in
``num_tokens``) and the GEMM time (compute-bound: linear), plus the elementwise kernels' activation
traffic, the tensor-parallel all-reduces (two per layer) and a fixed per-step overhead. The
efficiencies, overhead and knee sharpness come from :class:`~tokenplane.sim.catalog.GpuSpec`
(calibrated by :mod:`tokenplane.sim.calibrate`).
"""

from __future__ import annotations

from tokenplane.sim.catalog import GpuSpec, ModelSpec

# All-reduce cost model t(bytes, k) = latency + 2 (k - 1) / k * bytes / bus_bw with
# bus_bw = ALLREDUCE_BUS_EFFICIENCY * interconnect_gbps / 2 (the per-direction link bandwidth).
# Fitted by tokenplane.sim.calibrate on gpu-profiles/h100_dgx_all_reduce.csv (Vidur, NCCL on an
# H100 DGX, 2/4/8 GPUs, 2 KiB..64 MiB): see the calibrate report for the per-size errors.
ALLREDUCE_LATENCY_S = 29.5e-6  # fitted: 29.5 us
ALLREDUCE_BUS_EFFICIENCY = 0.782  # fitted: 352 GB/s bus bandwidth on 900 GB/s NVLink (rms log err 16 %)
# Elementwise kernels (RMSNorm, rope, SiLU-and-mul, residual adds) move this many times the ideal
# bytes (fp32 upcasts, extra passes, small kernels below peak bandwidth). Fitted jointly with the
# GPU constants by tokenplane.sim.calibrate --scan-elementwise on gpu-profiles/*_mlp.csv (1.4 has
# the lowest error on A100 and is within 2 % of the best on H100).
ELEMENTWISE_TRAFFIC_FACTOR = 1.4
# GPUs whose spec gives no interconnect are costed at PCIe 4.0 x16 (64 GB/s both directions).
DEFAULT_INTERCONNECT_GBPS = 64.0

_MEMO_LIMIT = 1 << 16


def allreduce_time_s(num_bytes: float, tp: int, interconnect_gbps: float | None) -> float:
    """Seconds for one ring all-reduce of ``num_bytes`` over ``tp`` GPUs (0 when ``tp == 1``)."""
    if tp <= 1:
        return 0.0
    link = interconnect_gbps if interconnect_gbps else DEFAULT_INTERCONNECT_GBPS
    bus_bw = ALLREDUCE_BUS_EFFICIENCY * link / 2 * 1e9
    return ALLREDUCE_LATENCY_S + 2.0 * (tp - 1) / tp * num_bytes / bus_bw


class StepTimeModel:
    """Step time of ``model`` on ``tp`` x ``gpu``; all times in seconds.

    ``include_lm_head=False`` leaves out the LM-head weight read (the Vidur profiles it is
    calibrated on do not contain it); the simulator keeps the default ``True``. The LM head's
    FLOPs are not counted (only sampled tokens, one per sequence, go through it).
    """

    __slots__ = (
        "_ar_fixed_s",
        "_ar_s_per_token",
        "_elementwise_s_per_token",
        "_gemm_s_per_token",
        "_inv_p",
        "_memo",
        "_overhead_s",
        "_p",
        "_weights_p",
        "_weights_s",
        "decode_kv_s_per_token",
        "gpu",
        "model",
        "prefill_s_per_pair",
        "tp",
    )

    def __init__(self, gpu: GpuSpec, model: ModelSpec, tp: int = 1, *, include_lm_head: bool = True) -> None:
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        self.gpu = gpu
        self.model = model
        self.tp = tp
        bw = gpu.hbm_bw_gbps * 1e9 * gpu.mem_efficiency  # achieved bytes/s per GPU
        flops = gpu.bf16_tflops * 1e12 * gpu.compute_efficiency  # achieved FLOP/s per GPU
        d = model.dtype_bytes
        kv_replication = max(1.0, tp / model.kv_heads)  # KV heads replicated when tp > kv_heads

        # Weights read once per step, split over the TP ranks.
        weight_params = model.layers * model.layer_matmul_params
        if include_lm_head:
            weight_params += model.lm_head_params
        self._weights_s = weight_params * d / tp / bw
        # Block GEMM FLOPs per token, split over the ranks.
        self._gemm_s_per_token = 2.0 * model.layers * model.layer_matmul_params / tp / flops
        # Elementwise kernels' activation traffic per token per rank and layer: two RMSNorms
        # (read+write hidden, replicated), two residual adds (2 reads + 1 write, replicated),
        # rotary embedding on q and k (sharded), SiLU-and-mul (read 2 x I, write I; sharded).
        h = model.hidden
        qk = (model.heads + model.kv_heads * kv_replication) * model.head_dim / tp
        per_layer_elems = 4 * h + 6 * h + 2 * qk + 3 * model.intermediate / tp
        self._elementwise_s_per_token = ELEMENTWISE_TRAFFIC_FACTOR * model.layers * per_layer_elems * d / bw
        # Two all-reduces of the hidden states per layer (after attention and after the MLP).
        if tp > 1:
            per_token = allreduce_time_s(h * d, tp, gpu.interconnect_gbps) - ALLREDUCE_LATENCY_S
            self._ar_fixed_s = 2 * model.layers * ALLREDUCE_LATENCY_S
            self._ar_s_per_token = 2 * model.layers * per_token
        else:
            self._ar_fixed_s = 0.0
            self._ar_s_per_token = 0.0
        # Fixed costs: per-step (CPU, launch) plus a per-layer kernel floor (tiny kernels such as
        # norms and rope cost a few microseconds however small the batch or TP shard).
        self._overhead_s = gpu.step_overhead_s + model.layers * gpu.layer_overhead_s + self._ar_fixed_s
        self._p = gpu.knee_sharpness
        self._inv_p = 1.0 / self._p
        self._weights_p = self._weights_s**self._p
        self._memo: dict[int, float] = {}

        # Decode attention reads every context token's K and V once (memory-bound).
        self.decode_kv_s_per_token: float = model.kv_bytes_per_token * kv_replication / tp / bw
        # Prefill attention: 4 x layers x heads x head_dim FLOPs per (query, key) pair (compute-bound).
        self.prefill_s_per_pair: float = model.attn_flops_per_pair / tp / flops

    @property
    def weights_read_s(self) -> float:
        """Memory-bound floor of the GEMMs: one read of this rank's weights."""
        return self._weights_s

    @property
    def knee_tokens(self) -> float:
        """Batch size where GEMM FLOPs time equals the weight-read time (the roofline knee)."""
        return self._weights_s / self._gemm_s_per_token

    def allreduce_time(self, num_tokens: int) -> float:
        """The tensor-parallel all-reduce share of :meth:`linear_time` (0 at TP1)."""
        if num_tokens <= 0:
            return 0.0
        return self._ar_fixed_s + num_tokens * self._ar_s_per_token

    def linear_time(self, num_tokens: int) -> float:
        """Non-attention time of one step with ``num_tokens`` batched tokens, overhead included."""
        t = self._memo.get(num_tokens)
        if t is not None:
            return t
        if num_tokens <= 0:
            return 0.0
        n = float(num_tokens)
        gemm = n * self._gemm_s_per_token
        core: float = (self._weights_p + gemm**self._p) ** self._inv_p
        t = self._overhead_s + core + n * (self._elementwise_s_per_token + self._ar_s_per_token)
        if len(self._memo) < _MEMO_LIMIT:
            self._memo[num_tokens] = t
        return t

    def step_time(self, num_tokens: int, decode_context_tokens: int, prefill_attn_pairs: int) -> float:
        return (
            self.linear_time(num_tokens)
            + self.decode_kv_s_per_token * decode_context_tokens
            + self.prefill_s_per_pair * prefill_attn_pairs
        )

    def __repr__(self) -> str:
        return f"StepTimeModel(gpu={self.gpu.name!r}, model={self.model.name!r}, tp={self.tp})"
