"""The placement scorers: one per soft axis, each a score in [0, 1] per candidate.

NaN and out-of-range reports count as the worst case; an unknown GPU is neutral. The GPU-aware
ones take the catalogue param ``gpus`` (:mod:`.catalogue`); the urgency ``u`` and the signals
they read are described in :mod:`.signals`.

* ``gpu-fit`` (axis 1, GPU type fit; params ``gpus``, ``interactive_s``, ``relaxed_s``):
  ``u × speed + (1 − u) × cheapness``, with ``speed = bw / max bw`` over the candidates (decode is
  bandwidth-bound) and ``cheapness = min cost / cost`` where cost per token ∝
  ``price_per_hour / bw`` (the view's price, else the catalogue's). Interactive work gets the
  fastest GPU, batch work the cheapest per token, standard work the best mix. Unknown GPU: 0.5.
* ``hbm-headroom`` (axis 2; params ``saturate_at`` = 0.25, ``kv_bytes_per_token`` = 131072,
  ``gpus``): the free fraction left after placing the request, ``h / saturate_at`` clamped: from KV
  tokens when the capacity is known, else from ``hbm_free_bytes`` against the catalogue's HBM,
  else ``1 − kv_usage``. It only separates near-full instances; balancing is the other scorers' job.
* Axis 3, KV-cache state, is the ``prefix-overlap`` scorer of :mod:`tokenplane.core.routing.scorers`
  (its index is owned by the router).
* ``weights-ready`` (axis 4; param ``warming_score`` = 0.3): warm 1, warming ``warming_score``,
  cold 0.
* ``tenant-priority`` (axis 5; params ``low_priority_load_weight`` β = 0.25, ``gpus``):
  ``1 − w × L_speed − (1 − w) × β × L_queue`` with importance ``w`` = 0, 0.5, 1 for
  priority ≤ -1, 0, ≥ 1; ``queue = 1 + max(outstanding_requests, running + waiting)`` (the queue
  the request would join, itself included), ``L_queue = queue / max queue`` and ``L_speed`` the same
  for ``queue / speed`` (speed: the GPU's bandwidth relative to the fastest candidate). High
  priority strongly prefers the least-loaded, fastest instance; low priority only mildly avoids
  long queues and ignores speed, so it tolerates loaded or slower instances and leaves the best
  ones to others.
* ``workflow-affinity`` (axis 6, workflow context; params ``max_workflows`` = 100000,
  ``min_affinity`` = 0.5, ``cost_scale_usd`` = 0.05): the instance that served the workflow's last
  step (it holds the workflow's KV) scores ``min_affinity + (1 − min_affinity) × (1 −
  exp(−sunk_cost_usd / cost_scale_usd))``, others 0: the more a workflow has spent, the more its
  affinity weighs. State: a bounded LRU map ``workflow_id → instance``, changed only in
  ``on_routed`` and ``forget``, which the weighted router calls.
* ``latency-budget`` (axis 7; params ``prefill_tokens_per_s`` = 20000 on an H100-class GPU,
  ``queue_s_per_request`` = 0.25, ``warming_s`` = 30, ``cold_s`` = 120, ``comfort`` = 0.5, ``gpus``):
  predicted TTFT ``t`` is the instance's ``predicted_ttft_s`` when the shell gives one, else
  ``prompt / (prefill_tokens_per_s × tflops / 989) + queued × queue_s_per_request × 3350 / bw +
  readiness``, with ``queued = max(waiting, outstanding_requests − running)`` and readiness 0,
  ``warming_s`` or ``cold_s``. Score 1 for ``t <= comfort × b``, 0 for ``t >= b``, linear between;
  1 for all without a budget, 0 for all once it is spent.

Cost: one pass over the candidates each. How they fail: they read reported signals, which lag; the
TTFT and cost models are first-order (bandwidth for decode, FLOPs for prefill, one model per
fleet), so a shell that can predict better should fill ``predicted_ttft_s``; the affinity map
remembers where a workflow was *sent*, not whether the engine kept its KV.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import SCORERS
from tokenplane.core.routing.placement.catalogue import (
    DEFAULT_GPUS,
    GIB,
    REFERENCE_BW_GBPS,
    REFERENCE_TFLOPS,
    GpuCatalogue,
    catalogue_param,
    relative_speeds,
)
from tokenplane.core.routing.placement.signals import (
    COLD,
    DEFAULT_INTERACTIVE_S,
    DEFAULT_RELAXED_S,
    WARM,
    WARMING,
    clamp01,
    free_kv_tokens,
    hbm_free_bytes,
    importance,
    kv_tokens_needed,
    predicted_ttft_s,
    remaining_budget_s,
    urgency,
    urgency_params,
    weights_state,
)
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo

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
        speeds = relative_speeds(specs)
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
            out.append(clamp01(u * speed + (1.0 - u) * cheap))
        return out


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
        return 1.0 - clamp01(view.kv_usage) if not math.isnan(view.kv_usage) else 0.0

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        sat = self.saturate_at
        return [clamp01(self.headroom(request, v) / sat) for v in candidates]


class WeightsReadyScorer:
    name = "weights-ready"

    def __init__(self, warming_score: float = DEFAULT_WARMING_SCORE) -> None:
        if not 0.0 <= warming_score <= 1.0:
            raise ValueError(f"warming_score must be in [0, 1], got {warming_score}")
        self._by_state = {WARM: 1.0, WARMING: warming_score, COLD: 0.0}

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        by_state = self._by_state
        return [by_state[weights_state(v)] for v in candidates]


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
        speeds = relative_speeds([self.catalogue.lookup(v.gpu) for v in candidates])
        queues = [1 + max(0, v.outstanding_requests, v.running + v.waiting) for v in candidates]
        slowed = [q / speed for q, speed in zip(queues, speeds, strict=True)]
        top_q, top_s = max(queues), max(slowed)
        w = importance(request)
        low = (1.0 - w) * self.beta
        return [
            clamp01(1.0 - w * (qs / top_s) - low * (q / top_q)) for q, qs in zip(queues, slowed, strict=True)
        ]


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
        return clamp01(self.min_affinity + (1.0 - self.min_affinity) * grown)

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
            out.append(1.0 if ratio <= comfort else clamp01((1.0 - ratio) / (1.0 - comfort)))
        return out


# -- registration --------------------------------------------------------------------------------


@register(SCORERS, "gpu-fit")
def _build_gpu_fit(params: Mapping[str, Any], ctx: BuildContext) -> GpuFitScorer:
    reader = ParamReader("scorer 'gpu-fit'", params, ("gpus", "interactive_s", "relaxed_s"))
    interactive, relaxed = urgency_params(reader)
    return GpuFitScorer(catalogue_param(reader), interactive_s=interactive, relaxed_s=relaxed)


@register(SCORERS, "hbm-headroom")
def _build_hbm_headroom(params: Mapping[str, Any], ctx: BuildContext) -> HbmHeadroomScorer:
    reader = ParamReader("scorer 'hbm-headroom'", params, ("gpus", "saturate_at", "kv_bytes_per_token"))
    return HbmHeadroomScorer(
        catalogue_param(reader),
        saturate_at=reader.float_(
            "saturate_at", DEFAULT_SATURATE_AT, min_value=0.0, exclusive_min=True, max_value=1.0
        ),
        kv_bytes_per_token=reader.int_("kv_bytes_per_token", DEFAULT_KV_BYTES_PER_TOKEN, min_value=1),
    )


@register(SCORERS, "weights-ready")
def _build_weights_scorer(params: Mapping[str, Any], ctx: BuildContext) -> WeightsReadyScorer:
    reader = ParamReader("scorer 'weights-ready'", params, ("warming_score",))
    return WeightsReadyScorer(
        reader.float_("warming_score", DEFAULT_WARMING_SCORE, min_value=0.0, max_value=1.0)
    )


@register(SCORERS, "tenant-priority")
def _build_tenant_priority(params: Mapping[str, Any], ctx: BuildContext) -> TenantPriorityScorer:
    reader = ParamReader("scorer 'tenant-priority'", params, ("gpus", "low_priority_load_weight"))
    return TenantPriorityScorer(
        catalogue_param(reader),
        low_priority_load_weight=reader.float_(
            "low_priority_load_weight", DEFAULT_LOW_PRIORITY_LOAD_WEIGHT, min_value=0.0, max_value=1.0
        ),
    )


@register(SCORERS, "workflow-affinity")
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


@register(SCORERS, "latency-budget")
def _build_latency_budget(params: Mapping[str, Any], ctx: BuildContext) -> LatencyBudgetScorer:
    keys = ("gpus", "prefill_tokens_per_s", "queue_s_per_request", "warming_s", "cold_s", "comfort")
    reader = ParamReader("scorer 'latency-budget'", params, keys)
    return LatencyBudgetScorer(
        catalogue_param(reader),
        prefill_tokens_per_s=reader.float_(
            "prefill_tokens_per_s", DEFAULT_PREFILL_TOKENS_PER_S, min_value=0.0, exclusive_min=True
        ),
        queue_s_per_request=reader.float_("queue_s_per_request", DEFAULT_QUEUE_S_PER_REQUEST, min_value=0.0),
        warming_s=reader.float_("warming_s", DEFAULT_WARMING_S, min_value=0.0),
        cold_s=reader.float_("cold_s", DEFAULT_COLD_S, min_value=0.0),
        comfort=reader.float_("comfort", DEFAULT_COMFORT, min_value=0.0, max_value=0.99),
    )
