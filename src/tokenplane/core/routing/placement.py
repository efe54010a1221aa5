"""Seven-axis placement: filters and scorers for the axes of "Operating Distributed Inference at Scale".

Traditional bin packing weighs CPU, memory and fault domains; inference placement weighs at least
seven axes. Each is a plugin of the weighted profile (filters prune, scorers return [0, 1], NaN and
out-of-range reports count as the worst case), and the ``seven-axis`` router combines them.

Signals. The views carry some of what these plugins need as typed fields; the rest is read through
``getattr`` with a default (so the code works before and after the proposed fields exist), falling
back to ``InstanceView.labels``:

* instance ``weights`` ("warm" | "warming" | "cold"; label ``weights_state``), ``hbm_free_bytes``
  (label ``hbm_free_gib``), ``predicted_ttft_s`` (label ``predicted_ttft_s``), label
  ``gpu_generation`` (overrides the catalogue);
* request ``latency_budget_s`` (a TTFT budget counted from ``arrival_s``), ``min_gpu_generation``;
  ``WorkflowContext.deadline_s`` is an absolute time on the shell's clock (the clock of ``now``).

A typed field that holds something other than its default wins over the label.

GPU catalogue (param ``gpus`` of the GPU-aware plugins; merged over :data:`DEFAULT_GPUS`)::

    gpus: {h100: {generation: 9, hbm_gib: 80, bw_gbps: 3350, tflops: 989, price_per_hour: 2.99}, ...}

``InstanceView.gpu`` is matched case-insensitively, ignoring punctuation and a leading "nvidia", by
the longest catalogue name it starts with ("NVIDIA H100-SXM" → h100). An unknown GPU is neutral.

Urgency. Several axes depend on how much latency a request can tolerate, ``u`` in [0, 1]: from the
remaining budget ``b`` (the smaller of the request's TTFT budget left and its workflow's time left
divided by its steps left), ``u = 1`` for ``b <= interactive_s`` (default 1 s), ``0`` for
``b >= relaxed_s`` (60 s), log-linear between; without any budget, from ``priority`` (1 interactive
→ 1, 0 standard → 0.5, -1 batch → 0).

The axes
--------

1. **GPU type fit** — ``gpu-fit`` scorer (params ``gpus``, ``interactive_s``, ``relaxed_s``):
   ``u × speed + (1 − u) × cheapness``, with ``speed = bw / max bw`` over the candidates (decode is
   bandwidth-bound) and ``cheapness = min cost / cost`` where cost per token ∝
   ``price_per_hour / bw`` (the view's price, else the catalogue's). Interactive work gets the
   fastest GPU, batch work the cheapest per token, standard work the best mix. Unknown GPU: 0.5.
   ``gpu-generation`` filter (params ``gpus``, ``min_generation``, ``models: {name: {min_generation,
   min_hbm_gib}}``): drops instances whose generation or HBM is below the model's or the request's
   need (``min_gpu_generation``). A hard requirement: it may empty the list (``NO_CANDIDATES``).
   Unknown generation or HBM passes.
2. **HBM headroom** — ``kv-headroom`` filter (param ``strict``, default false): the request needs
   ``prompt_tokens + max_output_tokens`` tokens of KV; it keeps instances with
   ``(1 − kv_usage) × kv_capacity_tokens >= need`` (unknown capacity passes). If none fits now it
   keeps those whose whole capacity could hold it (they queue it), unless ``strict``; an instance
   too small ever to hold it is never kept. Conservative: it ignores prefix-cache hits.
   ``hbm-headroom`` scorer (params ``saturate_at`` = 0.25, ``kv_bytes_per_token`` = 131072, ``gpus``):
   the free fraction left after placing the request, ``h / saturate_at`` clamped: from KV tokens
   when the capacity is known, else from ``hbm_free_bytes`` against the catalogue's HBM, else
   ``1 − kv_usage``. It only separates near-full instances; balancing is the other scorers' job.
3. **KV-cache state** — the existing ``prefix-overlap`` scorer (its index is owned by the router).
4. **Model-weight readiness** — ``weights-ready`` filter: drops cold instances unless no warm or
   warming candidate could ever hold the request (every one is cold, or too small).
   ``weights-ready`` scorer (param ``warming_score`` = 0.3): warm 1, warming ``warming_score``,
   cold 0.
5. **Tenant priority** — ``tenant-priority`` scorer (params ``low_priority_load_weight`` β = 0.25,
   ``gpus``): ``1 − w × L_speed − (1 − w) × β × L_queue`` with importance ``w`` = 0, 0.5, 1 for
   priority ≤ -1, 0, ≥ 1; ``queue = 1 + max(outstanding_requests, running + waiting)`` (the queue
   the request would join, itself included), ``L_queue = queue / max queue`` and ``L_speed`` the same
   for ``queue / speed`` (speed: the GPU's bandwidth relative to the fastest candidate). High
   priority strongly prefers the least-loaded, fastest instance; low priority only mildly avoids
   long queues and ignores speed, so it tolerates loaded or slower instances and leaves the best
   ones to others.
6. **Workflow context** — ``workflow-affinity`` scorer (params ``max_workflows`` = 100000,
   ``min_affinity`` = 0.5, ``cost_scale_usd`` = 0.05): the instance that served the workflow's last
   step (it holds the workflow's KV) scores ``min_affinity + (1 − min_affinity) × (1 −
   exp(−sunk_cost_usd / cost_scale_usd))``, others 0: the more a workflow has spent, the more its
   affinity weighs. State: a bounded LRU map ``workflow_id → instance``, changed only in
   ``on_routed`` (and ``forget``), which the weighted router calls.
7. **Latency budget** — ``latency-budget`` scorer (params ``prefill_tokens_per_s`` = 20000 on an
   H100-class GPU, ``queue_s_per_request`` = 0.25, ``warming_s`` = 30, ``cold_s`` = 120,
   ``comfort`` = 0.5, ``gpus``): predicted TTFT ``t`` is the instance's ``predicted_ttft_s`` when the
   shell gives one, else ``prompt / (prefill_tokens_per_s × tflops / 989) + queued ×
   queue_s_per_request × 3350 / bw + readiness``, with ``queued = max(waiting, outstanding_requests −
   running)`` and readiness 0, ``warming_s`` or ``cold_s``. Score 1 for ``t <= comfort × b``, 0 for
   ``t >= b``, linear between; 1 for all without a budget, 0 for all once it is spent.

Cost: each plugin is one pass over the candidates (the catalogue lookup is a dict read; an alias
walks the ≤ 10 catalogue names). How they fail: they read reported signals, which lag; the TTFT and
cost models are first-order (bandwidth for decode, FLOPs for prefill, one model per fleet), so a
shell that can predict better should fill ``predicted_ttft_s``; the affinity map remembers where a
workflow was *sent*, not whether the engine kept its KV.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing._params import ParamReader, no_params
from tokenplane.core.routing.weighted import WEIGHTED_PARAMS, WeightedRouter, build_weighted
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo

GIB = 1 << 30
REFERENCE_TFLOPS = 989.0  # H100 dense BF16: the GPU ``prefill_tokens_per_s`` is quoted for
REFERENCE_BW_GBPS = 3350.0  # H100 HBM3: the GPU ``queue_s_per_request`` is quoted for
_TFLOPS_PER_GBPS = REFERENCE_TFLOPS / REFERENCE_BW_GBPS

DEFAULT_INTERACTIVE_S = 1.0
DEFAULT_RELAXED_S = 60.0
DEFAULT_SATURATE_AT = 0.25
DEFAULT_KV_BYTES_PER_TOKEN = 131_072  # Llama-3-8B: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
DEFAULT_WARMING_SCORE = 0.3
DEFAULT_LOW_PRIORITY_LOAD_WEIGHT = 0.25
DEFAULT_MAX_WORKFLOWS = 100_000
DEFAULT_MIN_AFFINITY = 0.5
DEFAULT_COST_SCALE_USD = 0.05
DEFAULT_PREFILL_TOKENS_PER_S = 20_000.0
DEFAULT_QUEUE_S_PER_REQUEST = 0.25
DEFAULT_WARMING_S = 30.0
DEFAULT_COLD_S = 120.0
DEFAULT_COMFORT = 0.5

WARM, WARMING, COLD = "warm", "warming", "cold"
_WEIGHT_STATES = {
    "warm": WARM,
    "loaded": WARM,
    "ready": WARM,
    "warming": WARMING,
    "loading": WARMING,
    "cold": COLD,
    "unloaded": COLD,
}


# -- the GPU catalogue ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuClass:
    """Datasheet figures of one GPU type: enough to rank speed and cost per token."""

    name: str
    generation: int  # architecture: 8 Ampere/Ada, 9 Hopper, 10 Blackwell
    hbm_gib: float
    bw_gbps: float
    tflops: float  # dense BF16
    price_per_hour: float = 0.0  # 0: unknown (the instance view's price is used when it has one)


# Datasheet figures; prices are typical 2025 on-demand rates (assumptions, as in the sim catalogue).
DEFAULT_GPUS: Mapping[str, GpuClass] = {
    g.name: g
    for g in (
        GpuClass("h100", 9, 80, 3350, 989, 2.99),
        GpuClass("h200", 9, 141, 4800, 989, 3.79),
        GpuClass("a100", 8, 80, 2039, 312, 1.79),
        GpuClass("l40s", 8, 48, 864, 362, 1.03),
        GpuClass("rtx4090", 8, 24, 1008, 165, 0.69),
        GpuClass("rtxpro6000", 10, 96, 1597, 504, 1.79),
    )
}


def _gpu_key(name: str) -> str:
    key = "".join(ch for ch in name.lower() if ch.isalnum())
    return key.removeprefix("nvidia").removeprefix("geforce")


class GpuCatalogue:
    """Name → :class:`GpuClass`, matched by normalised name or the longest catalogue prefix."""

    def __init__(self, gpus: Mapping[str, GpuClass]) -> None:
        self._by_key = {_gpu_key(name): g for name, g in gpus.items()}
        self._keys_longest_first = sorted(self._by_key, key=len, reverse=True)

    def lookup(self, gpu: str) -> GpuClass | None:
        if not gpu:
            return None
        key = _gpu_key(gpu)
        found = self._by_key.get(key)
        if found is not None:
            return found
        for k in self._keys_longest_first:
            if k and key.startswith(k):
                return self._by_key[k]
        return None

    @classmethod
    def from_params(cls, owner: str, raw: Any) -> GpuCatalogue:
        """Merge a ``gpus`` param over :data:`DEFAULT_GPUS`; ``None`` gives the defaults."""
        gpus = dict(DEFAULT_GPUS)
        if raw is None:
            return cls(gpus)
        if not isinstance(raw, Mapping):
            raise InvalidPolicyConfig(f"{owner}: param 'gpus' must be a mapping of GPU name to figures")
        fields = ("generation", "hbm_gib", "bw_gbps", "tflops", "price_per_hour")
        for name, figures in raw.items():
            where = f"{owner}: gpus.{name}"
            reader = ParamReader(where, figures, fields)
            base = gpus.get(str(name).lower())
            if base is None:
                missing = [f for f in ("generation", "hbm_gib", "bw_gbps") if not reader.has(f)]
                if missing:
                    raise InvalidPolicyConfig(f"{where}: a new GPU needs {missing}")
                base = GpuClass(str(name).lower(), 0, 0.0, 0.0, 0.0)
            bw = reader.float_("bw_gbps", base.bw_gbps, min_value=0.0, exclusive_min=True)
            gpus[base.name] = GpuClass(
                base.name,
                reader.int_("generation", base.generation, min_value=0),
                reader.float_("hbm_gib", base.hbm_gib, min_value=0.0, exclusive_min=True),
                bw,
                # without a figure, assume FLOPs scale like bandwidth against the reference GPU
                reader.float_("tflops", base.tflops or bw * _TFLOPS_PER_GBPS, min_value=0.0),
                reader.float_("price_per_hour", base.price_per_hour, min_value=0.0),
            )
        return cls(gpus)


# -- defensive readers of the views --------------------------------------------------------------


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _label_float(view: InstanceView, key: str) -> float | None:
    raw = view.labels.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _clamp01(x: float) -> float:
    return x if 0.0 <= x <= 1.0 else (1.0 if x > 1.0 else 0.0)  # NaN -> 0


def weights_state(view: InstanceView) -> str:
    """``warm`` | ``warming`` | ``cold``: the typed ``weights`` field, else label ``weights_state``."""
    typed = getattr(view, "weights", None)
    if isinstance(typed, str) and typed and typed.lower() != WARM:
        return _WEIGHT_STATES.get(typed.lower(), WARM)
    label = view.labels.get("weights_state")
    if label:
        return _WEIGHT_STATES.get(label.lower(), WARM)
    return WARM


def gpu_generation(view: InstanceView, catalogue: GpuCatalogue) -> int | None:
    label = _label_float(view, "gpu_generation")
    if label is not None:
        return int(label)
    spec = catalogue.lookup(view.gpu)
    return None if spec is None else spec.generation


def hbm_free_bytes(view: InstanceView) -> float | None:
    typed = _finite(getattr(view, "hbm_free_bytes", None))
    if typed is not None and typed > 0:
        return typed
    gib = _label_float(view, "hbm_free_gib")
    return None if gib is None else max(0.0, gib) * GIB


def predicted_ttft_s(view: InstanceView) -> float | None:
    typed = _finite(getattr(view, "predicted_ttft_s", None))
    if typed is not None and typed > 0:
        return typed
    label = _label_float(view, "predicted_ttft_s")
    return None if label is None or label < 0 else label


def kv_tokens_needed(request: RequestInfo) -> int:
    return max(0, request.prompt_tokens) + max(0, request.max_output_tokens)


def could_ever_hold(view: InstanceView, tokens: int) -> bool:
    """Whether the instance's whole KV capacity could hold ``tokens`` (unknown capacity: yes)."""
    return view.kv_capacity_tokens <= 0 or view.kv_capacity_tokens >= tokens


