"""The fleet shell of the twin: arrivals, the core's router, engines, and records.

This is the simulator's counterpart of the gateway: it builds the same :class:`RequestInfo` and
:class:`InstanceView` values the gateway builds, asks the same router, and carries out the
decision in virtual time.

One :class:`Fleet`, composed of parts chosen by ``runner.build_fleet`` from a run's settings: the
fleet owns arrivals, follow-ups, records, views and sampling; a :class:`Dispatcher` carries each
arrived request to an engine and hears back when it finishes. :class:`DirectDispatch` (here) routes
once and submits; :class:`~tokenplane.sim.resilience.ResilientDispatch` adds clients that time out
and retry through the core's retry plan, faults and breakers, and optionally an admission gate
(:class:`~tokenplane.sim.admission_shell.AdmissionGate`). The fleet is built from one typed
:class:`FleetContext`; engines report finished sequences to the fleet they are bound to
(:meth:`Engine.bind`), and a listener (the autoscaler) may follow each finish through
:attr:`Fleet.after_finish`.

Seven-axis view fields: each engine's view carries ``hbm_free_bytes`` (its free KV cache in bytes)
and ``predicted_ttft_s`` from its model pool's :class:`~tokenplane.core.ttft.PoolTtft`, which the
fleet shares between the pool's engines (:meth:`Fleet.pool_ttft`) and which their first tokens
feed, as the gateway fills both.

The request path's fixed cost (``request_path_s``, scenario ``request_path.first_chunk_s``) is
charged where a request enters: each arrival and follow-up reaches the dispatcher that much after
its client sent it, and :meth:`Fleet.open_record` dates the record from the send, so every
dispatcher's TTFT and end-to-end latency include it without knowing of it.

With ``precise_kv`` the fleet fills ``RequestInfo.cached_prefix_tokens`` from each engine's own
prefix cache (:meth:`Engine.cached_prefix_tokens`), as the gateway does from vLLM's KV events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from msgspec.structs import replace

from tokenplane.core.routing.base import Router
from tokenplane.core.ttft import PoolTtft
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo, WorkflowContext
from tokenplane.sim.engine import FinishFn, Seq
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, InstanceSample, RequestRecord, TbtHistogram
from tokenplane.sim.workloads.base import RequestSpec, Workload


class Engine(Protocol):
    """What the fleet needs of an engine (continuous or static)."""

    id: str
    record: InstanceRecord
    ttft: PoolTtft  # its model pool's observed TTFT (the fleet shares one per model)

    def bind(self, index: int, changed: set[int], on_finish: FinishFn | None = None) -> None: ...
    def cached_prefix_tokens(self, spec: RequestSpec) -> int: ...

    def fits(self, spec: RequestSpec) -> bool: ...
    def submit(self, seq: Seq, now: float) -> None: ...
    def view(self) -> InstanceView: ...
    def busy_seconds(self, now: float) -> float: ...


class Dispatcher(Protocol):
    """A fleet's request path: from an arrived request to an engine, and back when it finishes."""

    def bind(self, fleet: Fleet) -> None: ...
    def admit(self, now: float, spec: RequestSpec) -> None: ...
    def on_finish(self, seq: Seq, now: float) -> None: ...
    def start(self) -> None: ...
    def has_work(self) -> bool: ...
    def report_extra(self) -> dict[str, Any]: ...


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
    request_path_s: float = 0.0  # client + HTTP + gateway to the first chunk (scenario.RequestPathSettings)


@dataclass(slots=True)
class FleetResult:
    records: list[RequestRecord]
    instances: list[InstanceRecord]
    tbt: TbtHistogram
    duration_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    lifecycle: Any = None  # the run's sim.lifecycle.Lifecycle when instances have one


