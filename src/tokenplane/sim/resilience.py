"""The twin's fleet with clients that time out and retry, injected faults, and the control plane.

A logical request (what the user asked for, one :class:`RequestRecord`) may take several
attempts (engine submissions). Each attempt has its own scratch record; the logical record keeps
what the user saw: the first token of the stream, the finish, the number of attempts, whether the
stream was interrupted and recovered.

Without controls this reproduces the retry cascade of the talk: a slowed instance makes requests
time out, clients retry at once, the abandoned attempts keep running (nobody cancels them), queues
deepen everywhere, more requests time out. With controls, the shell cancels work its client
abandoned, continues interrupted streams on another instance, and consults the core's retry
budget and breakers (when configured) before each new attempt.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from tokenplane.core.breaker import BreakerBoard, BreakerConfig, filter_allowed
from tokenplane.core.retry_budget import RetryBudget
from tokenplane.core.routing.base import Router
from tokenplane.core.views import InstanceView, RequestInfo, RouteDecision, RouteReason
from tokenplane.sim.engine import ContinuousEngine, Seq
from tokenplane.sim.faults import ClientSpec, ControlSpec, FaultSpec
from tokenplane.sim.fleet import Engine, Fleet
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import RequestRecord, TbtHistogram
from tokenplane.sim.workloads.base import RequestSpec, Workload


class _Pending:
    """A logical request in flight: its current attempt and what the user has already received."""

    __slots__ = (
        "attempt",
        "delivered",
        "done",
        "engine",
        "info",
        "lost_at",
        "record",
        "sent_s",
        "seq",
        "spec",
        "tried",
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
        self.tried: set[str] = set()
        self.lost_at: float | None = None
        self.sent_s: float | None = None  # when the client sent the attempt, if it waited before dispatch


class ControlHooks:
    """Where core policies plug into the shell; the defaults allow everything."""

    def allow_retry(self, spec: RequestSpec, attempt: int, *, now: float, continuation: bool) -> bool:
        return True

    def on_first_attempt(self, spec: RequestSpec, *, now: float) -> None:
        return None

    def on_result(self, instance_id: str, ok: bool, latency_s: float | None, *, now: float) -> None:
        return None

    def on_dispatch(self, instance_id: str, *, now: float) -> None:
        return None

    def filter_views(self, views: Sequence[InstanceView], *, now: float) -> Sequence[InstanceView]:
        return views


class CoreControls(ControlHooks):
    """The core's breakers and retry budget, fed by the twin exactly as the gateway feeds them."""

    def __init__(self, board: BreakerBoard | None, budget: RetryBudget | None) -> None:
        self.board = board
        self.budget = budget
        self.events: dict[str, int] = {}

    @classmethod
    def from_spec(cls, spec: ControlSpec) -> CoreControls:
        board = BreakerBoard(BreakerConfig.from_params(spec.breaker)) if spec.breaker is not None else None
        budget = RetryBudget.from_params(spec.retry_budget) if spec.retry_budget is not None else None
        return cls(board, budget)

    def allow_retry(self, spec: RequestSpec, attempt: int, *, now: float, continuation: bool) -> bool:
        if self.budget is None:
            return True
        return self.budget.try_spend(spec.prompt_tokens + spec.output_tokens, now=now).allowed

    def on_first_attempt(self, spec: RequestSpec, *, now: float) -> None:
        if self.budget is not None:
            self.budget.on_first_attempt(spec.prompt_tokens + spec.output_tokens, now=now)

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


