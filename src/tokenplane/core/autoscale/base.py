"""The autoscaler protocol every policy (tokenplane, hpa, static) implements.

The shell's loop, every ``decision_interval_s`` and whenever an instance finishes warming::

    scaler.observe(signal, spec)                  # learn (capacity estimate); state changes here
    decision = scaler.decide(signal, spec, now=now)   # pure: reads signal, spec and state
    carry out decision.actions                    # the shell's actuator
    scaler.commit(decision, now=now)              # record it (cooldowns, stabilisation windows)

``decide`` never changes state, so a dry run (decide without commit) is exactly the live decision,
and calling it twice gives the same answer. ``state`` is an immutable snapshot for tests and logs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tokenplane.core.autoscale.decision import ScaleDecision
from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec
from tokenplane.core.registry import Family


@runtime_checkable
class Autoscaler(Protocol):
    name: str

    @property
    def state(self) -> object: ...

    def observe(self, signal: PoolSignal, spec: PoolSpec) -> None: ...

    def decide(self, signal: PoolSignal, spec: PoolSpec, *, now: float) -> ScaleDecision: ...

    def commit(self, decision: ScaleDecision, *, now: float) -> None: ...


AUTOSCALERS: Family[Autoscaler] = Family("autoscaler", Autoscaler)
"""The registry's family of autoscaler plugins (``register(AUTOSCALERS, name)``)."""
