"""Roofline step-time model of one engine replica (one model on ``tp`` GPUs).

One engine step batches ``num_tokens`` tokens (prefill chunk tokens plus one per decoding
sequence). Its time is::

    step_time = linear_time(num_tokens)                      # GEMMs, elementwise ops, TP/EP traffic
              + decode_kv_s_per_token * decode_context_tokens # decode attention: KV reads
              + prefill_s_per_pair * prefill_attn_pairs       # prefill attention: QK^T and PV FLOPs

The decode KV reads run at ``mem_efficiency * kv_read_efficiency`` of the datasheet bandwidth
(:class:`~tokenplane.sim.catalog.GpuSpec`; the second factor defaults to 1: KV at the weights' rate).

``linear_time`` is a p-norm smooth maximum of the weight-read time (memory-bound) and the GEMM time
(compute-bound: linear in the tokens), plus the elementwise kernels' activation traffic, the
tensor-parallel all-reduces (two per layer), the expert-parallel all-to-alls and a fixed per-step
overhead. The efficiencies, overhead and knee sharpness come from
:class:`~tokenplane.sim.catalog.GpuSpec` (calibrated by :mod:`tokenplane.sim.calibrate`).

Mixture of experts. A step reads the shared weights (attention, dense MLPs, shared experts, routers)
once, and of each MoE layer's routed experts only those the batch touches. Assumption: each token
picks ``k`` of the ``E`` experts uniformly and independently of the other tokens, so the expected
number of distinct experts a batch of ``B`` tokens touches is ``E * (1 - (1 - k/E)^B)``: ``k`` for
one token, all ``E`` for a large batch. Real routers are skewed (some experts are popular) which
makes the distinct count smaller for the same ``B``: with uniform routing the weight reads are an
upper bound. FLOPs count only the active weights (shared plus ``k`` experts per token).

Parallelism. Tensor parallelism splits every weight over ``tp`` ranks and all-reduces the hidden
states twice per layer over the GPU's interconnect (latency + ring traffic at the link's bus
bandwidth). With ``expert_parallel`` the MoE layers' experts are spread whole over the same ranks
instead (each holds ``E / tp``; the expected bytes read per rank are the same) and the MoE layer's
all-reduce is replaced by a dispatch and a combine all-to-all: after the attention all-reduce every
rank holds the whole batch, each rank dispatches its ``1 / tp`` share of the tokens, and of each
token's ``k`` routed copies ``(tp - 1) / tp`` cross the link (uniform routing again).
"""

from __future__ import annotations

from tokenplane.sim.catalog import GpuSpec, ModelSpec

# All-reduce cost model t(bytes, k) = latency + 2 (k - 1) / k * bytes / bus_bw with
# bus_bw = ALLREDUCE_BUS_EFFICIENCY * interconnect_gbps / 2 (the per-direction link bandwidth).
# Fitted by tokenplane.sim.calibrate on gpu-profiles/h100_dgx_all_reduce.csv (Vidur, NCCL on an
# H100 DGX, 2/4/8 GPUs, 2 KiB..64 MiB): see the calibrate report for the per-size errors.
ALLREDUCE_LATENCY_S = 29.5e-6  # fitted: 29.5 us
ALLREDUCE_BUS_EFFICIENCY = 0.782  # fitted: 352 GB/s bus bandwidth on 900 GB/s NVLink (rms log err 16 %)
# Default fixed cost of one collective per interconnect kind (a GpuSpec's interconnect_latency_us
# overrides it). NVLink: the fit above. PCIe: no PCIe collective is profiled in the shared data, so
# the same fitted value is used (assumption: NCCL's small-message latency is mostly kernel launch
# and protocol overhead, not the wire; a lower bound for PCIe, which crosses the host bridge:
# public nccl-tests reports on 8 PCIe RTX 3090/4090s, not used here since they are not in the
# shared data, show 40-55 us for an 8-byte all-reduce, NVIDIA/nccl issues 1439 and 1530). A GPU
# entry's interconnect_latency_us sets a measured value.
INTERCONNECT_LATENCY_S = {"nvlink": ALLREDUCE_LATENCY_S, "pcie": ALLREDUCE_LATENCY_S}
# All-to-all (expert-parallel dispatch/combine): no all-to-all profile is shared, so it is costed
# with the all-reduce fit's latency and bus efficiency (assumption: NCCL's all-to-all reaches the
# same fraction of the link as its ring all-reduce).
ALLTOALL_BUS_EFFICIENCY = ALLREDUCE_BUS_EFFICIENCY
# Elementwise kernels (RMSNorm, rope, SiLU-and-mul, residual adds) move this many times the ideal
# bytes (fp32 upcasts, extra passes, small kernels below peak bandwidth). Fitted jointly with the
# GPU constants by tokenplane.sim.calibrate --scan-elementwise on gpu-profiles/*_mlp.csv (1.4 has
# the lowest error on A100 and is within 2 % of the best on H100).
ELEMENTWISE_TRAFFIC_FACTOR = 1.4
# GPUs whose spec gives no interconnect are costed at PCIe 4.0 x16 (64 GB/s both directions).
DEFAULT_INTERCONNECT_GBPS = 64.0

