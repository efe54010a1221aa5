"""Scorers for weighted profiles (kind ``scorer``): a score in [0, 1] per candidate, higher is better.

Every score is clamped to [0, 1] (NaN counts as 0, the worst), so a bad report from one instance
cannot dominate a profile's weighted sum. Results are lists aligned with the candidates.

* ``prefix-overlap``: matched prefix blocks / ``len(block_hashes)``, read from a
  :class:`~tokenplane.core.routing.prefix_index.PrefixIndex` (the same structure prefix-affinity
  uses). The weighted router owns the index, binds it here at build time and updates it in its
  ``on_routed``; a scorer built on its own gets a private, empty index. 0 for every candidate when
  the request has no full block. Cost: the index walk plus one dict read per candidate. In precise
  mode (``RequestInfo.cached_prefix_tokens`` filled from the engines' KV events) the score is an
  instance's cached leading tokens / ``prompt_tokens`` instead, and the index is not read; with
  ``queue_discount`` (default true) only the cached tokens expected to survive the instance's queue
  count, by the rule ``prefix-affinity`` uses
  (:func:`~tokenplane.core.routing.kv_survival.surviving_prefix_tokens`).
* ``queue-depth``: ``1 − (waiting + running) / max`` over the candidates; 1 for all when the max is 0.
* ``outstanding-tokens``: ``1 − outstanding_tokens / max`` over the candidates; 1 for all when 0.
* ``kv-usage``: ``1 − kv_usage``.

Only ``prefix-overlap`` takes a param (``queue_discount``, bool). Relative scorers (queue-depth,
outstanding-tokens) are normalised by the current maximum, so they rank well but say nothing
absolute: one idle instance among saturated ones scores 1 just like an idle instance in an idle
fleet. Cost: one pass over the candidates each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tokenplane.core.params import ParamReader, no_params
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import SCORERS
from tokenplane.core.routing.kv_survival import surviving_prefix_tokens
from tokenplane.core.routing.prefix_index import PrefixIndex
from tokenplane.core.views import InstanceView, RequestInfo


@runtime_checkable
class PrefixIndexConsumer(Protocol):
    """A scorer that reads a prefix index its router owns and keeps up to date."""

    def bind_prefix_index(self, index: PrefixIndex) -> None: ...


class PrefixOverlapScorer:
    name = "prefix-overlap"

    def __init__(self, index: PrefixIndex | None = None, *, queue_discount: bool = True) -> None:
        self.index = index if index is not None else PrefixIndex()
        self.queue_discount = queue_discount

    def bind_prefix_index(self, index: PrefixIndex) -> None:
        self.index = index

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        exact = request.cached_prefix_tokens
        if exact is not None:  # precise mode: the engines' reported caches, in tokens
            total_tokens = max(1, request.prompt_tokens)
            get = exact.get
            if not self.queue_discount:
                return [min(1.0, get(v.instance_id, 0) / total_tokens) for v in candidates]
            return [
                min(1.0, surviving_prefix_tokens(get(v.instance_id, 0), request, v) / total_tokens)
                for v in candidates
            ]
        hashes = request.block_hashes
        depths = self.index.match(hashes) if hashes else None
        if not depths:
            return [0.0] * len(candidates)
        total = len(hashes)
        get = depths.get
        return [get(v.instance_id, 0) / total for v in candidates]


def _relative(loads: list[int]) -> list[float]:
    top = max(loads, default=0)
    if top <= 0:
        return [1.0] * len(loads)
    # load / top <= 1 exactly when load <= top (division is correctly rounded), so >= 0 needs no clamp
    return [1.0 if load <= 0 else 1.0 - load / top for load in loads]


class QueueDepthScorer:
    name = "queue-depth"

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        return _relative([v.waiting + v.running for v in candidates])


class OutstandingTokensScorer:
    name = "outstanding-tokens"

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        return _relative([v.outstanding_tokens for v in candidates])


class KvUsageScorer:
    name = "kv-usage"

    def score(self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float) -> list[float]:
        scores = [1.0 - v.kv_usage for v in candidates]
        return [s if 0.0 <= s <= 1.0 else (1.0 if s > 1.0 else 0.0) for s in scores]  # NaN -> 0


@register(SCORERS, "prefix-overlap")
def _build_prefix(params: Mapping[str, Any], ctx: BuildContext) -> PrefixOverlapScorer:
    reader = ParamReader("scorer 'prefix-overlap'", params, ("queue_discount",))
    return PrefixOverlapScorer(queue_discount=reader.bool_("queue_discount", True))


@register(SCORERS, "queue-depth")
def _build_queue(params: Mapping[str, Any], ctx: BuildContext) -> QueueDepthScorer:
    no_params("scorer 'queue-depth'", params)
    return QueueDepthScorer()


@register(SCORERS, "outstanding-tokens")
def _build_tokens(params: Mapping[str, Any], ctx: BuildContext) -> OutstandingTokensScorer:
    no_params("scorer 'outstanding-tokens'", params)
    return OutstandingTokensScorer()


@register(SCORERS, "kv-usage")
def _build_kv(params: Mapping[str, Any], ctx: BuildContext) -> KvUsageScorer:
    no_params("scorer 'kv-usage'", params)
    return KvUsageScorer()