def free_kv_tokens(view: InstanceView) -> float | None:
    """``(1 − kv_usage) × kv_capacity_tokens``; None when the capacity is unknown; NaN usage = full."""
    cap = view.kv_capacity_tokens
    if cap <= 0:
        return None
    return (1.0 - _clamp01(view.kv_usage if not math.isnan(view.kv_usage) else 1.0)) * cap


def remaining_budget_s(request: RequestInfo, now: float) -> float | None:
    """Time left for this request's first token: the smaller of its TTFT budget left and its
    workflow's time left divided by its steps left (this one included); None without either."""
    best: float | None = None
    budget = _finite(getattr(request, "latency_budget_s", None))
    if budget is not None:
        best = request.arrival_s + budget - now
    wf = request.workflow
    if wf is not None and wf.deadline_s is not None and math.isfinite(wf.deadline_s):
        steps_left = 1
        if wf.total_steps is not None:
            steps_left = max(1, wf.total_steps - wf.step + 1)
        share = (wf.deadline_s - now) / steps_left
        best = share if best is None else min(best, share)
    return best


def importance(request: RequestInfo) -> float:
    """Priority class onto [0, 1]: batch (≤ -1) 0, standard 0.5, interactive (≥ 1) 1."""
    return (min(1, max(-1, request.priority)) + 1) / 2