class Fleet:
    def __init__(self, ctx: FleetContext, dispatcher: Dispatcher | None = None) -> None:
        self.loop = ctx.loop
        self.engines = list(ctx.engines)
        self.by_id = {e.id: e for e in self.engines}
        self.router = ctx.router
        self.workload = ctx.workload
        self.model = ctx.model
        self.bs = ctx.block_size
        self.tbt = ctx.tbt
        self.precise_kv = ctx.precise_kv
        self.path_s = ctx.request_path_s
        self.after_finish: FinishFn | None = None  # called after the fleet's own ``on_finish``
        self._changed: set[int] = set()
        for i, e in enumerate(self.engines):
            e.bind(i, self._changed, self._finished)
        # One observed-TTFT model per model pool, fed by its engines' first tokens and read by their
        # views (``predicted_ttft_s``) and by admission's up-front rule, as the gateway's pool does.
        self.ttft: dict[str, PoolTtft] = {}
        self._ttft_pools: list[PoolTtft] = []
        for e in self.engines:
            e.ttft = self.pool_ttft(e.record.model)
        self._ttft_seen = self._ttft_version()
        self.views: list[InstanceView] = [e.view() for e in self.engines]
        self.records: list[RequestRecord] = []
        self._arrivals: Iterator[RequestSpec] = iter(ctx.workload.arrivals())
        self._seen_hashes: set[int] = set()
        self.uid = 0  # the last engine submission's id
        self.in_flight = 0  # engine submissions not yet finished or taken back
        self._sample_interval = ctx.sample_interval_s
        self._last_busy = [0.0] * len(self.engines)
        self._last_sample_t = 0.0
        self.last_activity = 0.0
        self.arrivals_done = False
        # Economics (sim.economics_report): each request's workflow, and, in shells where a request
        # may take several attempts, one (request_id, instance_id, prefill tokens computed, output
        # tokens, delivered) row per attempt; ``None`` means one attempt per record (read records).
        self.workflows: dict[int, WorkflowContext] = {}
        self.usage: list[tuple[int, str, int, int, bool]] | None = None
        self.budgets: dict[int, float] = {}  # request_id -> its own TTFT budget, where it has one
        self.dispatcher: Dispatcher = dispatcher or DirectDispatch()
        self.dispatcher.bind(self)
        self._admit = self.dispatcher.admit
        self._on_finish = self.dispatcher.on_finish

    # -- arrivals ------------------------------------------------------------------------------
    def _next_arrival(self) -> None:
        spec = next(self._arrivals, None)
        if spec is not None:
            self.loop.schedule(spec.arrival_s + self.path_s, self._on_arrival, spec)
        else:
            self.arrivals_done = True

    def _on_arrival(self, now: float, spec: RequestSpec) -> None:
        self._next_arrival()
        self._admit(now, spec)

    def open_record(self, now: float, spec: RequestSpec) -> RequestRecord:
        """Note an arrived request (its workflow, its own budget) and open its record, dated from
        its client's send (``now`` less the request path's cost)."""
        self.last_activity = now
        if spec.workflow is not None:
            self.workflows[spec.request_id] = spec.workflow
        if spec.latency_budget_s is not None:
            self.budgets[spec.request_id] = spec.latency_budget_s
        rec = RequestRecord(
            request_id=spec.request_id,
            tenant=spec.tenant,
            arrival_s=now - self.path_s,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.output_tokens,
            prefix_bound_tokens=self._prefix_bound(spec) if spec.block_hashes else 0,
        )
        self.records.append(rec)
        return rec

    def pool_ttft(self, model: str) -> PoolTtft:
        """The model pool's observed TTFT (shared by its engines' views and by admission)."""
        t = self.ttft.get(model)
        if t is None:
            t = self.ttft[model] = PoolTtft()
            self._ttft_pools = list(self.ttft.values())
        return t

    def _ttft_version(self) -> int:
        pools = self._ttft_pools
        if len(pools) == 1:
            return pools[0].version
        return sum(t.version for t in pools)

    def fresh_views(self) -> list[InstanceView]:
        """The instances' views, rebuilt for the engines whose state changed since last asked; when
        a pool's TTFT model published a new mean, the others' predicted TTFT only."""
        views = self.views
        engines = self.engines
        changed = self._changed
        version = self._ttft_version()
        if version != self._ttft_seen:
            self._ttft_seen = version
            for i, v in enumerate(views):
                if i not in changed:
                    ttft = engines[i].ttft.view_ttft_s(v.waiting, v.weights)
                    if ttft != v.predicted_ttft_s:
                        views[i] = replace(v, predicted_ttft_s=ttft)
        if changed:
            for i in changed:
                views[i] = engines[i].view()
            changed.clear()
        return views

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
        return prefix_bound(spec, self._seen_hashes)

    def _finished(self, seq: Seq, now: float) -> None:
        self._on_finish(seq, now)
        if self.after_finish is not None:
            self.after_finish(seq, now)

    def followups(self, spec: RequestSpec, now: float, *, ok: bool) -> None:
        """Schedule what the workload sends next now that ``spec`` ended (an agent's next step)."""
        for nxt in self.workload.on_finished(spec, now, ok):
            self.loop.schedule(max(nxt.arrival_s, now) + self.path_s, self._on_followup, nxt)

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
        if self.in_flight or len(self.loop) > 0:
            self.loop.schedule(now + self._sample_interval, self._sample)

    # -- run -----------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        """Arrivals are still to come or requests are in flight (follow-ups not yet due excepted)."""
        return self.in_flight > 0 or not self.arrivals_done or self.dispatcher.has_work()

    def run(
        self, *, until: float | None = None, on_progress: Callable[[float], None] | None = None
    ) -> FleetResult:
        self.dispatcher.start()
        self._next_arrival()
        self.loop.schedule(self._sample_interval, self._sample)
        self.loop.run(until=until, on_progress=on_progress)
        # The run ends with its last arrival or completion (or at ``until``), not at the sampler's
        # last tick.
        end = until if until is not None else self.last_activity
        for e in self.engines:
            e.record.alive_s = end
            e.record.busy_s = e.busy_seconds(end)
        return FleetResult(self.records, [e.record for e in self.engines], self.tbt, end)

    def report_extra(self) -> dict[str, Any]:
        return self.dispatcher.report_extra()