_MEMO_LIMIT = 1 << 16


def collective_latency_s(gpu: GpuSpec) -> float:
    """Fixed cost of one collective on ``gpu``'s interconnect (its own figure, else the kind's)."""
    if gpu.interconnect_latency_us is not None:
        return gpu.interconnect_latency_us * 1e-6
    return INTERCONNECT_LATENCY_S.get(gpu.interconnect, ALLREDUCE_LATENCY_S)


def allreduce_time_s(
    num_bytes: float, tp: int, interconnect_gbps: float | None, latency_s: float = ALLREDUCE_LATENCY_S
) -> float:
    """Seconds for one ring all-reduce of ``num_bytes`` over ``tp`` GPUs (0 when ``tp == 1``)."""
    if tp <= 1:
        return 0.0
    link = interconnect_gbps if interconnect_gbps else DEFAULT_INTERCONNECT_GBPS
    bus_bw = ALLREDUCE_BUS_EFFICIENCY * link / 2 * 1e9
    return latency_s + 2.0 * (tp - 1) / tp * num_bytes / bus_bw


def all_to_all_time_s(
    bytes_per_rank: float, ranks: int, interconnect_gbps: float | None, latency_s: float = ALLREDUCE_LATENCY_S
) -> float:
    """Seconds for one all-to-all in which each of ``ranks`` GPUs sends ``bytes_per_rank`` bytes
    off-rank (and receives as many) over the interconnect (0 when ``ranks == 1``)."""
    if ranks <= 1:
        return 0.0
    link = interconnect_gbps if interconnect_gbps else DEFAULT_INTERCONNECT_GBPS
    bus_bw = ALLTOALL_BUS_EFFICIENCY * link / 2 * 1e9
    return latency_s + bytes_per_rank / bus_bw


def expected_distinct_experts(num_tokens: float, experts: int, k: int) -> float:
    """Expected distinct experts ``num_tokens`` tokens touch, each picking ``k`` of ``experts``
    uniformly: ``E * (1 - (1 - k/E)^B)`` (each expert is missed by one token with probability
    ``1 - k/E``, by all of them independently)."""
    if num_tokens <= 0 or experts <= 0:
        return 0.0
    if k >= experts:
        return float(experts)
    miss: float = (1.0 - k / experts) ** num_tokens
    return experts * (1.0 - miss)