def urgency(request: RequestInfo, now: float, interactive_s: float, relaxed_s: float) -> float:
    """How latency-sensitive the request is, in [0, 1] (see the module docstring)."""
    b = remaining_budget_s(request, now)
    if b is None:
        return importance(request)
    if b <= interactive_s:
        return 1.0
    if b >= relaxed_s:
        return 0.0
    return _clamp01(1.0 - math.log(b / interactive_s) / math.log(relaxed_s / interactive_s))


def _relative_speeds(specs: Sequence[GpuClass | None]) -> list[float]:
    """bw / max bw over the known GPUs; 1 for unknown ones (or when none is known)."""
    top = max((s.bw_gbps for s in specs if s is not None), default=0.0)
    if top <= 0:
        return [1.0] * len(specs)
    return [1.0 if s is None else s.bw_gbps / top for s in specs]


def _urgency_params(reader: ParamReader) -> tuple[float, float]:
    interactive = reader.float_("interactive_s", DEFAULT_INTERACTIVE_S, min_value=0.0, exclusive_min=True)
    relaxed = reader.float_("relaxed_s", DEFAULT_RELAXED_S, min_value=0.0, exclusive_min=True)
    if not relaxed > interactive:
        raise InvalidPolicyConfig(f"{reader.owner}: relaxed_s must be > interactive_s")
    return interactive, relaxed


