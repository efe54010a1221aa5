"""The shell's hooks for a router that keeps no state of its own: all three do nothing.

Least-requests, least-tokens, random and power-of-two read everything they need from the views
(the load) or from the injected ``random.Random``; they derive from :class:`StatelessHooks` and
define only ``name`` and ``select``.
"""

from __future__ import annotations

from tokenplane.core.views import InstanceId, RequestInfo


class StatelessHooks:
    """``on_routed``, ``on_finished`` and ``forget`` of :class:`~tokenplane.core.routing.base.Router`
    for a router with no per-request or per-instance state."""

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        pass

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        pass

    def forget(self, instance_id: InstanceId) -> None:
        pass  # nothing kept per instance