class StepTimeModel:
    """Step time of ``model`` on ``tp`` x ``gpu``; all times in seconds.

    ``include_lm_head=False`` leaves out the LM-head weight read (the Vidur profiles it is
    calibrated on do not contain it); the simulator keeps the default ``True``. The LM head's
    FLOPs are not counted (only sampled tokens, one per sequence, go through it).
    ``expert_parallel`` spreads a MoE model's experts whole over the ``tp`` ranks (see the module
    docstring); it changes nothing for a dense model.
    """

    __slots__ = (
        "_a2a_fixed_s",
        "_a2a_s_per_token",
        "_ar_fixed_s",
        "_ar_s_per_token",
        "_elementwise_s_per_token",
        "_expert_s",
        "_gemm_s_per_token",
        "_inv_p",
        "_k",
        "_memo",
        "_num_experts",
        "_overhead_s",
        "_p",
        "_weights_p",
        "_weights_s",
        "decode_kv_s_per_token",
        "expert_parallel",
        "gpu",
        "model",
        "prefill_s_per_pair",
        "tp",
    )

    def __init__(
        self,
        gpu: GpuSpec,
        model: ModelSpec,
        tp: int = 1,
        *,
        include_lm_head: bool = True,
        expert_parallel: bool = False,
    ) -> None:
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        self.gpu = gpu
        self.model = model
        self.tp = tp
        self.expert_parallel = expert_parallel and model.is_moe and tp > 1
        bw = gpu.hbm_bw_gbps * 1e9 * gpu.mem_efficiency  # achieved bytes/s per GPU
        flops = gpu.bf16_tflops * 1e12 * gpu.compute_efficiency  # achieved FLOP/s per GPU
        d = model.dtype_bytes
        kv_replication = max(1.0, tp / model.kv_heads)  # KV heads replicated when tp > kv_heads

        # Weights read once per step, split over the ranks: the shared ones always, and of each
        # MoE layer's routed experts those the batch touches (per distinct expert: _expert_s).
        weight_params = model.shared_matmul_params
        if include_lm_head:
            weight_params += model.lm_head_params
        self._weights_s = weight_params * d / tp / bw
        self._num_experts = model.experts if model.is_moe else 0
        self._k = model.experts_per_token
        self._expert_s = model.moe_layers * model.expert_params * d / tp / bw if model.is_moe else 0.0
        # Block GEMM FLOPs per token (active weights only), split over the ranks.
        self._gemm_s_per_token = 2.0 * model.active_matmul_params / tp / flops
        # Elementwise kernels' activation traffic per token per rank and layer: two RMSNorms
        # (read+write hidden, replicated), two residual adds (2 reads + 1 write, replicated),
        # rotary embedding on q and k (sharded), SiLU-and-mul (read 2 x I, write I; sharded; for
        # a MoE layer I is the token's k experts plus the shared expert).
        h = model.hidden
        qk = (model.heads + model.kv_heads * kv_replication) * model.head_dim / tp
        mlp_width = model.dense_layers * model.intermediate
        if model.is_moe:
            mlp_width += model.moe_layers * (
                model.experts_per_token * model.expert_intermediate + model.shared_intermediate
            )
        elems = model.layers * (4 * h + 6 * h + 2 * qk) + 3 * mlp_width / tp
        self._elementwise_s_per_token = ELEMENTWISE_TRAFFIC_FACTOR * elems * d / bw
        # Two all-reduces of the hidden states per layer (after attention and after the MLP); with
        # expert parallelism a MoE layer's second one becomes a dispatch and a combine all-to-all.
        latency = collective_latency_s(gpu)
        self._ar_fixed_s = self._ar_s_per_token = 0.0
        self._a2a_fixed_s = self._a2a_s_per_token = 0.0
        if tp > 1:
            allreduces = 2 * model.layers - (model.moe_layers if self.expert_parallel else 0)
            per_token = allreduce_time_s(h * d, tp, gpu.interconnect_gbps, latency) - latency
            self._ar_fixed_s = allreduces * latency
            self._ar_s_per_token = allreduces * per_token
            if self.expert_parallel:
                # Per token of the batch, each rank sends k / tp routed copies x (tp - 1) / tp.
                copy_bytes = model.experts_per_token * h * d * (tp - 1) / tp / tp
                per_token = all_to_all_time_s(copy_bytes, tp, gpu.interconnect_gbps, latency) - latency
                self._a2a_fixed_s = 2 * model.moe_layers * latency
                self._a2a_s_per_token = 2 * model.moe_layers * per_token
        # Fixed costs: per-step (CPU, launch) plus a per-layer kernel floor (tiny kernels such as
        # norms and rope cost a few microseconds however small the batch or TP shard).
        self._overhead_s = (
            gpu.step_overhead_s + model.layers * gpu.layer_overhead_s + self._ar_fixed_s + self._a2a_fixed_s
        )
        self._p = gpu.knee_sharpness
        self._inv_p = 1.0 / self._p
        self._weights_p = self._weights_s**self._p
        self._memo: dict[int, float] = {}

        # Decode attention reads every context token's KV once (memory-bound), at the GPU's KV-read
        # efficiency relative to the weight reads (paged gathers of short per-sequence runs).
        kv_bw = bw * gpu.kv_read_efficiency
        self.decode_kv_s_per_token: float = model.kv_bytes_per_token * kv_replication / tp / kv_bw
        # Prefill attention: 4 x layers x heads x head_dim FLOPs per (query, key) pair (compute-bound).
        self.prefill_s_per_pair: float = model.attn_flops_per_pair / tp / flops

    @property
    def weights_read_s(self) -> float:
        """Memory-bound floor of the GEMMs for one token: one read of this rank's weights (for a
        MoE model, the shared weights and one token's ``k`` experts)."""
        return self.weight_read_time(1)

    def weight_read_time(self, num_tokens: int) -> float:
        """Seconds to read this rank's weights once in a step of ``num_tokens`` tokens: the
        shared weights plus the routed experts the batch is expected to touch."""
        if self._num_experts == 0:
            return self._weights_s
        touched = expected_distinct_experts(num_tokens, self._num_experts, self._k)
        return self._weights_s + touched * self._expert_s

    def experts_touched(self, num_tokens: int) -> float:
        """Expected distinct experts per MoE layer a step of ``num_tokens`` tokens touches."""
        return expected_distinct_experts(num_tokens, self._num_experts, self._k)

    @property
    def knee_tokens(self) -> float:
        """Batch size where GEMM FLOPs time equals the (one-token) weight-read time."""
        return self.weights_read_s / self._gemm_s_per_token

    def allreduce_time(self, num_tokens: int) -> float:
        """The tensor-parallel all-reduce share of :meth:`linear_time` (0 at TP1)."""
        if num_tokens <= 0:
            return 0.0
        return self._ar_fixed_s + num_tokens * self._ar_s_per_token

    def all_to_all_time(self, num_tokens: int) -> float:
        """The expert-parallel all-to-all share of :meth:`linear_time` (0 without EP)."""
        if num_tokens <= 0:
            return 0.0
        return self._a2a_fixed_s + num_tokens * self._a2a_s_per_token

    def linear_time(self, num_tokens: int) -> float:
        """Non-attention time of one step with ``num_tokens`` batched tokens, overhead included."""
        t = self._memo.get(num_tokens)
        if t is not None:
            return t
        if num_tokens <= 0:
            return 0.0
        n = float(num_tokens)
        gemm = n * self._gemm_s_per_token
        weights_p = (
            self._weights_p if self._num_experts == 0 else self.weight_read_time(num_tokens) ** self._p
        )
        core: float = (weights_p + gemm**self._p) ** self._inv_p
        per_token = self._elementwise_s_per_token + self._ar_s_per_token + self._a2a_s_per_token
        t = self._overhead_s + core + n * per_token
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