# -- 1. GPU type fit -----------------------------------------------------------------------------


class GpuFitScorer:
    name = "gpu-fit"

    def __init__(
        self,
        catalogue: GpuCatalogue | None = None,
        *,
        interactive_s: float = DEFAULT_INTERACTIVE_S,
        relaxed_s: float = DEFAULT_RELAXED_S,
    ) -> None:
        self.catalogue = catalogue if catalogue is not None else GpuCatalogue(DEFAULT_GPUS)
        self.interactive_s = interactive_s
        self.relaxed_s = relaxed_s

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        specs = [self.catalogue.lookup(v.gpu) for v in candidates]
        if all(s is None for s in specs):
            return [0.5] * len(candidates)
        u = urgency(request, now, self.interactive_s, self.relaxed_s)
        speeds = _relative_speeds(specs)
        costs: list[float | None] = []
        for v, s in zip(candidates, specs, strict=True):
            price = v.price_per_hour if v.price_per_hour > 0 else (s.price_per_hour if s else 0.0)
            per_token = price / s.bw_gbps if s is not None else 0.0
            ok = per_token > 0 and math.isfinite(per_token)  # also catches underflow
            costs.append(per_token if ok else None)
        cheapest = min((c for c in costs if c is not None), default=None)
        out = []
        for s, speed, cost in zip(specs, speeds, costs, strict=True):
            if s is None:
                out.append(0.5)
                continue
            cheap = 0.5 if cost is None or cheapest is None else cheapest / cost
            out.append(_clamp01(u * speed + (1.0 - u) * cheap))
        return out


