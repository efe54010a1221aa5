"""The routing protocol shared by the twin and the gateway.

``select`` is pure with respect to the policy's state: it may read it, never change it. The shell
reports what it did through ``on_routed`` (the request was sent to an instance) and ``on_finished``
(the request left that instance, finished or failed); stateful policies (round-robin's cursor,
prefix-affinity's tree) change only there. Random choices use the ``random.Random`` handed in at
build time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenplane.core.views import InstanceId, InstanceView, RequestInfo, RouteDecision


class Router(Protocol):
    name: str

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision: ...

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None: ...

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None: ...


class Filter(Protocol):
    """Prunes candidates (llm-d endpoint-picker style); returns the same object when it keeps all."""

    name: str

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]: ...


class Scorer(Protocol):
    """Scores candidates in [0, 1], higher is better.

    The result is aligned with ``candidates`` (``scores[i]`` belongs to ``candidates[i]``) rather than
    a mapping by instance id: a list per scorer per request is cheaper than a dict on the hot path.
    """

    name: str

    def score(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[float]: ...


class Picker(Protocol):
    """Chooses one candidate index from the profile's total scores (one per candidate, non-empty)."""

    name: str

    def pick(self, scores: Sequence[float]) -> int: ...
