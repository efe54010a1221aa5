"""The ``seven-axis`` router: a weighted profile of the placement plugins with its own defaults.

It is :class:`~tokenplane.core.routing.weighted.WeightedRouter` (named ``seven-axis``) built from
:data:`SEVEN_AXIS_FILTERS` (hard constraints first, so that a soft filter's fallback never hides an
instance a hard one keeps) and :data:`SEVEN_AXIS_WEIGHTS`. Params: those of ``weighted``
(``filters``, ``scorers``, ``picker``, ``max_blocks_per_instance``, ``record_scores``), plus
``weights: {scorer: w}`` to reweight scorers of the profile (naming one not in it is an error) and
``gpus``, a catalogue handed to every GPU-aware filter and scorer that does not set its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import ROUTERS
from tokenplane.core.routing.weighted import WEIGHTED_PARAMS, WeightedRouter, build_weighted

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


@register(ROUTERS, "seven-axis")
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
