"""Prefix affinity: send a request where its prompt prefix is probably cached, unless load is skewed.

In the style of SGLang's cache-aware router (sgl-router), over the shared :class:`PrefixIndex`.

Algorithm, per request over the usable candidates:

1. Load check. With ``load`` = ``outstanding_requests``, if ``max − min > balance_abs_threshold`` and
   ``max > min × balance_rel_threshold`` the fleet is imbalanced: route to the least-loaded instance
   (reason ``LOAD_IMBALANCE``), ignoring the cache.
2. Match. Walk the request's ``block_hashes`` through the index; an instance's match ratio is
   matched blocks / ``len(block_hashes)``. If the best ratio exceeds ``cache_threshold``, route to
   the best-matching instance, ties → fewer outstanding requests, then lowest index
   (``PREFIX_MATCH``). In precise mode (the shell fills ``RequestInfo.cached_prefix_tokens`` from the
   engines' own KV-cache reports) an instance's ratio is its cached leading tokens /
   ``prompt_tokens`` instead, and the reason ``KV_CACHE_MATCH``; with ``queue_discount`` (the
   default) only the cached tokens expected to survive until the engine admits the request count
   (:func:`~tokenplane.core.routing.kv_survival.surviving_prefix_tokens`: a queue that overcommits
   the instance's KV cache evicts a waiting request's prefix), so a loaded instance's match is
   worth less, and another instance's shorter one may win.
3. Miss. Otherwise route to the least-loaded instance, ties → lowest index
   (``PREFIX_MISS_LEAST_LOADED``; ``KV_CACHE_MISS_LEAST_LOADED`` in precise mode). SGLang picks
   the instance with the smallest tree instead; we pick by outstanding requests because that is
   the current signal (tree size is history, and with a bounded, evicting index every busy
   instance's tree converges to the bound anyway).

``on_routed`` inserts the request's chain for the chosen instance with last-access ``now``;
``select`` only reads the index. ``on_finished`` does nothing: a finished request's prefix stays in
the engine's cache, which is the point. ``forget(instance_id)`` drops an instance's entries (call it
when an instance is removed or restarted).

Params:

* ``cache_threshold`` (float in [0, 1], default 0.5): minimum match ratio, strictly exceeded.
* ``kv_cache_threshold`` (float in [0, 1], default 0.0): the same in precise mode. A reported hit
  is real (the approximate index's is a guess that drifts), so any cached leading block is worth
  going for unless load is skewed: with pressure on the KV cache, a conversation's instance keeps
  its leading blocks longest, and a threshold would send it to an instance holding nothing.
* ``queue_discount`` (bool, default true): precise mode counts only the surviving cached tokens
  (above); false: the reported ones.
* ``balance_abs_threshold`` (number >= 0, default 32): absolute outstanding-request gap.
* ``balance_rel_threshold`` (number >= 1, default 1.5): relative gap (max > min × this).
* ``max_blocks_per_instance`` (int >= 1, default 200_000): index bound per instance; two-generation
  approximate LRU eviction, leaves first (see :mod:`~tokenplane.core.routing.prefix_index`).

Cost: ``select`` is one bisection walk of the request's chain through the index (O(log blocks) per
point where holders drop out, see :mod:`~tokenplane.core.routing.prefix_index`) and one pass over
the candidates that reads loads and tests membership in the (usually tiny) set of best-matching
instances; only when every best match is unusable does a second pass read each candidate's depth.
Precise mode with ``queue_discount`` adds one pass over the candidates (O(1) each) before that.
``on_routed`` O(len(block_hashes)). Memory O(instances × ``max_blocks_per_instance``).

How it fails: the index records routing, not engine caches, so it drifts when engines evict
differently or restart (bounded by its own eviction, and by ``forget``). A popular prefix pins
traffic to one instance until the imbalance thresholds trip, so thresholds too loose give hot spots
and too tight throw away cache hits. Requests with no full block (empty ``block_hashes``) always miss.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import ROUTERS
from tokenplane.core.routing.candidates import NO_CANDIDATES
from tokenplane.core.routing.kv_survival import surviving_prefix_tokens
from tokenplane.core.routing.prefix_index import DEFAULT_MAX_BLOCKS_PER_INSTANCE, PrefixIndex
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo, RouteDecision, RouteReason

DEFAULT_CACHE_THRESHOLD = 0.5
DEFAULT_KV_CACHE_THRESHOLD = 0.0
DEFAULT_BALANCE_ABS_THRESHOLD = 32.0
DEFAULT_BALANCE_REL_THRESHOLD = 1.5


class PrefixAffinityRouter:
    name = "prefix-affinity"

    def __init__(
        self,
        *,
        cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
        kv_cache_threshold: float = DEFAULT_KV_CACHE_THRESHOLD,
        balance_abs_threshold: float = DEFAULT_BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = DEFAULT_BALANCE_REL_THRESHOLD,
        max_blocks_per_instance: int = DEFAULT_MAX_BLOCKS_PER_INSTANCE,
        queue_discount: bool = True,
    ) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if not 0.0 <= kv_cache_threshold <= 1.0:
            raise ValueError(f"kv_cache_threshold must be in [0, 1], got {kv_cache_threshold}")
        if balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {balance_abs_threshold}")
        if balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {balance_rel_threshold}")
        self.cache_threshold = cache_threshold
        self.kv_cache_threshold = kv_cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.queue_discount = queue_discount
        self.index = PrefixIndex(max_blocks_per_instance)

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        exact = request.cached_prefix_tokens
        depths: Mapping[InstanceId, int] | None
        if exact is not None:  # precise mode: what each engine reported it holds, in tokens
            depths, total = exact, max(1, request.prompt_tokens)
            if self.queue_discount and exact:
                depths = surviving_depths(request, exact, candidates)
            threshold = self.kv_cache_threshold
        else:
            hashes = request.block_hashes
            depths = self.index.match(hashes) if hashes else None
            total = len(hashes)
            threshold = self.cache_threshold
        top: Container[InstanceId] | None = None
        if depths:
            best_depth = max(depths.values())
            if best_depth / total > threshold:
                # Usually one or a few instances: a membership test per candidate is far cheaper
                # than reading every candidate's depth.
                top = depths if len(depths) == 1 else {i for i, d in depths.items() if d == best_depth}
        # One pass: the load spread, the least-loaded instance and, among the best matches, the one
        # with fewer outstanding requests (ties → the lowest index).
        least: InstanceView | None = None
        best: InstanceView | None = None
        min_load = max_load = best_load = 0
        for view in candidates:
            if not (view.ready and view.healthy):
                continue
            load = view.outstanding_requests
            if least is None:
                least = view
                min_load = max_load = load
            elif load < min_load:
                least = view
                min_load = load
            elif load > max_load:
                max_load = load
            if top is not None and view.instance_id in top and (best is None or load < best_load):
                best = view
                best_load = load
        if least is None:
            return NO_CANDIDATES
        if (
            max_load - min_load > self.balance_abs_threshold
            and max_load > min_load * self.balance_rel_threshold
        ):
            return RouteDecision(least.instance_id, RouteReason.LOAD_IMBALANCE)
        if top is not None:
            if best is None and depths is not None:
                # Rare: every best-matching instance is unusable or not a candidate.
                best = self._next_best(candidates, depths, total, threshold)
            if best is not None:
                reason = RouteReason.KV_CACHE_MATCH if exact is not None else RouteReason.PREFIX_MATCH
                return RouteDecision(best.instance_id, reason)
        miss = (
            RouteReason.KV_CACHE_MISS_LEAST_LOADED
            if exact is not None
            else RouteReason.PREFIX_MISS_LEAST_LOADED
        )
        return RouteDecision(least.instance_id, miss)

    def _next_best(
        self,
        candidates: Sequence[InstanceView],
        depths: Mapping[InstanceId, int],
        total: int,
        threshold: float,
    ) -> InstanceView | None:
        """The usable candidate with the deepest match above the threshold (ties → fewer outstanding)."""
        best: InstanceView | None = None
        best_depth = best_load = 0
        get = depths.get
        for view in candidates:
            depth = get(view.instance_id, 0)
            if depth == 0 or depth < best_depth or not (view.ready and view.healthy):
                continue
            load = view.outstanding_requests
            if depth > best_depth or load < best_load:
                best = view
                best_depth = depth
                best_load = load
        if best is None or best_depth / total <= threshold:
            return None
        return best

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        self.index.insert(instance_id, request.block_hashes, now)

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        pass

    def forget(self, instance_id: InstanceId) -> None:
        self.index.forget(instance_id)


def surviving_depths(
    request: RequestInfo, exact: Mapping[InstanceId, int], candidates: Sequence[InstanceView]
) -> dict[InstanceId, int]:
    """Each candidate's reported cached tokens that are expected to survive its queue (none: left out)."""
    out: dict[InstanceId, int] = {}
    get = exact.get
    for view in candidates:
        matched = get(view.instance_id, 0)
        if matched > 0:
            kept = surviving_prefix_tokens(matched, request, view)
            if kept > 0:
                out[view.instance_id] = kept
    return out


