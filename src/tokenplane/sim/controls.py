"""Where the core's breakers plug into the twin's request path, and where a retry may not go.

:class:`CoreControls` feeds the core's :class:`~tokenplane.core.breaker.BreakerBoard` exactly as the
gateway's ``Resilience`` does: an attempt when it is dispatched, a verdict when it ends, and
``filter_allowed`` over the views before the router sees them. :class:`ControlHooks` is the
do-nothing default (and the seam tests record through). :func:`avoid_tried` applies a plan's
``Attempt.exclude`` as ``Resilience.candidates`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenplane.core.breaker import BreakerBoard, BreakerConfig, filter_allowed
from tokenplane.core.views import InstanceView
from tokenplane.sim.faults import ControlSpec


def avoid_tried(candidates: Sequence[InstanceView], exclude: frozenset[str]) -> Sequence[InstanceView]:
    """The candidates an attempt may go to: not the instances its plan excludes (those tried).

    As in the gateway (``Resilience.candidates``), when every candidate was tried none is left and
    the request ends with no instance (the twin used to fall back to a tried one).
    """
    if not exclude:
        return candidates
    return [v for v in candidates if v.instance_id not in exclude]


class ControlHooks:
    """Where core policies plug into the shell; the defaults allow everything."""

    def on_result(self, instance_id: str, ok: bool, latency_s: float | None, *, now: float) -> None:
        return None

    def on_dispatch(self, instance_id: str, *, now: float) -> None:
        return None

    def filter_views(self, views: Sequence[InstanceView], *, now: float) -> Sequence[InstanceView]:
        return views


class CoreControls(ControlHooks):
    """The core's breakers, fed by the twin exactly as the gateway feeds them."""

    def __init__(self, board: BreakerBoard | None) -> None:
        self.board = board
        self.events: dict[str, int] = {}

    @classmethod
    def from_spec(cls, spec: ControlSpec) -> CoreControls:
        board = BreakerBoard(BreakerConfig.from_params(spec.breaker)) if spec.breaker is not None else None
        return cls(board)

    def on_dispatch(self, instance_id: str, *, now: float) -> None:
        if self.board is not None:
            self._count(self.board.on_attempt(instance_id, now=now))

    def on_result(self, instance_id: str, ok: bool, latency_s: float | None, *, now: float) -> None:
        if self.board is not None:
            self._count(self.board.on_result(instance_id, ok, latency_s, now=now))

    def filter_views(self, views: Sequence[InstanceView], *, now: float) -> Sequence[InstanceView]:
        if self.board is None:
            return views
        self._count(self.board.tick(now))
        return filter_allowed(views, self.board, now=now)

    def _count(self, events: Sequence[Any]) -> None:
        for ev in events:
            key = f"breaker_to_{ev.to_state.value}_{ev.reason.value}"
            self.events[key] = self.events.get(key, 0) + 1
