"""The live control loop: observe → decide → act → commit, every ``interval_s``, beside the gateway.

Each :meth:`ControlLoop.step`:

1. ``actuator.list()``: instances that finished warming move *warming → warm* (with a count-only
   actuator, *warming → serving*: its platform routes to every ready replica); instances that
   vanished (a process died, a pod was deleted) are forgotten and removed from the gateway's pool.
2. ``signal_source.sample(now)``: the gateway's views, queue, arrivals and SLO attainment. Draining
   instances whose ``outstanding_requests`` reached 0 (or that drained for ``max_drain_s``) are
   removed from the gateway's pool, then stopped (DRAIN) or parked warm (DRAIN_TO_WARM). No request
   in flight is cut.
3. A :class:`~tokenplane.core.autoscale.PoolSignal` is built as the twin's shell builds it: serving
   views from the gateway, warm/warming/draining ids from the loop's bookkeeping.
4. ``scaler.observe``, ``scaler.decide``; the actions are carried out:

   * ``START_COLD``: ``actuator.start(n)``; the new instances are *warming*;
   * ``ACTIVATE_WARM``: the oldest warm instances are registered with the gateway
     (``registry.add(url, id)``) and are *serving*;
   * ``DRAIN`` / ``DRAIN_TO_WARM``: ``registry.drain(id)``; *draining* until empty (step 2). A
     count-only instance has no gateway entry: DRAIN stops it at once (the platform drains it),
     DRAIN_TO_WARM parks it;
   * ``STOP_WARM``: the newest warm instances are stopped;
   * ``CANCEL_WARMING``: the newest warming instances are stopped while still starting (as the
     twin cancels them: never registered with the gateway, so nothing to drain).

5. ``scaler.commit`` (not in dry-run: a dry run decides exactly as the live loop would and changes
   nothing, including the scaler's cooldown clocks).

Every decision becomes a :class:`LoopEvent` (kept in :attr:`ControlLoop.events`, bounded), a log
line with its reason and note, and metrics (:class:`~tokenplane.control.metrics.LoopMetrics`).
A failed actuator or registry call is logged and counted; the next tick sees the fleet as it is
and decides again.

Instances the gateway routes to that the loop did not start (configured statically) are *adopted*
as serving when ``adopt_existing`` is on (default): they count toward the pool, and a drain removes
them from routing and releases them (they are not the actuator's to stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from enum import StrEnum

import msgspec

from tokenplane.control.actuators import Actuator, DryRunActuator, InstanceHandle, InstanceState, kv
from tokenplane.control.metrics import LoopMetrics
from tokenplane.control.registry import DryRunRegistry, PoolRegistry
from tokenplane.control.signals import SignalSample, SignalSource
from tokenplane.core.autoscale import (
    ActionKind,
    Autoscaler,
    PoolSignal,
    PoolSpec,
    ScaleAction,
    ScaleDecision,
)
from tokenplane.core.views import InstanceView

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 15.0
DEFAULT_MAX_DRAIN_S = 300.0
DEFAULT_MAX_EVENTS = 1000


class Phase(StrEnum):
    WARMING = "warming"
    WARM = "warm"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPING = "stopping"


class _Member:
    __slots__ = ("drain_started", "id", "owned", "park", "phase", "registered", "since", "url")

    def __init__(self, iid: str, phase: Phase, url: str | None, *, owned: bool, since: float) -> None:
        self.id = iid
        self.phase = phase
        self.url = url
        self.owned = owned
        self.since = since
        self.registered = not owned  # adopted instances are in the gateway's pool already
        self.park = False
        self.drain_started: float | None = None


class LoopEvent(msgspec.Struct, frozen=True):
    """One decision and what was done about it."""

    t: float
    pool: str
    reason: str
    note: str
    target_serving: int
    target_warm: int
    current_serving: int
    actions: tuple[ScaleAction, ...]
    done: dict[str, tuple[str, ...]]  # action kind -> instance ids acted on
    fleet: dict[str, int]  # phase -> count after acting
    dry_run: bool = False
    errors: tuple[str, ...] = ()

    @property
    def acted(self) -> bool:
        return any(self.done.values())


class ControlLoop:
    """Runs one autoscaler over one pool; see the module docstring."""

    def __init__(
        self,
        scaler: Autoscaler,
        spec: PoolSpec,
        actuator: Actuator,
        signal_source: SignalSource,
        *,
        registry: PoolRegistry,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        pool: str = "default",
        dry_run: bool = False,
        adopt_existing: bool = True,
        max_drain_s: float = DEFAULT_MAX_DRAIN_S,
        metrics: LoopMetrics | None = None,
        max_events: int = DEFAULT_MAX_EVENTS,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.scaler = scaler
        self.spec = spec
        self.dry_run = dry_run
        self.actuator: Actuator = (
            DryRunActuator(actuator) if dry_run and not isinstance(actuator, DryRunActuator) else actuator
        )
        self.registry: PoolRegistry = (
            DryRunRegistry(registry) if dry_run and not isinstance(registry, DryRunRegistry) else registry
        )
        self.source = signal_source
        self.interval_s = interval_s
        self.clock = clock
        self.pool = pool
        self.adopt_existing = adopt_existing
        self.max_drain_s = max_drain_s
        self.metrics = metrics
        self.events: deque[LoopEvent] = deque(maxlen=max_events)
        self._members: dict[str, _Member] = {}
        self._task: asyncio.Task[None] | None = None
        self._errors: list[str] = []

    # -- running ------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"autoscaler-{self.pool}")

    async def stop(self, *, stop_instances: bool = False) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if stop_instances:
            await self.actuator.close()

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive one bad round
                log.exception("autoscaler step failed (pool %s)", self.pool)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    def phases(self) -> dict[str, str]:
        """Instance id -> lifecycle phase, as the loop sees it now (for tests, ``top`` and logs)."""
        return {m.id: m.phase.value for m in self._members.values()}

    def _count(self) -> dict[str, int]:
        out = {"serving": 0, "warm": 0, "warming": 0, "draining": 0}
        for m in self._members.values():
            key = "draining" if m.phase in (Phase.DRAINING, Phase.STOPPING) else m.phase.value
            out[key] += 1
        return out

    def _error(self, op: str, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self._errors.append(f"{op}: {error}")
        log.warning("autoscaler error %s", kv(pool=self.pool, op=op, error=error))
        if self.metrics is not None:
            self.metrics.error(op)

    async def _guard(self, op: str, call: Awaitable[object]) -> bool:
        try:
            await call
        except Exception as exc:
            self._error(op, exc)
            return False
        return True

    # -- one tick -----------------------------------------------------------------------------------
    async def step(self) -> LoopEvent:
        self._errors = []
        now = self.clock()
        try:
            handles = await self.actuator.list()
        except Exception as exc:
            handles = None
            self._error("list", exc)
        if handles is not None:
            await self._sync(handles, now)
        sample = await self.source.sample(now)
        views = {v.instance_id: v for v in sample.instances}
        self._adopt(views, now)
        await self._finish_drains(views, now)
        signal = self.signal(sample, views, now)
        self.scaler.observe(signal, self.spec)
        decision = self.scaler.decide(signal, self.spec, now=now)
        done = await self._apply(decision, now)
        if not self.dry_run:
            self.scaler.commit(decision, now=now)
        return self._record(decision, done, now)

    async def _sync(self, handles: list[InstanceHandle], now: float) -> None:
        tracked = self.actuator.tracks_instances
        seen = set()
        for h in handles:
            seen.add(h.instance_id)
            m = self._members.get(h.instance_id)
            if m is None:
                if h.state is InstanceState.STARTING:
                    phase = Phase.WARMING
                elif h.state is InstanceState.STOPPING:
                    phase = Phase.STOPPING
                else:  # found ready: a tracked one is not routed yet; a count-only one already is
                    phase = Phase.WARM if tracked else Phase.SERVING
                self._members[h.instance_id] = _Member(h.instance_id, phase, h.url, owned=True, since=now)
                continue
            if h.url is not None:
                m.url = h.url
            if m.phase is Phase.WARMING and h.state is InstanceState.READY:
                m.phase = Phase.WARM if tracked else Phase.SERVING
                m.since = now
                log.info("autoscaler landed %s", kv(pool=self.pool, id=m.id, phase=m.phase.value))
        for m in [m for m in self._members.values() if m.owned and m.id not in seen]:
            if m.phase is not Phase.STOPPING:
                log.warning("autoscaler lost %s", kv(pool=self.pool, id=m.id, phase=m.phase.value))
            if m.registered:
                await self._guard("remove", self.registry.remove(m.id))
            del self._members[m.id]

    def _adopt(self, views: dict[str, InstanceView], now: float) -> None:
        if not (self.adopt_existing and self.actuator.tracks_instances):
            return
        for iid in views:
            if iid not in self._members:
                self._members[iid] = _Member(iid, Phase.SERVING, None, owned=False, since=now)
                log.info("autoscaler adopted %s", kv(pool=self.pool, id=iid))
        for m in [m for m in self._members.values() if not m.owned and m.id not in views]:
            del self._members[m.id]

    async def _finish_drains(self, views: dict[str, InstanceView], now: float) -> None:
        stop: list[_Member] = []
        for m in [m for m in self._members.values() if m.phase is Phase.DRAINING]:
            v = views.get(m.id)
            empty = v is None or v.outstanding_requests <= 0
            overdue = m.drain_started is not None and now - m.drain_started >= self.max_drain_s
            if not (empty or overdue):
                continue
            if overdue and not empty:
                log.warning("autoscaler drain_timeout %s", kv(pool=self.pool, id=m.id, s=self.max_drain_s))
            if m.registered:
                if not await self._guard("remove", self.registry.remove(m.id)):
                    continue
                m.registered = False
            if not m.owned:
                log.info("autoscaler released %s", kv(pool=self.pool, id=m.id))
                del self._members[m.id]
            elif m.park:
                m.phase, m.park, m.since = Phase.WARM, False, now
                log.info("autoscaler parked %s", kv(pool=self.pool, id=m.id))
            else:
                stop.append(m)
        if stop:
            await self._stop(stop)

    async def _stop(self, members: list[_Member]) -> bool:
        """Stop owned instances; on failure they keep their phase and the next tick tries again."""
        ids = [m.id for m in members]
        ok = await self._guard("stop", self.actuator.stop(ids))
        if ok and not self.dry_run:
            for iid in ids:
                self._members.pop(iid, None)  # a later list() shows any that are still stopping
        return ok

    def signal(self, sample: SignalSample, views: dict[str, InstanceView], now: float) -> PoolSignal:
        """The PoolSignal for this tick: the gateway's measurements, the loop's lifecycle."""
        by_phase: dict[Phase, list[_Member]] = {p: [] for p in Phase}
        for m in self._members.values():
            by_phase[m.phase].append(m)
        queued = sample.queued
        if self.actuator.tracks_instances:
            serving = tuple(
                views.get(m.id) or InstanceView(instance_id=m.id, ready=False)
                for m in by_phase[Phase.SERVING]
            )
        else:
            # Count-only: the gateway sees a Service, not replicas. Its backlog goes to the queue and
            # its running work and KV use are spread over the replicas.
            n = len(by_phase[Phase.SERVING])
            queued += sum(max(0, v.waiting) for v in views.values())
            running = sum(v.running for v in views.values())
            kv_use = sum(v.kv_usage for v in views.values()) / len(views) if views else 0.0
            serving = tuple(
                InstanceView(instance_id=m.id, running=running // max(1, n), kv_usage=kv_use)
                for m in by_phase[Phase.SERVING]
            )
        return PoolSignal(
            now=now,
            serving=serving,
            warm=tuple(m.id for m in by_phase[Phase.WARM]),
            warming=tuple(m.id for m in by_phase[Phase.WARMING]),
            draining=tuple(m.id for m in by_phase[Phase.DRAINING] + by_phase[Phase.STOPPING]),
            **{**sample.measures_kwargs(), "queued": queued},
        )

    async def _apply(self, decision: ScaleDecision, now: float) -> dict[str, tuple[str, ...]]:
        done: dict[str, list[str]] = {}
        for action in decision.actions:
            kind = action.kind
            ids: list[str] = []
            if kind is ActionKind.ACTIVATE_WARM:
                warm = sorted(
                    (m for m in self._members.values() if m.phase is Phase.WARM), key=lambda m: m.since
                )
                for m in warm[: action.count]:
                    if m.url is not None and not m.registered:
                        if not await self._guard("add", self.registry.add(m.url or "", m.id)):
                            continue
                        m.registered = not self.dry_run
                    if not self.dry_run:
                        m.phase, m.since = Phase.SERVING, now
                    ids.append(m.id)
            elif kind is ActionKind.START_COLD:
                try:
                    handles = await self.actuator.start(action.count)
                except Exception as exc:
                    handles = []
                    self._error("start", exc)
                for h in handles:
                    phase = Phase.WARMING if h.state is InstanceState.STARTING else Phase.WARM
                    self._members[h.instance_id] = _Member(h.instance_id, phase, h.url, owned=True, since=now)
                    ids.append(h.instance_id)
                if self.dry_run:
                    ids = [f"(new {i + 1})" for i in range(action.count)]
            elif kind in (ActionKind.STOP_WARM, ActionKind.CANCEL_WARMING):
                # the newest first: a warm one parked last, a starting one furthest from ready
                phase = Phase.WARM if kind is ActionKind.STOP_WARM else Phase.WARMING
                owned = (m for m in self._members.values() if m.phase is phase and m.owned)
                chosen = sorted(owned, key=lambda m: m.since, reverse=True)[: action.count]
                if chosen and await self._stop(chosen):
                    ids = [m.id for m in chosen]
            elif kind in (ActionKind.DRAIN, ActionKind.DRAIN_TO_WARM):
                park = kind is ActionKind.DRAIN_TO_WARM
                direct: list[_Member] = []
                for iid in action.instance_ids:
                    found = self._members.get(iid)
                    if found is None or found.phase is not Phase.SERVING:
                        continue
                    m = found
                    if not m.registered:  # count-only: nothing to drain at the gateway
                        if park:
                            if not self.dry_run:
                                m.phase, m.since = Phase.WARM, now
                            ids.append(iid)
                        else:
                            direct.append(m)
                        continue
                    if not await self._guard("drain", self.registry.drain(m.id)):
                        continue
                    if not self.dry_run:
                        m.phase, m.park, m.drain_started = Phase.DRAINING, park, now
                    ids.append(iid)
                if direct and await self._stop(direct):
                    ids += [m.id for m in direct]
            if ids:
                done[kind.value] = ids
                if self.metrics is not None:
                    self.metrics.acted(kind.value, len(ids))
        return {k: tuple(v) for k, v in done.items()}

    def _record(self, decision: ScaleDecision, done: dict[str, tuple[str, ...]], now: float) -> LoopEvent:
        fleet = self._count()
        event = LoopEvent(
            t=now,
            pool=self.pool,
            reason=decision.reason.value,
            note=decision.note,
            target_serving=decision.target_serving,
            target_warm=decision.target_warm,
            current_serving=decision.current_serving,
            actions=decision.actions,
            done=done,
            fleet=fleet,
            dry_run=self.dry_run,
            errors=tuple(self._errors),
        )
        self.events.append(event)
        if self.metrics is not None:
            self.metrics.decision(event.reason, event.target_serving, event.target_warm)
            self.metrics.fleet(fleet)
        wanted = [a for a in decision.actions if a.kind is not ActionKind.NOOP]
        line = kv(
            pool=self.pool,
            reason=event.reason,
            serving=decision.current_serving,
            target_serving=event.target_serving,
            target_warm=event.target_warm,
            actions=",".join(f"{a.kind.value}:{a.count}" for a in wanted) or "none",
            done=";".join(f"{k}:{','.join(v)}" for k, v in done.items()) or "none",
            dry_run=str(self.dry_run).lower(),
            note=decision.note or "-",
        )
        log.log(logging.INFO if wanted or event.errors else logging.DEBUG, "autoscaler decision %s", line)
        return event