class GpuGenerationFilter:
    name = "gpu-generation"

    def __init__(
        self,
        catalogue: GpuCatalogue | None = None,
        *,
        min_generation: int = 0,
        models: Mapping[str, tuple[int, float]] | None = None,
    ) -> None:
        self.catalogue = catalogue if catalogue is not None else GpuCatalogue(DEFAULT_GPUS)
        self.min_generation = min_generation
        self.models = dict(models or {})  # model -> (min_generation, min_hbm_gib)

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]:
        model_gen, model_hbm = self.models.get(request.model, (0, 0.0))
        asked = getattr(request, "min_gpu_generation", 0)
        need_gen = max(self.min_generation, model_gen, asked if isinstance(asked, int) else 0)
        if need_gen <= 0 and model_hbm <= 0:
            return candidates
        kept = []
        for v in candidates:
            gen = gpu_generation(v, self.catalogue)
            spec = self.catalogue.lookup(v.gpu)
            if (gen is None or gen >= need_gen) and (spec is None or spec.hbm_gib >= model_hbm):
                kept.append(v)
        return candidates if len(kept) == len(candidates) else kept


# -- 2. HBM headroom -----------------------------------------------------------------------------


class KvHeadroomFilter:
    name = "kv-headroom"

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]:
        need = kv_tokens_needed(request)
        fits_now = []
        for v in candidates:
            free = free_kv_tokens(v)
            if free is None or free >= need:
                fits_now.append(v)
        if len(fits_now) == len(candidates):
            return candidates
        if fits_now or self.strict:
            return fits_now
        return [v for v in candidates if could_ever_hold(v, need)]


class HbmHeadroomScorer:
    name = "hbm-headroom"

    def __init__(
        self,
        catalogue: GpuCatalogue | None = None,
        *,
        saturate_at: float = DEFAULT_SATURATE_AT,
        kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN,
    ) -> None:
        if not 0.0 < saturate_at <= 1.0:
            raise ValueError(f"saturate_at must be in (0, 1], got {saturate_at}")
        self.catalogue = catalogue if catalogue is not None else GpuCatalogue(DEFAULT_GPUS)
        self.saturate_at = saturate_at
        self.kv_bytes_per_token = kv_bytes_per_token

    def headroom(self, request: RequestInfo, view: InstanceView) -> float:
        """Fraction of the instance's memory still free after placing the request (may be < 0)."""
        need = kv_tokens_needed(request)
        free = free_kv_tokens(view)
        if free is not None:
            return (free - need) / view.kv_capacity_tokens
        free_b = hbm_free_bytes(view)
        spec = self.catalogue.lookup(view.gpu)
        if free_b is not None and spec is not None:
            return (free_b - need * self.kv_bytes_per_token) / (spec.hbm_gib * GIB)
        return 1.0 - _clamp01(view.kv_usage) if not math.isnan(view.kv_usage) else 0.0

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        sat = self.saturate_at
        return [_clamp01(self.headroom(request, v) / sat) for v in candidates]


# -- 4. Model-weight readiness -------------------------------------------------------------------


class WeightsReadyFilter:
    name = "weights-ready"

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]:
        kept = [v for v in candidates if weights_state(v) != COLD]
        if len(kept) == len(candidates):
            return candidates
        need = kv_tokens_needed(request)
        if any(could_ever_hold(v, need) for v in kept):
            return kept
        return candidates  # no warm one can take it: a cold start beats refusing


class WeightsReadyScorer:
    name = "weights-ready"

    def __init__(self, warming_score: float = DEFAULT_WARMING_SCORE) -> None:
        if not 0.0 <= warming_score <= 1.0:
            raise ValueError(f"warming_score must be in [0, 1], got {warming_score}")
        self._by_state = {WARM: 1.0, WARMING: warming_score, COLD: 0.0}

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        by_state = self._by_state
        return [by_state[weights_state(v)] for v in candidates]


# -- 5. Tenant priority --------------------------------------------------------------------------


class TenantPriorityScorer:
    name = "tenant-priority"

    def __init__(
        self,
        catalogue: GpuCatalogue | None = None,
        *,
        low_priority_load_weight: float = DEFAULT_LOW_PRIORITY_LOAD_WEIGHT,
    ) -> None:
        if not 0.0 <= low_priority_load_weight <= 1.0:
            raise ValueError(f"low_priority_load_weight must be in [0, 1], got {low_priority_load_weight}")
        self.catalogue = catalogue if catalogue is not None else GpuCatalogue(DEFAULT_GPUS)
        self.beta = low_priority_load_weight

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        if not candidates:
            return []
        speeds = _relative_speeds([self.catalogue.lookup(v.gpu) for v in candidates])
        queues = [1 + max(0, v.outstanding_requests, v.running + v.waiting) for v in candidates]
        slowed = [q / speed for q, speed in zip(queues, speeds, strict=True)]
        top_q, top_s = max(queues), max(slowed)
        w = importance(request)
        low = (1.0 - w) * self.beta
        return [
            _clamp01(1.0 - w * (qs / top_s) - low * (q / top_q)) for q, qs in zip(queues, slowed, strict=True)
        ]