class ResilientFleet(Fleet):
    def __init__(
        self,
        *,
        loop: EventLoop,
        engines: Sequence[Engine],
        router: Router,
        workload: Workload,
        model: str,
        block_size: int,
        tbt: TbtHistogram,
        sample_interval_s: float = 10.0,
        clients: ClientSpec | None = None,
        controls: ControlSpec | None = None,
        faults: Sequence[FaultSpec] = (),
        hooks: ControlHooks | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(
            loop=loop,
            engines=engines,
            router=router,
            workload=workload,
            model=model,
            block_size=block_size,
            tbt=tbt,
            sample_interval_s=sample_interval_s,
        )
        self.clients = clients or ClientSpec()
        self.controls = controls or ControlSpec()
        self.hooks = hooks or CoreControls.from_spec(self.controls)
        self.faults = list(faults)
        self._rng = random.Random(f"tokenplane-clients:{seed}")
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
        self.usage = self.attempt_usage
        for i, f in enumerate(self.faults):
            if f.instance >= len(self.engines):
                raise ValueError(f"faults[{i}]: instance {f.instance} but the fleet has {len(self.engines)}")
            if not isinstance(self.engines[f.instance], ContinuousEngine):
                raise ValueError(f"faults[{i}]: faults need the continuous engine")

    # -- requests ------------------------------------------------------------------------------
    def _admit(self, now: float, spec: RequestSpec) -> None:
        self._last_activity = now
        if spec.workflow is not None:
            self.workflows[spec.request_id] = spec.workflow
        if spec.latency_budget_s is not None:
            self.budgets[spec.request_id] = spec.latency_budget_s
        bound = self._prefix_bound(spec)
        rec = RequestRecord(
            request_id=spec.request_id,
            tenant=spec.tenant,
            arrival_s=now,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.output_tokens,
            prefix_bound_tokens=bound,
        )
        self.records.append(rec)
        self.hooks.on_first_attempt(spec, now=now)
        self._dispatch(_Pending(spec, rec), now)

    def _dispatch(self, p: _Pending, now: float) -> None:
        spec = p.spec
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
        info = RequestInfo(
            request_id=str(spec.request_id),
            model=spec.model or self.model,
            prompt_tokens=spec.prompt_tokens,
            max_output_tokens=spec.max_output_tokens or spec.output_tokens,
            block_hashes=spec.block_hashes,
            hash_block_tokens=spec.hash_block_tokens,
            tenant=spec.tenant,
            arrival_s=p.record.arrival_s,
            workflow=spec.workflow,
            priority=spec.priority,
            latency_budget_s=spec.latency_budget_s,
        )
        decision = self._route(info, p, now)
        rec = p.record
        rec.route_reason = decision.reason.value
        if decision.instance_id is None:
            self._end(p, now, ok=False, reason="no_instance")
            return
        engine = self.by_id[decision.instance_id]
        rec.instance_id = engine.id
        if not engine.fits(spec):
            self._end(p, now, ok=False, reason="too_long")
            return
        self.router.on_routed(info, engine.id, now=now)
        self._uid += 1
        self._in_flight += 1
        attempt_rec = RequestRecord(spec.request_id, spec.tenant, now, spec.prompt_tokens, spec.output_tokens)
        attempt_rec.instance_id = engine.id
        seq = Seq(self._uid, spec, info, attempt_rec, self.bs)
        p.seq, p.engine, p.info = seq, engine, info
        p.tried.add(engine.id)
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

    def _route(self, info: RequestInfo, p: _Pending, now: float) -> RouteDecision:
        views = self.views
        if self._changed:
            for i in self._changed:
                views[i] = self.engines[i].view()
            self._changed.clear()
        candidates: Sequence[InstanceView] = self.hooks.filter_views(views, now=now)
        if p.attempt > 1 and self.controls.retry_elsewhere and p.tried:
            others = [v for v in candidates if v.instance_id not in p.tried]
            candidates = others or candidates
        if not candidates:
            return RouteDecision(None, RouteReason.NO_CANDIDATES)
        return self.router.select(info, candidates, now=now)

    def on_finish(self, seq: Seq, now: float) -> None:
        self._in_flight -= 1
        self._last_activity = max(self._last_activity, now)
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
        self._end(p, now, ok=True, reason="")

    def _end(self, p: _Pending, now: float, *, ok: bool, reason: str) -> None:
        p.done = True
        rec = p.record
        rec.ok = ok
        rec.reason = reason
        rec.finish_s = now if ok else None
        self._followups(p.spec, now, ok=ok)

    # -- client behaviour ----------------------------------------------------------------------
    def _on_timeout(self, now: float, arg: tuple[_Pending, int]) -> None:
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
                self._in_flight -= 1
                self._pending.pop(seq.uid, None)
                self.counters["cancelled_attempts"] += 1
                self.router.on_finished(seq.info, engine.id, now=now)
        p.delivered = 0  # a client that gives up starts its stream over
        self._retry_or_fail(p, now, reason="timeout", continuation=False)

    def _retry_or_fail(self, p: _Pending, now: float, *, reason: str, continuation: bool) -> None:
        c = self.clients
        may = continuation or (c.retry != "none" and p.attempt < c.max_attempts)
        if may and not self.hooks.allow_retry(p.spec, p.attempt, now=now, continuation=continuation):
            may = False
            reason = f"{reason}_retry_denied"
        if not may:
            self._end(p, now, ok=False, reason=reason)
            return
        self.counters["continuations" if continuation else "retries"] += 1
        delay = 0.0
        if not continuation and c.retry == "backoff":
            cap = min(c.backoff_max_s, c.backoff_base_s * 2 ** (p.attempt - 1))
            delay = self._rng.uniform(0, cap)  # full jitter
        if delay > 0:
            self.loop.schedule(now + delay, self._redispatch, p)
        else:
            self._dispatch(p, now)

    def _redispatch(self, now: float, p: _Pending) -> None:
        if not p.done:
            self._dispatch(p, now)

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
        engine.ready = False
        for seq in engine.fail_all(now):
            self._used(seq, engine.id, delivered=False, finished=False)
            self._in_flight -= 1
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
                    self._end(p, now, ok=True, reason="")
                    continue
                p.lost_at = now
                self._retry_or_fail(p, now, reason="instance_lost", continuation=True)
            else:
                self.counters["lost_tokens"] += got + p.delivered
                p.delivered = 0
                if self.clients.retry_on_error:
                    self._retry_or_fail(p, now, reason="instance_lost", continuation=False)
                else:
                    self._end(p, now, ok=False, reason="instance_lost")

    def run(self, *, until: float | None = None, on_progress: Callable[[float], None] | None = None) -> Any:
        for f in self.faults:
            self.loop.schedule(f.at_s, self._apply_fault, f)
        return super().run(until=until, on_progress=on_progress)
