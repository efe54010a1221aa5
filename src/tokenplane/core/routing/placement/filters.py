"""The placement filters: hard and soft constraints that prune candidates before scoring.

* ``gpu-generation`` (axis 1, GPU type fit; params ``gpus``, ``min_generation``,
  ``models: {name: {min_generation, min_hbm_gib}}``): drops instances whose generation or HBM is
  below the filter's or the model's need. A hard requirement: it may
  empty the list (``NO_CANDIDATES``). Unknown generation or HBM passes.
* ``kv-headroom`` (axis 2, HBM headroom; param ``strict``, default false): the request needs
  ``prompt_tokens + max_output_tokens`` tokens of KV; it keeps instances with
  ``(1 − kv_usage) × kv_capacity_tokens >= need`` (unknown capacity passes). If none fits now it
  keeps those whose whole capacity could hold it (they queue it), unless ``strict``; an instance
  too small ever to hold it is never kept. Conservative: it ignores prefix-cache hits.
* ``weights-ready`` (axis 4, model-weight readiness; no params): drops cold instances unless no
  warm or warming candidate could ever hold the request (every one is cold, or too small): a cold
  start beats refusing.

Each is one pass over the candidates and returns the same sequence when it keeps them all. The
signals they read are described in :mod:`.signals`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader, no_params
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import FILTERS
from tokenplane.core.routing.placement.catalogue import DEFAULT_GPUS, GpuCatalogue, catalogue_param
from tokenplane.core.routing.placement.signals import (
    COLD,
    could_ever_hold,
    free_kv_tokens,
    gpu_generation,
    kv_tokens_needed,
    weights_state,
)
from tokenplane.core.views import InstanceView, RequestInfo


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
        need_gen = max(self.min_generation, model_gen)
        if need_gen <= 0 and model_hbm <= 0:
            return candidates
        kept = []
        for v in candidates:
            gen = gpu_generation(v, self.catalogue)
            spec = self.catalogue.lookup(v.gpu)
            if (gen is None or gen >= need_gen) and (spec is None or spec.hbm_gib >= model_hbm):
                kept.append(v)
        return candidates if len(kept) == len(candidates) else kept


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


# -- registration --------------------------------------------------------------------------------


@register(FILTERS, "gpu-generation")
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
        catalogue_param(reader), min_generation=reader.int_("min_generation", 0, min_value=0), models=models
    )


@register(FILTERS, "kv-headroom")
def _build_kv_headroom(params: Mapping[str, Any], ctx: BuildContext) -> KvHeadroomFilter:
    reader = ParamReader("filter 'kv-headroom'", params, ("strict",))
    return KvHeadroomFilter(strict=reader.bool_("strict", False))


@register(FILTERS, "weights-ready")
def _build_weights_filter(params: Mapping[str, Any], ctx: BuildContext) -> WeightsReadyFilter:
    no_params("filter 'weights-ready'", params)
    return WeightsReadyFilter()