# -- 6. Workflow context -------------------------------------------------------------------------


class WorkflowAffinityScorer:
    """Stateful: changes only in ``on_routed`` and ``forget`` (a :class:`RoutingObserver`)."""

    name = "workflow-affinity"

    def __init__(
        self,
        *,
        max_workflows: int = DEFAULT_MAX_WORKFLOWS,
        min_affinity: float = DEFAULT_MIN_AFFINITY,
        cost_scale_usd: float = DEFAULT_COST_SCALE_USD,
    ) -> None:
        if max_workflows < 1:
            raise ValueError(f"max_workflows must be >= 1, got {max_workflows}")
        if not 0.0 <= min_affinity <= 1.0:
            raise ValueError(f"min_affinity must be in [0, 1], got {min_affinity}")
        if not cost_scale_usd > 0:
            raise ValueError(f"cost_scale_usd must be > 0, got {cost_scale_usd}")
        self.max_workflows = max_workflows
        self.min_affinity = min_affinity
        self.cost_scale_usd = cost_scale_usd
        self._last: OrderedDict[str, InstanceId] = OrderedDict()

    def affinity(self, sunk_cost_usd: float) -> float:
        sunk = sunk_cost_usd if sunk_cost_usd > 0 else 0.0  # NaN -> 0
        grown = 1.0 - math.exp(-sunk / self.cost_scale_usd)
        return _clamp01(self.min_affinity + (1.0 - self.min_affinity) * grown)

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        wf = request.workflow
        previous = None if wf is None else self._last.get(wf.workflow_id)  # a read: no LRU touch
        if wf is None or previous is None:
            return [0.0] * len(candidates)
        strength = self.affinity(wf.sunk_cost_usd)
        return [strength if v.instance_id == previous else 0.0 for v in candidates]

    def previous_instance(self, workflow_id: str) -> InstanceId | None:
        return self._last.get(workflow_id)

    def snapshot(self) -> dict[str, InstanceId]:
        return dict(self._last)

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        wf = request.workflow
        if wf is None:
            return
        last = self._last
        last[wf.workflow_id] = instance_id
        last.move_to_end(wf.workflow_id)
        while len(last) > self.max_workflows:
            last.popitem(last=False)

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        pass  # the affinity outlives the step: the next step comes after this one finished

    def forget(self, instance_id: InstanceId) -> None:
        for wid in [w for w, iid in self._last.items() if iid == instance_id]:
            del self._last[wid]


# -- 7. Latency budget ---------------------------------------------------------------------------


class LatencyBudgetScorer:
    name = "latency-budget"

    def __init__(
        self,
        catalogue: GpuCatalogue | None = None,
        *,
        prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        queue_s_per_request: float = DEFAULT_QUEUE_S_PER_REQUEST,
        warming_s: float = DEFAULT_WARMING_S,
        cold_s: float = DEFAULT_COLD_S,
        comfort: float = DEFAULT_COMFORT,
    ) -> None:
        if not prefill_tokens_per_s > 0:
            raise ValueError(f"prefill_tokens_per_s must be > 0, got {prefill_tokens_per_s}")
        if not 0.0 <= comfort < 1.0:
            raise ValueError(f"comfort must be in [0, 1), got {comfort}")
        self.catalogue = catalogue if catalogue is not None else GpuCatalogue(DEFAULT_GPUS)
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.queue_s_per_request = queue_s_per_request
        self.comfort = comfort
        self._readiness_s = {WARM: 0.0, WARMING: warming_s, COLD: cold_s}

    def predict_ttft_s(self, request: RequestInfo, view: InstanceView) -> float:
        given = predicted_ttft_s(view)
        if given is not None:
            return given
        spec = self.catalogue.lookup(view.gpu)
        compute = 1.0 if spec is None or spec.tflops <= 0 else spec.tflops / REFERENCE_TFLOPS
        bandwidth = 1.0 if spec is None else spec.bw_gbps / REFERENCE_BW_GBPS
        queued = max(0, view.waiting, view.outstanding_requests - view.running)
        return (
            max(0, request.prompt_tokens) / (self.prefill_tokens_per_s * compute)
            + queued * self.queue_s_per_request / bandwidth
            + self._readiness_s[weights_state(view)]
        )

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        budget = remaining_budget_s(request, now)
        if budget is None:
            return [1.0] * len(candidates)
        if budget <= 0:
            return [0.0] * len(candidates)
        comfort, out = self.comfort, []
        for v in candidates:
            ratio = self.predict_ttft_s(request, v) / budget
            out.append(1.0 if ratio <= comfort else _clamp01((1.0 - ratio) / (1.0 - comfort)))
        return out


# -- registration --------------------------------------------------------------------------------


