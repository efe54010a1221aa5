"""Routing policies: filters, scorers, pickers and whole routers, built through the registry.

Importing this package registers every built-in plugin:

* routers: ``round-robin``, ``random``, ``least-requests``, ``least-tokens``, ``power-of-two``,
  ``prefix-affinity``, ``weighted``, ``seven-axis`` (a weighted profile of the placement plugins),
  ``lora-aware`` (a weighted profile of ``lora-affinity`` and ``queue-depth``);
* filters: ``ready``, ``kv-below``, ``queue-below``, and from :mod:`.placement` ``gpu-generation``,
  ``kv-headroom``, ``weights-ready``;
* scorers: ``prefix-overlap``, ``queue-depth``, ``outstanding-tokens``, ``kv-usage``, and from
  :mod:`.placement` ``gpu-fit``, ``hbm-headroom``, ``weights-ready``, ``tenant-priority``,
  ``workflow-affinity``, ``latency-budget``, and from :mod:`.lora` ``lora-affinity``;
* pickers: ``max-score``, ``random-top``;
* pair routers (prefill/decode disaggregation, :mod:`.pd`): ``pd-pair``.

:func:`build_router` turns a config slice into a :class:`Router`.
"""

from tokenplane.core.routing import filters, lora, pd, pickers, placement, scorers  # noqa: F401  (registration)
from tokenplane.core.routing.base import Filter, Picker, Router, Scorer
from tokenplane.core.routing.factory import build_router
from tokenplane.core.routing.least_load import LeastRequestsRouter, LeastTokensRouter
from tokenplane.core.routing.pd import PairDecision, PairReason, PairRouter, PdPairRouter, build_pair_router
from tokenplane.core.routing.power_of_two import PowerOfTwoRouter
from tokenplane.core.routing.prefix_affinity import PrefixAffinityRouter
from tokenplane.core.routing.prefix_index import PrefixIndex
from tokenplane.core.routing.random_choice import RandomRouter
from tokenplane.core.routing.round_robin import RoundRobinRouter
from tokenplane.core.routing.weighted import WeightedRouter

__all__ = [
    "Filter",
    "LeastRequestsRouter",
    "LeastTokensRouter",
    "PairDecision",
    "PairReason",
    "PairRouter",
    "PdPairRouter",
    "Picker",
    "PowerOfTwoRouter",
    "PrefixAffinityRouter",
    "PrefixIndex",
    "RandomRouter",
    "RoundRobinRouter",
    "Router",
    "Scorer",
    "WeightedRouter",
    "build_pair_router",
    "build_router",
]
