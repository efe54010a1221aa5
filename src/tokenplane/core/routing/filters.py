"""Filters for weighted profiles (kind ``filter``): prune candidates before scoring.

Each filter returns the very same sequence when it removes nothing (no allocation), otherwise a new
list. The weighted router always drops unusable (not ready / not healthy) instances first, so
``ready`` is only needed to make that explicit in a profile.

* ``ready``: keep instances that are ready and healthy. No params.
* ``kv-below``: keep instances with ``kv_usage <= max_kv_usage`` (param, in [0, 1], default 0.9).
  If that would remove *every* candidate it keeps them all: a fleet whose caches are all full
  should still be scored (the kv-usage scorer then prefers the least full) rather than refuse work;
  refusing is admission's job.
* ``queue-below``: keep instances with ``waiting <= max_waiting`` (param, int >= 0, default 64).
  This one is a hard cap: if nothing passes, the result is empty and the router answers
  ``NO_CANDIDATES``, so the shell sheds or queues the request instead of deepening a queue.

Cost: one pass over the candidates each. How they fail: they read the instance's last *reported*
``kv_usage`` / ``waiting``, which lag; a stale report can keep or drop an instance wrongly until the
next scrape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.params import ParamReader, no_params
from tokenplane.core.registry import BuildContext, register
from tokenplane.core.routing.base import FILTERS
from tokenplane.core.routing.candidates import usable
from tokenplane.core.views import InstanceView, RequestInfo

DEFAULT_MAX_KV_USAGE = 0.9
DEFAULT_MAX_WAITING = 64


class ReadyFilter:
    name = "ready"

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]:
        return usable(candidates)


class KvBelowFilter:
    name = "kv-below"

    def __init__(self, max_kv_usage: float = DEFAULT_MAX_KV_USAGE) -> None:
        if not 0.0 <= max_kv_usage <= 1.0:
            raise ValueError(f"max_kv_usage must be in [0, 1], got {max_kv_usage}")
        self.max_kv_usage = max_kv_usage

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]:
        limit = self.max_kv_usage
        kept = [v for v in candidates if v.kv_usage <= limit]
        if not kept or len(kept) == len(candidates):
            return candidates  # all full: keep them all (see module docstring)
        return kept


class QueueBelowFilter:
    name = "queue-below"

    def __init__(self, max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.max_waiting = max_waiting

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]:
        limit = self.max_waiting
        kept = [v for v in candidates if v.waiting <= limit]
        return candidates if len(kept) == len(candidates) else kept


@register(FILTERS, "ready")
def _build_ready(params: Mapping[str, Any], ctx: BuildContext) -> ReadyFilter:
    no_params("filter 'ready'", params)
    return ReadyFilter()


@register(FILTERS, "kv-below")
def _build_kv(params: Mapping[str, Any], ctx: BuildContext) -> KvBelowFilter:
    reader = ParamReader("filter 'kv-below'", params, ("max_kv_usage",))
    return KvBelowFilter(reader.float_("max_kv_usage", DEFAULT_MAX_KV_USAGE, min_value=0.0, max_value=1.0))


@register(FILTERS, "queue-below")
def _build_queue(params: Mapping[str, Any], ctx: BuildContext) -> QueueBelowFilter:
    reader = ParamReader("filter 'queue-below'", params, ("max_waiting",))
    return QueueBelowFilter(reader.int_("max_waiting", DEFAULT_MAX_WAITING, min_value=0))