def _catalogue(reader: ParamReader) -> GpuCatalogue:
    return GpuCatalogue.from_params(reader.owner, reader.raw("gpus"))


@register("scorer", "gpu-fit")
def _build_gpu_fit(params: Mapping[str, Any], ctx: BuildContext) -> GpuFitScorer:
    reader = ParamReader("scorer 'gpu-fit'", params, ("gpus", "interactive_s", "relaxed_s"))
    interactive, relaxed = _urgency_params(reader)
    return GpuFitScorer(_catalogue(reader), interactive_s=interactive, relaxed_s=relaxed)


@register("filter", "gpu-generation")
def _build_gpu_generation(params: Mapping[str, Any], ctx: BuildContext) -> GpuGenerationFilter:
    owner = "filter 'gpu-generation'"
    reader = ParamReader(owner, params, ("gpus", "min_generation", "models"))
    raw_models = reader.raw("models", {})
    if not isinstance(raw_models, Mapping):
        raise InvalidPolicyConfig(f"{owner}: param 'models' must be a mapping of model name to needs")
    models: dict[str, tuple[int, float]] = {}
    for model, needs in raw_models.items():
        m = ParamReader(f"{owner}: models.{model}", needs, ("min_generation", "min_hbm_gib"))
        models[str(model)] = (
            m.int_("min_generation", 0, min_value=0),
            m.float_("min_hbm_gib", 0.0, min_value=0.0),
        )
    return GpuGenerationFilter(
        _catalogue(reader), min_generation=reader.int_("min_generation", 0, min_value=0), models=models
    )


@register("filter", "kv-headroom")
def _build_kv_headroom(params: Mapping[str, Any], ctx: BuildContext) -> KvHeadroomFilter:
    reader = ParamReader("filter 'kv-headroom'", params, ("strict",))
    return KvHeadroomFilter(strict=reader.bool_("strict", False))


@register("scorer", "hbm-headroom")
def _build_hbm_headroom(params: Mapping[str, Any], ctx: BuildContext) -> HbmHeadroomScorer:
    reader = ParamReader("scorer 'hbm-headroom'", params, ("gpus", "saturate_at", "kv_bytes_per_token"))
    return HbmHeadroomScorer(
        _catalogue(reader),
        saturate_at=reader.float_(
            "saturate_at", DEFAULT_SATURATE_AT, min_value=0.0, exclusive_min=True, max_value=1.0
        ),
        kv_bytes_per_token=reader.int_("kv_bytes_per_token", DEFAULT_KV_BYTES_PER_TOKEN, min_value=1),
    )


@register("filter", "weights-ready")
def _build_weights_filter(params: Mapping[str, Any], ctx: BuildContext) -> WeightsReadyFilter:
    no_params("filter 'weights-ready'", params)
    return WeightsReadyFilter()


@register("scorer", "weights-ready")
def _build_weights_scorer(params: Mapping[str, Any], ctx: BuildContext) -> WeightsReadyScorer:
    reader = ParamReader("scorer 'weights-ready'", params, ("warming_score",))
    return WeightsReadyScorer(
        reader.float_("warming_score", DEFAULT_WARMING_SCORE, min_value=0.0, max_value=1.0)
    )


@register("scorer", "tenant-priority")
def _build_tenant_priority(params: Mapping[str, Any], ctx: BuildContext) -> TenantPriorityScorer:
    reader = ParamReader("scorer 'tenant-priority'", params, ("gpus", "low_priority_load_weight"))
    return TenantPriorityScorer(
        _catalogue(reader),
        low_priority_load_weight=reader.float_(
            "low_priority_load_weight", DEFAULT_LOW_PRIORITY_LOAD_WEIGHT, min_value=0.0, max_value=1.0
        ),
    )


@register("scorer", "workflow-affinity")
def _build_workflow_affinity(params: Mapping[str, Any], ctx: BuildContext) -> WorkflowAffinityScorer:
    reader = ParamReader(
        "scorer 'workflow-affinity'", params, ("max_workflows", "min_affinity", "cost_scale_usd")
    )
    return WorkflowAffinityScorer(
        max_workflows=reader.int_("max_workflows", DEFAULT_MAX_WORKFLOWS, min_value=1),
        min_affinity=reader.float_("min_affinity", DEFAULT_MIN_AFFINITY, min_value=0.0, max_value=1.0),
        cost_scale_usd=reader.float_(
            "cost_scale_usd", DEFAULT_COST_SCALE_USD, min_value=0.0, exclusive_min=True
        ),
    )


