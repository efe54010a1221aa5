"""LoRA-aware routing: send a request for an adapter where that adapter is already loaded.

An instance serves a bounded number of adapters at once (vLLM's ``--max-loras``); a request for an
adapter that is not resident costs a load before its prefill and, when every slot is taken, evicts
another adapter that later requests will have to load again.

* scorer ``lora-affinity``: 1 for an instance that holds the request's adapter, ``free_slot_score``
  (default 0.5) for one that would load it into a free slot, 0 for one that would have to evict
  (it already holds ``max_adapters``). 1 for every candidate when the request names no adapter.
  "Holds" is the union of what the instance reports (``InstanceView.adapters``) and the scorer's
  own record of where it sent each adapter (an LRU of ``max_adapters`` per instance, updated in
  ``on_routed``): reports lag, and the record covers the requests sent since the last one.
  Params: ``max_adapters`` (int >= 0, default 0: the limit is unknown and no instance counts as
  full; the record then keeps at most 64 per instance), ``free_slot_score`` (in [0, 1]).
* router ``lora-aware``: a weighted profile (:mod:`.weighted`) of ``lora-affinity`` (weight 1)
  and ``queue-depth`` (weight 1), so affinity is balanced against load: an instance holding the
  adapter but carrying the fleet's deepest queue ties with an idle instance that must evict.
  Params: ``max_adapters`` (handed to the default ``lora-affinity``) and every ``weighted`` param.

Cost: one set lookup or two per candidate. How it fails: the record is the router's guess, not the
engine's state; an engine that evicts differently (other traffic, a restart) is seen only at the
next report. Hot adapters concentrate on the instances that hold them until their queues even out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import ROUTERS, SCORERS
from tokenplane.core.routing.weighted import WEIGHTED_PARAMS, WeightedRouter, build_weighted
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo

DEFAULT_FREE_SLOT_SCORE = 0.5
UNBOUNDED_RECORD = 64  # adapters remembered per instance when the slot limit is unknown


class LoraAffinityScorer:
    name = "lora-affinity"

    def __init__(self, max_adapters: int = 0, free_slot_score: float = DEFAULT_FREE_SLOT_SCORE) -> None:
        if max_adapters < 0:
            raise ValueError(f"max_adapters must be >= 0, got {max_adapters}")
        if not 0.0 <= free_slot_score <= 1.0:
            raise ValueError(f"free_slot_score must be in [0, 1], got {free_slot_score}")
        self.max_adapters = max_adapters
        self.free_slot_score = free_slot_score
        # instance -> adapters sent there, least recently sent first (dicts keep insertion order)
        self._sent: dict[InstanceId, dict[str, None]] = {}

    def held(self, view: InstanceView) -> frozenset[str]:
        """What the scorer believes ``view`` holds: its report plus the record of what was sent."""
        sent = self._sent.get(view.instance_id)
        return view.adapters.union(sent) if sent else view.adapters

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        adapter = request.adapter
        if adapter is None:
            return [1.0] * len(candidates)
        limit = self.max_adapters
        free = self.free_slot_score
        out: list[float] = []
        for view in candidates:
            held = self.held(view)
            if adapter in held:
                out.append(1.0)
            elif limit and len(held) >= limit:
                out.append(0.0)
            else:
                out.append(free)
        return out

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        adapter = request.adapter
        if adapter is None:
            return
        sent = self._sent.setdefault(instance_id, {})
        sent.pop(adapter, None)
        sent[adapter] = None  # most recent last
        bound = self.max_adapters or UNBOUNDED_RECORD
        while len(sent) > bound:
            del sent[next(iter(sent))]

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        pass  # an adapter stays resident after its requests finish

    def forget(self, instance_id: InstanceId) -> None:
        self._sent.pop(instance_id, None)


@register(SCORERS, "lora-affinity")
def _build_scorer(params: Mapping[str, Any], ctx: BuildContext) -> LoraAffinityScorer:
    reader = ParamReader("scorer 'lora-affinity'", params, ("max_adapters", "free_slot_score"))
    return LoraAffinityScorer(
        reader.int_("max_adapters", 0, min_value=0),
        reader.float_("free_slot_score", DEFAULT_FREE_SLOT_SCORE, min_value=0.0, max_value=1.0),
    )


_OWNER = "router 'lora-aware'"


@register(ROUTERS, "lora-aware")
def _build_router(params: Mapping[str, Any], ctx: BuildContext) -> WeightedRouter:
    reader = ParamReader(_OWNER, params, (*WEIGHTED_PARAMS, "max_adapters"))
    max_adapters = reader.int_("max_adapters", 0, min_value=0)
    defaults = (
        {"name": "lora-affinity", "weight": 1.0, "params": {"max_adapters": max_adapters}},
        {"name": "queue-depth", "weight": 1.0},
    )
    weighted = {k: params[k] for k in WEIGHTED_PARAMS if k in params}
    return build_weighted(weighted, ctx, owner=_OWNER, name="lora-aware", default_scorers=defaults)
