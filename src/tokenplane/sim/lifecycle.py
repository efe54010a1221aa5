"""Instance lifecycle in the twin: which instances hold a GPU, which are loaded, which are routed to.

States and transitions (times from the instance's group, see :class:`Timings`)::

    stopped ──start_cold──▶ warming ──(cold_start_s)──▶ warm ──activate──▶ activating
       ▲  ▲                                              │  ▲                   │ (warm_activation_s)
       │  └──cancel_warming (at once: no work, no drain)─ warming                 │
       └───────────────stop_warm─────────────────────────┘  │                   ▼
       └──────────────drain (after in-flight work)── draining ◀──drain──── serving
                                                            └─park: back to warm ┘

Only ``serving`` instances are ready (router candidates); every other state sets the engine's
``ready = False``, so a request can never reach an instance whose weights are not loaded.
``weights`` in the instance's view is ``warm`` (serving, activating, warm, draining), ``warming``
(cold start in progress) or ``cold`` (stopped).

A warming instance can be cancelled (as a platform deletes a pod that is still starting): it
never was ready, so it has nothing in flight, and it stops holding a GPU at the cancel; its pending
landing is void.

GPU cost: every state but ``stopped`` holds a GPU. :meth:`Lifecycle.held_s` integrates that per
instance; the runner writes it into ``InstanceRecord.alive_s``, so ``gpu_hours`` and the cost in
the report count exactly the time instances held GPUs.

Cold start time: ``cold_start_s`` when configured, else ``start_s + weight bytes / load bandwidth``
(e.g. Llama-3-8B, 16 GB at 2 GB/s plus 60 s: 68 s; Llama-3-70B, 141 GB: 131 s).

Without an autoscaler a landed cold start goes straight into service; with one it lands in the
warm pool and ``on_landed`` lets the autoscaler decide at once (the core's protocol).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenplane.sim.engine import ContinuousEngine
from tokenplane.sim.kernel import EventLoop

STOPPED = "stopped"
WARMING = "warming"
WARM = "warm"
ACTIVATING = "activating"
SERVING = "serving"
DRAINING = "draining"

STATES = (STOPPED, WARMING, WARM, ACTIVATING, SERVING, DRAINING)
_WEIGHTS = {
    STOPPED: "cold",
    WARMING: "warming",
    WARM: "warm",
    ACTIVATING: "warm",
    SERVING: "warm",
    DRAINING: "warm",
}


@dataclass(frozen=True, slots=True)
class Timings:
    cold_start_s: float
    warm_activation_s: float


def cold_start_seconds(weight_bytes: float, *, start_s: float, load_gb_per_s: float) -> float:
    """Fixed start time plus loading the weights at ``load_gb_per_s`` (GB = 1e9 bytes)."""
    return start_s + weight_bytes / (load_gb_per_s * 1e9)


class Lifecycle:
    """Owns each engine's lifecycle state; changes ``ready``/``weights`` and tells the fleet."""

    def __init__(
        self,
        loop: EventLoop,
        engines: Sequence[ContinuousEngine],
        timings: Sequence[Timings],
        initial: Sequence[str],
        *,
        land_to_warm: bool,
        on_landed: Callable[[float], None] | None = None,
        on_stopped: Callable[[str], None] | None = None,
    ) -> None:
        if not (len(engines) == len(timings) == len(initial)):
            raise ValueError("one timing and one initial state per engine")
        self.loop = loop
        self.engines = list(engines)
        self.timings = list(timings)
        self.land_to_warm = land_to_warm
        self.on_landed = on_landed
        # Called with an instance's id when it stops (it left the fleet): the router forgets it,
        # as the gateway's does when its autoscaler removes an instance.
        self.on_stopped = on_stopped
        n = len(self.engines)
        self.state = [STOPPED] * n
        self._held_spans: list[list[tuple[float, float]]] = [[] for _ in range(n)]  # ended holds
        self._held_since: list[float | None] = [None] * n
        self._version = [0] * n
        self._park = [False] * n
        self.draining = 0
        self.transitions: list[tuple[float, str, str]] = []  # (t, instance id, new state)
        self.index = {e.id: i for i, e in enumerate(self.engines)}
        for i, s in enumerate(initial):
            if s not in (STOPPED, WARMING, WARM, SERVING):
                raise ValueError(f"initial state must be stopped, warming, warm or serving, got {s!r}")
            if s == WARMING:
                self.start_cold(i, 0.0)
            else:
                self._set(i, s, 0.0)

    # -- queries -------------------------------------------------------------------------------
    def ids_in(self, state: str) -> list[int]:
        return [i for i, s in enumerate(self.state) if s == state]

    def count(self, state: str) -> int:
        return sum(1 for s in self.state if s == state)

    def held_s(self, i: int, now: float) -> float:
        """Seconds instance ``i`` held a GPU up to ``now``: a hold that a decision after ``now`` (the
        run's last activity) began or ended is cut at ``now``, as the static fleet's cost is."""
        since = self._held_since[i]
        held = math.fsum(max(0.0, min(end, now) - start) for start, end in self._held_spans[i])
        return held + (max(0.0, now - since) if since is not None else 0.0)

    def holding(self) -> int:
        return sum(1 for s in self.state if s != STOPPED)

    # -- transitions ---------------------------------------------------------------------------
    def _set(self, i: int, state: str, now: float) -> None:
        old = self.state[i]
        if (old == STOPPED) != (state == STOPPED):
            if state == STOPPED:
                since = self._held_since[i]
                if since is not None:
                    self._held_spans[i].append((since, now))
                self._held_since[i] = None
            else:
                self._held_since[i] = now
        if old == DRAINING:
            self.draining -= 1
        if state == DRAINING:
            self.draining += 1
        self.state[i] = state
        self.transitions.append((now, self.engines[i].id, state))
        self._version[i] += 1
        e = self.engines[i]
        e.ready = state == SERVING
        e.weights = _WEIGHTS[state]
        e.changed.add(e.index)
        if state == STOPPED and old != STOPPED and self.on_stopped is not None:
            self.on_stopped(e.id)

    def start_cold(self, i: int, now: float) -> None:
        if self.state[i] != STOPPED:
            raise ValueError(f"{self.engines[i].id}: cold start from {self.state[i]}")
        self._set(i, WARMING, now)
        self.loop.schedule(now + self.timings[i].cold_start_s, self._landed, (i, self._version[i]))

    def cancel_warming(self, i: int, now: float) -> None:
        """Stop ``i`` while it is still warming: it stops holding a GPU now and never lands."""
        if self.state[i] != WARMING:
            raise ValueError(f"{self.engines[i].id}: cancel from {self.state[i]}")
        self._set(i, STOPPED, now)  # bumps the version: the scheduled landing is void

    def warming_newest_first(self) -> list[int]:
        """Warming instances, most recently started first (the least of a cold start lost)."""
        ids = self.ids_in(WARMING)
        return sorted(ids, key=lambda i: (-(self._held_since[i] or 0.0), -i))

    def _landed(self, now: float, arg: tuple[int, int]) -> None:
        i, version = arg
        if self._version[i] != version:
            return
        self._set(i, WARM if self.land_to_warm else SERVING, now)
        if self.on_landed is not None:
            self.on_landed(now)

    def activate(self, i: int, now: float) -> None:
        if self.state[i] != WARM:
            raise ValueError(f"{self.engines[i].id}: activation from {self.state[i]}")
        delay = self.timings[i].warm_activation_s
        if delay <= 0:
            self._set(i, SERVING, now)
            return
        self._set(i, ACTIVATING, now)
        self.loop.schedule(now + delay, self._activated, (i, self._version[i]))

    def _activated(self, now: float, arg: tuple[int, int]) -> None:
        i, version = arg
        if self._version[i] == version:
            self._set(i, SERVING, now)

    def drain(self, i: int, now: float, *, park: bool) -> None:
        """Stop routing to ``i``; stop it (or park it warm) once its in-flight work is done."""
        if self.state[i] not in (SERVING, ACTIVATING):
            raise ValueError(f"{self.engines[i].id}: drain from {self.state[i]}")
        self._park[i] = park
        self._set(i, DRAINING, now)
        self.check_drained(i, now)

    def check_drained(self, i: int, now: float) -> None:
        if self.state[i] != DRAINING:
            return
        e = self.engines[i]
        if e.running or e.waiting:
            return
        self._set(i, WARM if self._park[i] else STOPPED, now)

    def check_all_drained(self, now: float) -> None:
        if self.draining:
            for i in self.ids_in(DRAINING):
                self.check_drained(i, now)

    def stop_warm(self, i: int, now: float) -> None:
        if self.state[i] != WARM:
            raise ValueError(f"{self.engines[i].id}: stop from {self.state[i]}")
        self._set(i, STOPPED, now)
