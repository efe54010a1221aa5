"""The routing protocols shared by the twin and the gateway, and their plugin families.

``select`` is pure with respect to the policy's state: it may read it, never change it. The shell
reports what it did through ``on_routed`` (the request was sent to an instance) and ``on_finished``
(the request left that instance, finished or failed), and ``forget`` (the instance left the fleet:
removed, lost or drained away); stateful policies (round-robin's cursor, prefix-affinity's tree,
the weighted profile's prefix index and workflow affinities) change only there. Every router has
``forget``, a no-op where it keeps nothing per instance, so shells call it directly. Random choices
use the ``random.Random`` handed in at build time.

The protocols are ``runtime_checkable`` for the registry's one check when a plugin is built
(:data:`ROUTERS` and the other families); nothing checks them per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tokenplane.core.registry import Family
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo, RouteDecision


@runtime_checkable
class Router(Protocol):
    name: str

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision: ...

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None: ...

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None: ...

    def forget(self, instance_id: InstanceId) -> None:
        """Drop whatever the router keeps about ``instance_id`` (it left the fleet)."""
        ...


@runtime_checkable
class Filter(Protocol):
    """Prunes candidates (llm-d endpoint-picker style); returns the same object when it keeps all."""

    name: str

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]: ...


@runtime_checkable
class Scorer(Protocol):
    """Scores candidates in [0, 1], higher is better.

    The result is aligned with ``candidates`` (``scores[i]`` belongs to ``candidates[i]``) rather than
    a mapping by instance id: a list per scorer per request is cheaper than a dict on the hot path.
    """

    name: str

    def score(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[float]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses one candidate index from the profile's total scores (one per candidate, non-empty)."""

    name: str

    def pick(self, scores: Sequence[float]) -> int: ...


ROUTERS: Family[Router] = Family("router", Router)
FILTERS: Family[Filter] = Family("filter", Filter)
SCORERS: Family[Scorer] = Family("scorer", Scorer)
PICKERS: Family[Picker] = Family("picker", Picker)
