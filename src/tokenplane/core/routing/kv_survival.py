"""How much of an exact prefix match is still cached when the request is admitted.

An engine's KV events say which leading prompt blocks it holds *now*; what the request reuses is
what it still holds when the engine admits it. With KV pressure the two part: a request that waits
in the engine's queue has its prefix blocks unreferenced (nothing running uses its own history),
and vLLM's LRU hands unreferenced blocks to the running requests and to those admitted ahead of
it. No KV event announces that in advance, so the estimate reads the instance's load instead.

:func:`surviving_prefix_tokens`, per instance, from its view:

* ``W``, the in-flight work's KV footprint: the control planes' ``outstanding_tokens`` (prompt
  plus the most output of every request in flight there: the freshest figure), this one's own plus
  what the other gateway replicas share (``peer_outstanding_*``, as of the state backend's last
  sync; 0 with one replica or none shared). Where the instance reports more requests
  (``running + waiting``) than those control planes have in flight, others send to it as well:
  ``W`` is scaled by reported / known. With nothing known in flight, ``W`` is 0 (a reported count
  alone is too stale to act on).
* ``D = W + (prompt - matched) + max_output``: the footprint once this request runs (the matched
  blocks it reuses are not counted again).
* With ``W = 0`` (nothing queued ahead) or ``D <= capacity`` (everything fits) the whole match
  survives. Otherwise ``matched × sqrt(capacity / D)``: the more the in-flight work overcommits
  the cache, the less of the match is left. The square root is fitted, not derived: in the
  emulated fleet (``bench/exact_prefix_routing.py``, 5,000-token caches) a queued request loses
  its own history and keeps the part that running requests share (a system prompt), so the loss
  levels off well short of the whole match; ``capacity / D`` alone over-discounts the heavily
  loaded cases. Calibrated on seeds 1-3, checked on others; see the README.

Unknown capacity (``kv_capacity_tokens`` 0) or no match: the match as reported. The result never
exceeds ``matched`` and never rises as ``W`` grows (more queued work, fewer surviving tokens).

Pure: reads the views, nothing else. Cost O(1) per instance.
"""

from __future__ import annotations

import math

from tokenplane.core.views import InstanceView, RequestInfo


def queued_kv_tokens(view: InstanceView) -> float:
    """The in-flight work's KV footprint on the instance, in tokens (``W`` above)."""
    known = view.outstanding_requests + view.peer_outstanding_requests
    if known <= 0:
        return 0.0
    tokens = float(view.outstanding_tokens + view.peer_outstanding_tokens)
    reported = view.running + view.waiting
    if reported > known:
        tokens *= reported / known
    return tokens


def surviving_prefix_tokens(matched: int, request: RequestInfo, view: InstanceView) -> int:
    """Of ``matched`` leading tokens the instance holds now, those expected when it admits ``request``."""
    capacity = view.kv_capacity_tokens
    if matched <= 0 or capacity <= 0:
        return matched
    queued = queued_kv_tokens(view)
    if queued <= 0.0:
        return matched
    demand = queued + max(0, request.prompt_tokens - matched) + request.max_output_tokens
    if demand <= capacity:
        return matched
    return min(matched, int(matched * math.sqrt(capacity / demand)))
