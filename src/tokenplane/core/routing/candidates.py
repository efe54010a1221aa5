"""Candidate hygiene shared by every router: drop instances that are not ready or not healthy.

:func:`usable` costs one tight pass over the candidates and allocates nothing when every instance is
usable (it returns the very same sequence object), which is the common case on a hot path that runs
once per request over the whole fleet. O(1)-ish routers (round-robin, random, power-of-two) avoid
even that pass: they check only the instance(s) they drew and fall back to :func:`usable` when a
drawn instance is unusable.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenplane.core.views import InstanceView, RouteDecision, RouteReason

NO_CANDIDATES = RouteDecision(None, RouteReason.NO_CANDIDATES)
"""The shared decision for an empty (or entirely filtered) candidate list."""


def is_usable(view: InstanceView) -> bool:
    return view.ready and view.healthy


def usable(candidates: Sequence[InstanceView]) -> Sequence[InstanceView]:
    """The candidates that are ready and healthy; the same object when none is dropped."""
    for view in candidates:
        if not (view.ready and view.healthy):
            return [v for v in candidates if v.ready and v.healthy]
    return candidates
