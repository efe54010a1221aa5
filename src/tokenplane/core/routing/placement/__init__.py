"""Seven-axis placement: filters and scorers for the axes of "Operating Distributed Inference at Scale".

Traditional bin packing weighs CPU, memory and fault domains; inference placement weighs at least
seven axes. Each is a plugin of the weighted profile (filters prune, scorers return [0, 1], NaN and
out-of-range reports count as the worst case), and the ``seven-axis`` router combines them.

The axes and their plugins (the filters in :mod:`.filters`, the scorers in :mod:`.scorers`):

1. GPU type fit: scorer ``gpu-fit``, filter ``gpu-generation``;
2. HBM headroom: filter ``kv-headroom``, scorer ``hbm-headroom``;
3. KV-cache state: scorer ``prefix-overlap`` (:mod:`tokenplane.core.routing.scorers`; its prefix
   index is owned by the router);
4. model-weight readiness: filter and scorer ``weights-ready``;
5. tenant priority: scorer ``tenant-priority``;
6. workflow context: scorer ``workflow-affinity`` (the one stateful plugin);
7. latency budget: scorer ``latency-budget``.

The package, by concept:

* :mod:`.catalogue`: the GPU catalogue (datasheet figures, name matching, the ``gpus`` param);
* :mod:`.signals`: what the plugins read from the views (typed fields, operator-set labels) and
  the urgency several axes share;
* :mod:`.filters` and :mod:`.scorers`: the plugins, each registered under its name;
* :mod:`.router`: the ``seven-axis`` profile and its default weights.

Importing the package registers every plugin; the names below are its public interface.
"""

from tokenplane.core.routing.placement.catalogue import DEFAULT_GPUS, GpuCatalogue, GpuClass
from tokenplane.core.routing.placement.filters import (
    GpuGenerationFilter,
    KvHeadroomFilter,
    WeightsReadyFilter,
)
from tokenplane.core.routing.placement.router import SEVEN_AXIS_FILTERS, SEVEN_AXIS_WEIGHTS
from tokenplane.core.routing.placement.scorers import (
    GpuFitScorer,
    HbmHeadroomScorer,
    LatencyBudgetScorer,
    TenantPriorityScorer,
    WeightsReadyScorer,
    WorkflowAffinityScorer,
)
from tokenplane.core.routing.placement.signals import (
    could_ever_hold,
    free_kv_tokens,
    gpu_generation,
    hbm_free_bytes,
    importance,
    kv_tokens_needed,
    predicted_ttft_s,
    remaining_budget_s,
    urgency,
    weights_state,
)

__all__ = [
    "DEFAULT_GPUS",
    "SEVEN_AXIS_FILTERS",
    "SEVEN_AXIS_WEIGHTS",
    "GpuCatalogue",
    "GpuClass",
    "GpuFitScorer",
    "GpuGenerationFilter",
    "HbmHeadroomScorer",
    "KvHeadroomFilter",
    "LatencyBudgetScorer",
    "TenantPriorityScorer",
    "WeightsReadyFilter",
    "WeightsReadyScorer",
    "WorkflowAffinityScorer",
    "could_ever_hold",
    "free_kv_tokens",
    "gpu_generation",
    "hbm_free_bytes",
    "importance",
    "kv_tokens_needed",
    "predicted_ttft_s",
    "remaining_budget_s",
    "urgency",
    "weights_state",
]
