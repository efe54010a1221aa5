"""The fleet shell of the twin: arrivals, the core's router, engines, and records.

This is the simulator's counterpart of the gateway: it builds the same :class:`RequestInfo` and
:class:`InstanceView` values the gateway builds, asks the same router, and carries out the
decision in virtual time. Every fleet shell is built from one typed :class:`FleetContext`; the
engines report finished sequences to the fleet they are bound to (:meth:`Engine.bind`), and a
listener (the autoscaler) may follow each finish through :attr:`Fleet.after_finish`.

With ``precise_kv`` the fleet fills ``RequestInfo.cached_prefix_tokens`` from each engine's own
prefix cache (:meth:`Engine.cached_prefix_tokens`), as the gateway does from vLLM's KV events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tokenplane.core.routing.base import Router
from tokenplane.core.views import InstanceView, RequestInfo, WorkflowContext
from tokenplane.sim.engine import FinishFn, Seq
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, InstanceSample, RequestRecord, TbtHistogram
from tokenplane.sim.workloads.base import RequestSpec, Workload


class Engine(Protocol):
    """What the fleet needs of an engine (continuous or static)."""

    id: str
    record: InstanceRecord

    def bind(self, index: int, changed: set[int], on_finish: FinishFn | None = None) -> None: ...
    def cached_prefix_tokens(self, spec: RequestSpec) -> int: ...

    def fits(self, spec: RequestSpec) -> bool: ...
    def submit(self, seq: Seq, now: float) -> None: ...
    def view(self) -> InstanceView: ...
    def busy_seconds(self, now: float) -> float: ...


@dataclass(frozen=True, slots=True)
class FleetContext:
    """What every fleet shell is built from (``runner.simulate`` builds it from a run's settings)."""

    loop: EventLoop
    engines: Sequence[Engine]
    router: Router
    workload: Workload
    model: str
    block_size: int
    tbt: TbtHistogram
    sample_interval_s: float = 10.0
    precise_kv: bool = False


@dataclass(slots=True)
class FleetResult:
    records: list[RequestRecord]
    instances: list[InstanceRecord]
    tbt: TbtHistogram
    duration_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    lifecycle: Any = None  # the run's sim.lifecycle.Lifecycle when instances have one


class Fleet:
    def __init__(self, ctx: FleetContext) -> None:
        self.loop = ctx.loop
        self.engines = list(ctx.engines)
        self.by_id = {e.id: e for e in self.engines}
        self.router = ctx.router
        self.workload = ctx.workload
        self.model = ctx.model
        self.bs = ctx.block_size
        self.tbt = ctx.tbt
        self.precise_kv = ctx.precise_kv
        self.after_finish: FinishFn | None = None  # called after the fleet's own ``on_finish``
        self._changed: set[int] = set()
        for i, e in enumerate(self.engines):
            e.bind(i, self._changed, self._finished)
        self.views: list[InstanceView] = [e.view() for e in self.engines]
        self.records: list[RequestRecord] = []
        self._arrivals: Iterator[RequestSpec] = iter(ctx.workload.arrivals())
        self._seen_hashes: set[int] = set()
        self._uid = 0
        self._in_flight = 0
        self._sample_interval = ctx.sample_interval_s
        self._last_busy = [0.0] * len(self.engines)
        self._last_sample_t = 0.0
        self._last_activity = 0.0
        self.arrivals_done = False
        # Economics (sim.economics_report): each request's workflow, and, in shells where a request
        # may take several attempts, one (request_id, instance_id, prefill tokens computed, output
        # tokens, delivered) row per attempt; ``None`` means one attempt per record (read records).
        self.workflows: dict[int, WorkflowContext] = {}
        self.usage: list[tuple[int, str, int, int, bool]] | None = None
        self.budgets: dict[int, float] = {}  # request_id -> its own TTFT budget, where it has one

    # -- arrivals ------------------------------------------------------------------------------
    def _next_arrival(self) -> None:
        spec = next(self._arrivals, None)
        if spec is not None:
            self.loop.schedule(spec.arrival_s, self._on_arrival, spec)
        else:
            self.arrivals_done = True

    def _on_arrival(self, now: float, spec: RequestSpec) -> None:
        self._next_arrival()
        self._admit(now, spec)

    def _admit(self, now: float, spec: RequestSpec) -> None:
        self._last_activity = now
        if spec.workflow is not None:
            self.workflows[spec.request_id] = spec.workflow
        if spec.latency_budget_s is not None:
            self.budgets[spec.request_id] = spec.latency_budget_s
        hashes = spec.block_hashes
        rec = RequestRecord(
            request_id=spec.request_id,
            tenant=spec.tenant,
            arrival_s=now,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.output_tokens,
            prefix_bound_tokens=self._prefix_bound(spec) if hashes else 0,
        )
        self.records.append(rec)
        info = RequestInfo(
            request_id=str(spec.request_id),
            model=spec.model or self.model,
            prompt_tokens=spec.prompt_tokens,
            max_output_tokens=spec.max_output_tokens or spec.output_tokens,
            block_hashes=hashes,
            hash_block_tokens=spec.hash_block_tokens,
            tenant=spec.tenant,
            arrival_s=now,
            workflow=spec.workflow,
            priority=spec.priority,
            latency_budget_s=spec.latency_budget_s,
            cached_prefix_tokens=self.cached_prefix(spec) if self.precise_kv else None,
        )
        views = self.views
        if self._changed:
            engines = self.engines
            for i in self._changed:
                views[i] = engines[i].view()
            self._changed.clear()
        decision = self.router.select(info, views, now=now)
        rec.route_reason = str(decision.reason)  # a StrEnum: its value, cheaper than ``.value``
        if decision.instance_id is None:
            self._fail(rec, spec, now, "no_instance")
            return
        engine = self.by_id[decision.instance_id]
        rec.instance_id = engine.id
        if not engine.fits(spec):
            self._fail(rec, spec, now, "too_long")
            return
        self.router.on_routed(info, engine.id, now=now)
        self._uid += 1
        self._in_flight += 1
        engine.submit(Seq(self._uid, spec, info, rec, self.bs), now)

    def cached_prefix(self, spec: RequestSpec) -> dict[str, int]:
        """Exact leading cached prompt tokens of ``spec`` per instance that holds any (precise mode)."""
        out: dict[str, int] = {}
        if spec.block_hashes:
            for e in self.engines:
                n = e.cached_prefix_tokens(spec)
                if n:
                    out[e.id] = n
        return out

    def _prefix_bound(self, spec: RequestSpec) -> int:
        """Prompt tokens one infinite cache shared by the fleet would hold for ``spec``."""
        hashes = spec.block_hashes
        if not hashes:
            return 0
        seen = self._seen_hashes
        hb = spec.hash_block_tokens
        limit = (spec.prompt_tokens - 1) // hb
        n = 0
        for h in hashes:
            if n >= limit or h not in seen:
                break
            n += 1
        seen.update(hashes)
        return n * hb

    def _fail(self, rec: RequestRecord, spec: RequestSpec, now: float, reason: str) -> None:
        rec.ok = False
        rec.reason = reason
        rec.finish_s = None
        self._followups(spec, now, ok=False)

    def _finished(self, seq: Seq, now: float) -> None:
        self.on_finish(seq, now)
        if self.after_finish is not None:
            self.after_finish(seq, now)

    def on_finish(self, seq: Seq, now: float) -> None:
        rec = seq.record
        rec.finish_s = now
        rec.ok = True
        self._last_activity = max(self._last_activity, now)
        self._in_flight -= 1
        self.router.on_finished(seq.info, rec.instance_id or "", now=now)
        self._followups(seq.spec, now, ok=True)

    def _followups(self, spec: RequestSpec, now: float, *, ok: bool) -> None:
        for nxt in self.workload.on_finished(spec, now, ok):
            self.loop.schedule(max(nxt.arrival_s, now), self._on_followup, nxt)

    def _on_followup(self, now: float, spec: RequestSpec) -> None:
        self._admit(now, spec)

    # -- sampling ------------------------------------------------------------------------------
    def _sample(self, now: float, _: object) -> None:
        span = now - self._last_sample_t
        for i, e in enumerate(self.engines):
            busy = e.busy_seconds(now)
            frac = (busy - self._last_busy[i]) / span if span > 0 else 0.0
            self._last_busy[i] = busy
            v = e.view()
            e.record.samples.append(InstanceSample(now, min(1.0, frac), v.kv_usage, v.running, v.waiting))
        self._last_sample_t = now
        if self._in_flight or len(self.loop) > 0:
            self.loop.schedule(now + self._sample_interval, self._sample)

    # -- run -----------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        """Arrivals are still to come or requests are in flight (follow-ups not yet due excepted)."""
        return self._in_flight > 0 or not self.arrivals_done

    def run(
        self, *, until: float | None = None, on_progress: Callable[[float], None] | None = None
    ) -> FleetResult:
        self._next_arrival()
        self.loop.schedule(self._sample_interval, self._sample)
        self.loop.run(until=until, on_progress=on_progress)
        # The run ends with its last arrival or completion (or at ``until``), not at the sampler's
        # last tick.
        end = until if until is not None else self._last_activity
        for e in self.engines:
            e.record.alive_s = end
            e.record.busy_s = e.busy_seconds(end)
        return FleetResult(self.records, [e.record for e in self.engines], self.tbt, end)
