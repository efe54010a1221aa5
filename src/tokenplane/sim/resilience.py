"""The twin's fleet with clients that time out and retry, injected faults, and the control plane.

A logical request (what the user asked for, one :class:`RequestRecord`) may take several
attempts (engine submissions). Each attempt has its own scratch record; the logical record keeps
what the user saw: the first token of the stream, the finish, the number of attempts, whether the
stream was interrupted and recovered.

Without controls this reproduces the retry cascade of the talk: a slowed instance makes requests
time out, clients retry at once, the abandoned attempts keep running (nobody cancels them), queues
deepen everywhere, more requests time out. With controls, the shell cancels work its client
abandoned, continues interrupted streams on another instance, and consults the core's breakers
(when configured) before routing.

Whether and when a request gets another attempt is the core's retry plan
(:func:`tokenplane.core.retry_budget.attempts`), driven by :class:`~tokenplane.sim.retry_driver.PlanDriver`
exactly as the gateway drives it: this module only reports each attempt's outcome. The breakers
and the exclusion of tried instances are :mod:`tokenplane.sim.controls`.

:class:`ResilientDispatch` is the fleet's request path (a :class:`~tokenplane.sim.fleet.Dispatcher`)
when a run has clients, controls or faults; an admission layer plugs in as a :class:`Gate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.retry_budget import PlanResult, RetryReason
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason
from tokenplane.sim.controls import ControlHooks, CoreControls, avoid_tried
from tokenplane.sim.engine import ContinuousEngine, Seq
from tokenplane.sim.faults import ClientSpec, ControlSpec, FaultSpec
from tokenplane.sim.fleet import Engine, Fleet, request_info
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.retry_driver import PlanDriver, RetryPlanner
from tokenplane.sim.workloads.base import RequestSpec


class _Pending:
    """A logical request in flight: its current attempt and what the user has already received."""

    __slots__ = (
        "attempt",
        "base_info",
        "cause",
        "delivered",
        "done",
        "driver",
        "engine",
        "info",
        "lost_at",
        "record",
        "sent_s",
        "seq",
        "spec",
    )

    def __init__(self, spec: RequestSpec, record: RequestRecord) -> None:
        self.spec = spec
        self.record = record
        self.attempt = 0
        self.delivered = 0
        self.done = False
        self.seq: Seq | None = None
        self.engine: Engine | None = None
        self.info: RequestInfo | None = None
        self.base_info: RequestInfo | None = None  # the request as it came (set with its plan)
        self.driver: PlanDriver[_Pending] | None = None  # the core's retry plan for this request
        self.cause = ""  # why the latest attempt failed: the request's reason if the plan gives up
        self.lost_at: float | None = None
        self.sent_s: float | None = None  # when the client sent the attempt, if it waited before dispatch


class Gate(Protocol):
    """An admission layer between the clients and the router (the twin's admission shell).

    The resilient path calls it where a request arrives (``on_arrival``), is about to be sent
    (``dispatch``: the gate calls :meth:`ResilientDispatch.send` when it lets it through), is
    routed (``usable`` narrows the candidates), spends engine work (``on_used``), ends
    (``retry_instead``, then ``on_end``) and where capacity frees (``pump``).
    """

    def bind(self, path: ResilientDispatch) -> None: ...
    def on_arrival(self, now: float, spec: RequestSpec) -> RequestSpec: ...
    def dispatch(self, now: float, p: _Pending) -> None: ...
    def usable(self, candidates: Sequence[InstanceView]) -> Sequence[InstanceView]: ...
    def on_used(self, seq: Seq, instance_id: str, *, delivered: bool) -> None: ...
    def retry_instead(self, p: _Pending, now: float, *, ok: bool, reason: str) -> bool: ...
    def on_end(self, p: _Pending, now: float, *, ok: bool) -> None: ...
    def pump(self, now: float) -> None: ...
    def has_work(self) -> bool: ...
    def report_extra(self) -> dict[str, Any]: ...


class ResilientDispatch:
    """The fleet's request path with clients, faults, breakers and the core's retry plan."""

    def __init__(
        self,
        *,
        clients: ClientSpec | None = None,
        controls: ControlSpec | None = None,
        faults: Sequence[FaultSpec] = (),
        hooks: ControlHooks | None = None,
        seed: int = 0,
        gate: Gate | None = None,
    ) -> None:
        self.gate = gate
        self.clients = clients or ClientSpec()
        self.controls = controls or ControlSpec()
        self.hooks = hooks or CoreControls.from_spec(self.controls)
        self.faults = list(faults)
        self.planner = RetryPlanner.from_specs(self.clients, self.controls, seed=seed)
        self._pending: dict[int, _Pending] = {}
        self.counters: dict[str, int] = {
            "attempts": 0,
            "retries": 0,
            "continuations": 0,
            "timeouts": 0,
            "zombie_completions": 0,
            "cancelled_attempts": 0,
            "streams_interrupted": 0,
            "streams_completed_after_loss": 0,
            "lost_tokens": 0,
        }
        self.resume_gaps: list[float] = []
        self.attempt_usage: list[tuple[int, str, int, int, bool]] = []

    def bind(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.loop = fleet.loop
        self.engines = fleet.engines
        self.by_id = fleet.by_id
        self.router = fleet.router
        self.model = fleet.model
        self.bs = fleet.bs
        fleet.usage = self.attempt_usage
        for i, f in enumerate(self.faults):
            if f.instance >= len(self.engines):
                raise ValueError(f"faults[{i}]: instance {f.instance} but the fleet has {len(self.engines)}")
            if not isinstance(self.engines[f.instance], ContinuousEngine):
                raise ValueError(f"faults[{i}]: faults need the continuous engine")
        if self.gate is not None:
            self.gate.bind(self)

    # -- requests ------------------------------------------------------------------------------
    def admit(self, now: float, spec: RequestSpec) -> None:
        if self.gate is not None:
            spec = self.gate.on_arrival(now, spec)
        rec = self.fleet.open_record(now, spec)
        self.start_plan(_Pending(spec, rec), now).start(now)

    def start_plan(self, p: _Pending, now: float) -> PlanDriver[_Pending]:
        """Open the core's retry plan for ``p`` (a fresh one each time: see the admission shell)."""
        if p.driver is not None:
            p.driver.close()
        # One RequestInfo serves the plan and every attempt that re-sends the request as it came.
        info = p.base_info = self._info(p.spec, p.record.arrival_s)
        plan = self.planner.plan(info, now=now)
        p.driver = PlanDriver(plan, p, loop=self.loop, dispatch=self._dispatch, finish=self._plan_ended)
        return p.driver

    def _info(self, spec: RequestSpec, arrival_s: float) -> RequestInfo:
        """What the router and the plan know of one attempt of ``spec``."""
        cached = self.fleet.cached_prefix(spec) if self.fleet.precise_kv else None
        return request_info(spec, arrival_s, self.model, cached)

    def _plan_ended(self, now: float, p: _Pending, result: PlanResult) -> None:
        over_budget = result.reason in (RetryReason.BUDGET_REQUESTS, RetryReason.BUDGET_TOKENS)
        self.end(p, now, ok=False, reason=f"{p.cause}_retry_denied" if over_budget else p.cause)

    def _report(self, p: _Pending, outcome: AttemptOutcome, cause: str) -> None:
        """Tell the request's plan how its attempt ended; it dispatches the next one or ends it."""
        assert p.driver is not None
        p.cause = cause
        p.driver.report(outcome)

    def _dispatch(self, now: float, p: _Pending) -> None:
        if self.gate is not None:
            self.gate.dispatch(now, p)
        else:
            self.send(now, p)

    def send(self, now: float, p: _Pending) -> None:
        """Run the plan's current attempt for ``p``: route it and submit it to an engine."""
        if p.done:
            return
        spec = p.spec
        assert p.driver is not None
        attempt = p.driver.attempt
        if attempt.number > 1:
            self.counters["continuations" if attempt.is_continuation else "retries"] += 1
        p.attempt += 1
        p.record.attempts = p.attempt
        self.counters["attempts"] += 1
        if p.delivered:  # a continuation: the prompt now includes what the user already saw
            spec = msgspec.structs.replace(
                spec,
                arrival_s=now,
                prompt_tokens=spec.prompt_tokens + p.delivered,
                output_tokens=spec.output_tokens - p.delivered,
                max_output_tokens=max(1, (spec.max_output_tokens or spec.output_tokens) - p.delivered),
            )
        base = p.base_info
        if base is not None and spec is p.spec and not self.fleet.precise_kv:
            info = base
        else:  # a continuation, or the engines' caches are read afresh for each attempt
            info = self._info(spec, p.record.arrival_s)
        decision = self._route(info, p, now)
        rec = p.record
        rec.route_reason = decision.reason.value
        if decision.instance_id is None:
            self.end(p, now, ok=False, reason="no_instance")
            return
        engine = self.by_id[decision.instance_id]
        rec.instance_id = engine.id
        if not engine.fits(spec):
            self.end(p, now, ok=False, reason="too_long")
            return
        self.router.on_routed(info, engine.id, now=now)
        self.fleet.uid += 1
        self.fleet.in_flight += 1
        attempt_rec = RequestRecord(spec.request_id, spec.tenant, now, spec.prompt_tokens, spec.output_tokens)
        attempt_rec.instance_id = engine.id
        seq = Seq(self.fleet.uid, spec, info, attempt_rec, self.bs)
        p.seq, p.engine, p.info = seq, engine, info
        self._pending[seq.uid] = p
        self.hooks.on_dispatch(engine.id, now=now)
        engine.submit(seq, now)
        sent, p.sent_s = p.sent_s, None
        if self.clients.timeout_s is not None:
            start = now if sent is None else sent
            self.loop.schedule(max(now, start + self.clients.timeout_s), self._on_timeout, (p, p.attempt))

    def _used(self, seq: Seq, instance_id: str, *, delivered: bool, finished: bool) -> None:
        """Record what one attempt computed (for cost attribution), however it ended."""
        hit = seq.record.prefix_hit_tokens
        if finished:
            prefill, out = seq.spec.prompt_tokens - hit, seq.spec.output_tokens
        else:
            prefill, out = max(0, min(seq.computed, seq.prompt) - hit), seq.generated
        self.attempt_usage.append((seq.spec.request_id, instance_id, prefill, out, delivered))
        if self.gate is not None:
            self.gate.on_used(seq, instance_id, delivered=delivered)

    def _route(self, info: RequestInfo, p: _Pending, now: float) -> RouteDecision:
        candidates: Sequence[InstanceView] = self.hooks.filter_views(self.fleet.fresh_views(), now=now)
        if self.gate is not None:
            candidates = self.gate.usable(candidates)
        candidates = self._elsewhere(p, candidates)
        if not candidates:
            return RouteDecision(None, RouteReason.NO_CANDIDATES)
        return self.router.select(info, candidates, now=now)

    def _elsewhere(self, p: _Pending, candidates: Sequence[InstanceView]) -> Sequence[InstanceView]:
        """With ``retry_elsewhere``, avoid the instances the plan excludes, as the gateway does."""
        if p.driver is None or not self.controls.retry_elsewhere:
            return candidates
        return avoid_tried(candidates, p.driver.attempt.exclude)

    def on_finish(self, seq: Seq, now: float) -> None:
        self._on_finish(seq, now)
        if self.gate is not None:
            self.gate.pump(now)

    def _on_finish(self, seq: Seq, now: float) -> None:
        fleet = self.fleet
        fleet.in_flight -= 1
        fleet.last_activity = max(fleet.last_activity, now)
        p = self._pending.pop(seq.uid, None)
        own = seq.record.instance_id or ""  # the instance this attempt ran on, not the latest one
        self.router.on_finished(seq.info, own, now=now)
        self._used(seq, own, delivered=not (p is None or p.done or p.seq is not seq), finished=True)
        if p is None or p.done or p.seq is not seq:
            # Finished after its client had given up; the timeout already reported this attempt.
            self.counters["zombie_completions"] += 1
            return
        # The breaker's latency signal: seconds per output token (a slow GPU is slow per token
        # whatever the output length; end-to-end time would mostly measure length).
        per_token = (now - seq.record.arrival_s) / max(1, seq.spec.output_tokens)
        self.hooks.on_result(own, True, per_token, now=now)
        att = seq.record
        rec = p.record
        if rec.first_token_s is None:
            rec.first_token_s = att.first_token_s
        if rec.scheduled_s is None:
            rec.scheduled_s = att.scheduled_s
        rec.prefix_hit_tokens += att.prefix_hit_tokens
        rec.preemptions += att.preemptions
        if rec.interrupted:
            self.counters["streams_completed_after_loss"] += 1
            if p.lost_at is not None and att.first_token_s is not None:
                # how long the user's stream stalled: from the loss to the next token
                self.resume_gaps.append(att.first_token_s - p.lost_at)
        self.end(p, now, ok=True, reason="")

    def end(self, p: _Pending, now: float, *, ok: bool, reason: str) -> None:
        """``p`` ends (the gate may first give a failed step another go)."""
        gate = self.gate
        if gate is not None:
            if gate.retry_instead(p, now, ok=ok, reason=reason):
                return
            gate.on_end(p, now, ok=ok)
        p.done = True
        if p.driver is not None:
            # Drop the plan and the driver<->request cycle, so both die by reference count (left to
            # the cyclic collector, they cost a fifth of the run's time).
            p.driver.close()
            p.driver = None
        rec = p.record
        rec.ok = ok
        rec.reason = reason
        rec.finish_s = now if ok else None
        self.fleet.followups(p.spec, now, ok=ok)

    # -- client behaviour ----------------------------------------------------------------------
    def _on_timeout(self, now: float, arg: tuple[_Pending, int]) -> None:
        self._timeout(now, arg)
        if self.gate is not None:
            self.gate.pump(now)

    def _timeout(self, now: float, arg: tuple[_Pending, int]) -> None:
        p, attempt = arg
        if p.done or p.attempt != attempt or p.seq is None:
            return
        self.counters["timeouts"] += 1
        seq, engine = p.seq, p.engine
        p.seq = None
        if engine is not None:
            self.hooks.on_result(engine.id, False, None, now=now)
            cancel = self.controls.cancel_on_timeout
            if cancel and isinstance(engine, ContinuousEngine) and engine.abort(seq, now):
                self._used(seq, engine.id, delivered=False, finished=False)
                self.fleet.in_flight -= 1
                self._pending.pop(seq.uid, None)
                self.counters["cancelled_attempts"] += 1
                self.router.on_finished(seq.info, engine.id, now=now)
        p.delivered = 0  # a client that gives up starts its stream over
        iid = engine.id if engine is not None else None
        self._report(p, AttemptOutcome(AttemptResult.CLIENT_RESTART, iid, 0, now), "timeout")

    # -- faults --------------------------------------------------------------------------------
    def _apply_fault(self, now: float, fault: FaultSpec) -> None:
        engine = self.engines[fault.instance]
        assert isinstance(engine, ContinuousEngine)
        if fault.kind == "slow":
            engine.set_slow(fault.factor, now)
            if fault.duration_s is not None:
                self.loop.schedule(now + fault.duration_s, self._restore_speed, engine)
        elif fault.kind == "lose":
            self._lose(engine, now)
        else:  # drain: stop taking work now, lose what is left when the notice runs out
            engine.ready = False
            engine.changed.add(engine.index)
            self.loop.schedule(now + fault.notice_s, self._end_drain, (engine, fault))
            return
        if fault.kind == "lose" and fault.replace_after_s is not None:
            self.loop.schedule(now + fault.replace_after_s, self._replace, engine)

    def _end_drain(self, now: float, arg: tuple[ContinuousEngine, FaultSpec]) -> None:
        engine, fault = arg
        self._lose(engine, now)
        if fault.replace_after_s is not None:
            self.loop.schedule(now + fault.replace_after_s, self._replace, engine)

    def _restore_speed(self, now: float, engine: ContinuousEngine) -> None:
        engine.set_slow(1.0, now)

    def _replace(self, now: float, engine: ContinuousEngine) -> None:
        engine.ready = True
        engine.set_slow(1.0, now)
        engine.changed.add(engine.index)

    def _lose(self, engine: ContinuousEngine, now: float) -> None:
        self._lose_all(engine, now)
        if self.gate is not None:
            self.gate.pump(now)

    def _lose_all(self, engine: ContinuousEngine, now: float) -> None:
        engine.ready = False
        for seq in engine.fail_all(now):
            self._used(seq, engine.id, delivered=False, finished=False)
            self.fleet.in_flight -= 1
            p = self._pending.pop(seq.uid, None)
            self.router.on_finished(seq.info, engine.id, now=now)
            self.hooks.on_result(engine.id, False, None, now=now)
            if p is None or p.done or p.seq is not seq:
                continue
            rec = p.record
            got = seq.generated
            if seq.record.first_token_s is not None and rec.first_token_s is None:
                rec.first_token_s = seq.record.first_token_s
            if rec.scheduled_s is None:
                rec.scheduled_s = seq.record.scheduled_s
            p.seq = None
            if got > 0 or p.delivered > 0:
                self.counters["streams_interrupted"] += 1
                rec.interrupted = True
            if self.controls.continuation and (got > 0 or p.delivered > 0):
                p.delivered += got
                if p.delivered >= p.spec.output_tokens:  # the loss came after the last token
                    self.end(p, now, ok=True, reason="")
                    continue
                p.lost_at = now
                outcome = AttemptOutcome(AttemptResult.FAILED_MID_STREAM, engine.id, got, now)
                self._report(p, outcome, "instance_lost")
            else:
                lost = got + p.delivered
                self.counters["lost_tokens"] += lost
                p.delivered = 0
                if self.clients.retry_on_error:
                    # the client re-sends from scratch what it saw break (or never start)
                    result = AttemptResult.CLIENT_RESTART if lost else AttemptResult.FAILED_BEFORE_FIRST_BYTE
                    self._report(p, AttemptOutcome(result, engine.id, 0, now), "instance_lost")
                else:
                    self.end(p, now, ok=False, reason="instance_lost")
        # Its KV cache is gone (a replacement starts empty): the router forgets what it knew of it
        # once its requests have left it, as the gateway's does when an instance goes down.
        self.router.forget(engine.id)

    # -- the fleet's part ------------------------------------------------------------------------
    def start(self) -> None:
        for f in self.faults:
            self.loop.schedule(f.at_s, self._apply_fault, f)

    def has_work(self) -> bool:
        return self.gate is not None and self.gate.has_work()

    def report_extra(self) -> dict[str, Any]:
        events = self.hooks.events if isinstance(self.hooks, CoreControls) else {}
        gaps = self.resume_gaps
        extra: dict[str, Any] = {
            **self.counters,
            **events,
            "resume_gap_p50_s": sorted(gaps)[len(gaps) // 2] if gaps else None,
            "resume_gap_max_s": max(gaps) if gaps else None,
        }
        if self.gate is not None:
            extra.update(self.gate.report_extra())
        return extra