class DirectDispatch:
    """The bare request path: route once, submit, done (no clients, faults or control plane)."""

    def bind(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.router = fleet.router
        self.by_id = fleet.by_id

    def admit(self, now: float, spec: RequestSpec) -> None:
        fleet = self.fleet
        rec = fleet.open_record(now, spec)
        info = request_info(spec, now, fleet.model, fleet.cached_prefix(spec) if fleet.precise_kv else None)
        decision = self.router.select(info, fleet.fresh_views(), now=now)
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
        fleet.uid += 1
        fleet.in_flight += 1
        engine.submit(Seq(fleet.uid, spec, info, rec, fleet.bs), now)

    def _fail(self, rec: RequestRecord, spec: RequestSpec, now: float, reason: str) -> None:
        rec.ok = False
        rec.reason = reason
        rec.finish_s = None
        self.fleet.followups(spec, now, ok=False)

    def on_finish(self, seq: Seq, now: float) -> None:
        fleet = self.fleet
        rec = seq.record
        rec.finish_s = now
        rec.ok = True
        fleet.last_activity = max(fleet.last_activity, now)
        fleet.in_flight -= 1
        self.router.on_finished(seq.info, rec.instance_id or "", now=now)
        fleet.followups(seq.spec, now, ok=True)

    def start(self) -> None:
        return None

    def has_work(self) -> bool:
        return False

    def report_extra(self) -> dict[str, Any]:
        return {}


def request_info(
    spec: RequestSpec, now: float, default_model: str, cached: Mapping[InstanceId, int] | None
) -> RequestInfo:
    """The core's view of one arriving request, as every twin dispatcher builds it."""
    return RequestInfo(
        request_id=str(spec.request_id),
        model=spec.model or default_model,
        prompt_tokens=spec.prompt_tokens,
        max_output_tokens=spec.max_output_tokens or spec.output_tokens,
        block_hashes=spec.block_hashes,
        hash_block_tokens=spec.hash_block_tokens,
        tenant=spec.tenant,
        arrival_s=now,
        workflow=spec.workflow,
        priority=spec.priority,
        latency_budget_s=spec.latency_budget_s,
        adapter=spec.adapter,
        cached_prefix_tokens=cached,
    )


def prefix_bound(spec: RequestSpec, seen: set[int]) -> int:
    """Prompt tokens one infinite cache shared by the fleet would hold for ``spec`` (``seen``: every
    block hash sent so far; updated)."""
    hashes = spec.block_hashes
    if not hashes:
        return 0
    hb = spec.hash_block_tokens
    limit = (spec.prompt_tokens - 1) // hb
    n = 0
    for h in hashes:
        if n >= limit or h not in seen:
            break
        n += 1
    seen.update(hashes)
    return n * hb