@register("scorer", "latency-budget")
def _build_latency_budget(params: Mapping[str, Any], ctx: BuildContext) -> LatencyBudgetScorer:
    keys = ("gpus", "prefill_tokens_per_s", "queue_s_per_request", "warming_s", "cold_s", "comfort")
    reader = ParamReader("scorer 'latency-budget'", params, keys)
    return LatencyBudgetScorer(
        _catalogue(reader),
        prefill_tokens_per_s=reader.float_(
            "prefill_tokens_per_s", DEFAULT_PREFILL_TOKENS_PER_S, min_value=0.0, exclusive_min=True
        ),
        queue_s_per_request=reader.float_("queue_s_per_request", DEFAULT_QUEUE_S_PER_REQUEST, min_value=0.0),
        warming_s=reader.float_("warming_s", DEFAULT_WARMING_S, min_value=0.0),
        cold_s=reader.float_("cold_s", DEFAULT_COLD_S, min_value=0.0),
        comfort=reader.float_("comfort", DEFAULT_COMFORT, min_value=0.0, max_value=0.99),
    )


# -- the default profile -------------------------------------------------------------------------

# Hard constraints first, so that a soft filter's fallback never hides an instance a hard one keeps.
SEVEN_AXIS_FILTERS: tuple[str, ...] = ("gpu-generation", "weights-ready", "kv-headroom")
SEVEN_AXIS_WEIGHTS: Mapping[str, float] = {
    "prefix-overlap": 2.0,  # KV-cache state
    "latency-budget": 2.0,
    # Load (through tenant-priority) must outweigh stickiness, or long workflows herd onto one
    # instance: on examples/agentic-routing.yaml, affinity 1 + load 1 lost half the goodput of
    # ``weighted``; affinity 0.5 + load 3 matched it (1.34 against 1.26 goodput rps, one seed).
    "tenant-priority": 3.0,
    "workflow-affinity": 0.5,
    "gpu-fit": 1.0,
    "hbm-headroom": 1.0,
    "weights-ready": 1.0,
}
_GPU_AWARE = frozenset({"gpu-fit", "gpu-generation", "hbm-headroom", "tenant-priority", "latency-budget"})
_SEVEN_OWNER = "router 'seven-axis'"


def _with_gpus(item: Any, gpus: Any) -> Any:
    """Hand the profile's ``gpus`` to a GPU-aware part that does not set its own."""
    if isinstance(item, str):
        return {"name": item, "params": {"gpus": gpus}} if item in _GPU_AWARE else item
    if isinstance(item, Mapping) and item.get("name") in _GPU_AWARE:
        params = item.get("params") or {}
        if isinstance(params, Mapping) and "gpus" not in params:
            return {**item, "params": {**params, "gpus": gpus}}
    return item


def _part_name(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    name = item.get("name") if isinstance(item, Mapping) else None
    return name if isinstance(name, str) else None


def _reweight(items: list[Any], weights: Mapping[str, Any]) -> list[Any]:
    named = {_part_name(it) for it in items}
    unknown = sorted(str(k) for k in weights if k not in named)
    if unknown:
        raise InvalidPolicyConfig(
            f"{_SEVEN_OWNER}: param 'weights' names scorers not in the profile: {unknown}"
        )
    out = []
    for it in items:
        name = _part_name(it)
        if name is not None and name in weights:
            base = {"name": it} if isinstance(it, str) else dict(it)
            out.append({**base, "weight": weights[name]})
        else:
            out.append(it)
    return out


@register("router", "seven-axis")
def _build_seven_axis(params: Mapping[str, Any], ctx: BuildContext) -> WeightedRouter:
    """``weighted`` with the seven-axis defaults; extra params ``weights: {scorer: w}`` and ``gpus``."""
    reader = ParamReader(_SEVEN_OWNER, params, (*WEIGHTED_PARAMS, "weights", "gpus"))
    default_scorers = [{"name": n, "weight": w} for n, w in SEVEN_AXIS_WEIGHTS.items()]
    weighted_params = {k: params[k] for k in WEIGHTED_PARAMS if k in params}
    scorers = weighted_params.get("scorers", default_scorers)
    filters = weighted_params.get("filters", list(SEVEN_AXIS_FILTERS))
    weights = reader.raw("weights", {})
    if not isinstance(weights, Mapping):
        raise InvalidPolicyConfig(f"{_SEVEN_OWNER}: param 'weights' must map scorer names to weights")
    if weights and isinstance(scorers, list | tuple):
        scorers = _reweight(list(scorers), weights)
    gpus = reader.raw("gpus")
    if gpus is not None:
        if isinstance(scorers, list | tuple):
            scorers = [_with_gpus(s, gpus) for s in scorers]
        if isinstance(filters, list | tuple):
            filters = [_with_gpus(f, gpus) for f in filters]
    weighted_params["scorers"] = scorers
    weighted_params["filters"] = filters
    return build_weighted(weighted_params, ctx, owner=_SEVEN_OWNER, name="seven-axis")