@register(ROUTERS, "prefix-affinity")
def _build(params: Mapping[str, Any], ctx: BuildContext) -> PrefixAffinityRouter:
    reader = ParamReader(
        "router 'prefix-affinity'",
        params,
        (
            "cache_threshold",
            "kv_cache_threshold",
            "balance_abs_threshold",
            "balance_rel_threshold",
            "max_blocks_per_instance",
            "queue_discount",
        ),
    )
    return PrefixAffinityRouter(
        cache_threshold=reader.float_(
            "cache_threshold", DEFAULT_CACHE_THRESHOLD, min_value=0.0, max_value=1.0
        ),
        kv_cache_threshold=reader.float_(
            "kv_cache_threshold", DEFAULT_KV_CACHE_THRESHOLD, min_value=0.0, max_value=1.0
        ),
        balance_abs_threshold=reader.float_(
            "balance_abs_threshold", DEFAULT_BALANCE_ABS_THRESHOLD, min_value=0.0
        ),
        balance_rel_threshold=reader.float_(
            "balance_rel_threshold", DEFAULT_BALANCE_REL_THRESHOLD, min_value=1.0
        ),
        max_blocks_per_instance=reader.int_(
            "max_blocks_per_instance", DEFAULT_MAX_BLOCKS_PER_INSTANCE, min_value=1
        ),
        queue_discount=reader.bool_("queue_discount", True),
    )
