"""A gateway-like admission layer in the twin: bounded queue, load shedding, task-aware policies.

Used when a scenario sets ``admission: {...}`` (:class:`~tokenplane.sim.scenario.AdmissionSettings`).
It is a part (:class:`AdmissionGate`, the :class:`~tokenplane.sim.resilience.Gate` protocol) of the
resilient request path (:class:`~tokenplane.sim.resilience.ResilientDispatch`): it sits between its
clients (timeouts, retries) and the router, and drives the core's policies as the gateway does:

* every instance takes at most ``max_in_flight_per_instance`` requests (running + waiting in the
  engine); a request that finds no free slot waits in the core
  :class:`~tokenplane.core.admission.AdmissionQueue` (bounded by ``queue.max_depth``), and is
  dispatched from it when a slot frees (``next``);
* before it is offered, the core's up-front rule (:func:`~tokenplane.core.ttft.ttft_up_front`, as
  the gateway applies it) sheds it when the predicted TTFT (the fleet's
  :class:`~tokenplane.core.ttft.PoolTtft`, fed by the engines' first tokens) is over its latency
  budget (``latency_budget_s``, else its class's budget), once the pool has observed a first
  token;
* before it would queue, the core :class:`~tokenplane.core.shedding.LoadShedder` may shed it (queue
  depth, oldest wait, predicted TTFT against its deadline);
* a queued request expires at its deadline: ``arrival + client timeout`` (the client gives up), or
  the class budget without a client timeout.

A refusal (shed, queue full, evicted, expired) is a terminal failure of that step, so an agentic
task is abandoned. Two policy families:

* ``request-level``: the request's own class (``RequestSpec.priority``), earliest deadline first
  within it, the newcomer is the one shed: nothing looks at the workflow.
* ``task-aware`` (:class:`~tokenplane.core.task_admission.TaskAwareAdmission`): the class is raised
  for steps whose workflow value density is high (a task that has started and spent) and lowered for
  long shots; when the shedder fires, the queued request with the lowest density is shed instead of
  the newcomer when it is worth less; a step of a started task (``step > 1``) that fails gets one
  budgeted retry (``max_retries_per_step``, the core ``RetryBudget``) when ``retry_worth`` says the
  value it saves beats its cost; and, unless ``kv_working_set_fraction`` is ``null``, a new task
  (step 1) is refused with reason ``kv_working_set`` while the contexts of the tasks already started
  would not fit that share of the fleet's KV cache
  (:class:`~tokenplane.core.task_admission.KvWorkingSetLimit`), so started tasks keep their prefixes
  cached through their think time; steps of started tasks are never refused by it.

Working set: the contexts of started tasks that the limit sums are kept by a
:class:`~tokenplane.sim.task_working_set.TaskWorkingSet` (its module says how).

``WorkflowContext.sunk_cost_usd`` is filled before each step is admitted from the running spend of
its workflow: every attempt's prefill tokens computed and output tokens at the instance's step-model
token prices (:func:`tokenplane.sim.economics_report.engine_token_costs`; failed attempts included).

Every logical request ends exactly once (ok, or one failure reason); queued requests are in
``_queued`` until dispatched, refused or expired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from tokenplane.core.admission import AdmissionQueue, PriorityClass
from tokenplane.core.economics import TokenCosts
from tokenplane.core.retry_budget import RetryBudget, first_attempt_cost, retry_cost
from tokenplane.core.shedding import LoadShedder, load_signal
from tokenplane.core.task_admission import KvWorkingSetLimit, TaskAwareAdmission
from tokenplane.core.ttft import ttft_up_front
from tokenplane.core.views import InstanceView, RequestInfo
from tokenplane.core.workflow_value import WorkflowValueModel
from tokenplane.sim.engine import Seq
from tokenplane.sim.resilience import ResilientDispatch, _Pending
from tokenplane.sim.retry_driver import PlanDriver
from tokenplane.sim.scenario import AdmissionSettings
from tokenplane.sim.task_working_set import WORKING_SET_STALE_S as WORKING_SET_STALE_S
from tokenplane.sim.task_working_set import TaskWorkingSet
from tokenplane.sim.workloads.base import RequestSpec

__all__ = ["AdmissionGate", "build_admission_policies"]

RATE_ALPHA = 0.05


def build_admission_policies(
    settings: AdmissionSettings,
) -> tuple[AdmissionQueue, LoadShedder, TaskAwareAdmission, RetryBudget]:
    """The core objects a run's ``admission`` settings describe (raises on bad params)."""
    value = WorkflowValueModel.from_params(settings.value)
    return (
        AdmissionQueue.from_params(settings.queue),
        LoadShedder.from_params(settings.shedder),
        TaskAwareAdmission(
            value, protect_density=settings.protect_density, shed_density=settings.shed_density
        ),
        RetryBudget.from_params(settings.retry_budget),
    )


class AdmissionGate:
    """The admission layer of the twin's resilient request path (see the module docstring)."""

    def __init__(self, admission: AdmissionSettings, prices: Mapping[str, TokenCosts]) -> None:
        self.settings = admission
        self.task_aware = admission.policy == "task-aware"
        self.queue, self.shedder, self.policy, self.retry_budget = build_admission_policies(admission)
        self.cap = admission.max_in_flight_per_instance
        self.prices = dict(prices)
        n = max(1, len(self.prices))
        self._mean_price = TokenCosts(
            sum(c.prefill_usd_per_token for c in self.prices.values()) / n,
            sum(c.decode_usd_per_token for c in self.prices.values()) / n,
        )
        self.spend: dict[str, float] = {}
        # The value model prices a step at ``(prompt + max_output) x usd_per_million_tokens``; sunk
        # costs are real spend, so unless the scenario fixes the rate, calibrate it to what attempts
        # actually cost per token here (an EWMA over delivered attempts; prefix reuse included).
        self._calibrate = "usd_per_million_tokens" not in admission.value
        self._rate = (
            self._mean_price.prefill_usd_per_token * 0.7 + self._mean_price.decode_usd_per_token * 0.3
        )
        self._policy_rate = 0.0
        if self._calibrate:
            self._set_rate()
        self._queued: dict[str, tuple[_Pending, RequestInfo]] = {}
        self._step_retries: dict[int, int] = {}
        self._ticking = False
        self.max_queue_depth = 0
        self.adm: dict[str, int] = {
            "admitted_now": 0,
            "queued": 0,
            "dispatched_from_queue": 0,
            "task_retries": 0,
            "task_retries_not_worth": 0,
            "task_retries_over_budget": 0,
        }
        self.refused_by_step: dict[str, int] = {}
        frac = admission.kv_working_set_fraction
        self.working_set = (
            TaskWorkingSet(KvWorkingSetLimit(frac), growth_alpha=RATE_ALPHA)
            if self.task_aware and frac is not None
            else None
        )
        self.adm["refused_kv_working_set"] = 0

    def bind(self, path: ResilientDispatch) -> None:
        self.path = path
        self.fleet = path.fleet
        # The fleet's model pool TTFT, fed by its engines' first tokens: the gateway's pool's twin.
        self.ttft = path.fleet.pool_ttft(path.fleet.model)

    # -- arrivals: fill the workflow's sunk cost ---------------------------------------------------
    def on_arrival(self, now: float, spec: RequestSpec) -> RequestSpec:
        wf = spec.workflow
        if wf is not None:
            sunk = self.spend.get(wf.workflow_id, 0.0)
            spec = msgspec.structs.replace(spec, workflow=msgspec.structs.replace(wf, sunk_cost_usd=sunk))
        info = RequestInfo(
            request_id=str(spec.request_id),
            model=spec.model or self.fleet.model,
            prompt_tokens=spec.prompt_tokens,
            max_output_tokens=spec.max_output_tokens or spec.output_tokens,
        )
        self.retry_budget.on_first_attempt(first_attempt_cost(info), now=now)
        return spec

    def on_used(self, seq: Seq, instance_id: str, *, delivered: bool) -> None:
        _, iid, pre, out, _ = self.path.attempt_usage[-1]
        wf = seq.spec.workflow
        c = self.prices.get(iid)
        if wf is not None and c is not None:
            cost = pre * c.prefill_usd_per_token + out * c.decode_usd_per_token
            self.spend[wf.workflow_id] = self.spend.get(wf.workflow_id, 0.0) + cost
        self.queue.on_finish(seq.info, now=0.0)
        if self._calibrate and delivered and c is not None:
            tokens = max(1, seq.spec.prompt_tokens + seq.spec.output_tokens)
            self._rate += RATE_ALPHA * (
                (pre * c.prefill_usd_per_token + out * c.decode_usd_per_token) / tokens - self._rate
            )
            if abs(self._rate - self._policy_rate) > 0.05 * self._policy_rate:
                self._set_rate()

    def _set_rate(self) -> None:
        v = self.policy.model
        model = WorkflowValueModel(
            p_step_success=v.p_step_success,
            value_multiple=v.value_multiple,
            usd_per_million_tokens=max(1e-9, self._rate * 1e6),
            unknown_remaining_steps=v.unknown_remaining_steps,
        )
        self.policy = TaskAwareAdmission(
            model, protect_density=self.policy.protect_density, shed_density=self.policy.shed_density
        )
        self._policy_rate = self._rate

    # -- the gate ----------------------------------------------------------------------------------
    def dispatch(self, now: float, p: _Pending) -> None:
        self._gate(p, now)

    def _info(self, p: _Pending, now: float) -> RequestInfo:
        spec = p.spec
        wf = spec.workflow
        if wf is not None:  # a retry of this step sees what its failed attempts cost too
            wf = msgspec.structs.replace(wf, sunk_cost_usd=self._sunk(spec))
        return RequestInfo(
            request_id=str(spec.request_id),
            model=spec.model or self.fleet.model,
            prompt_tokens=spec.prompt_tokens,
            max_output_tokens=spec.max_output_tokens or spec.output_tokens,
            tenant=spec.tenant,
            priority=spec.priority,
            arrival_s=now,
            workflow=wf,
            latency_budget_s=spec.latency_budget_s,
            adapter=spec.adapter,
        )

    def _sunk(self, spec: RequestSpec) -> float:
        wf = spec.workflow
        return 0.0 if wf is None else self.spend.get(wf.workflow_id, 0.0)

    def _gate(self, p: _Pending, now: float) -> None:
        if p.done:
            return
        p.sent_s = now  # the client's clock for this attempt starts now, however long it queues
        self._expire(now)
        info = self._info(p, now)
        cls = (
            self.policy.priority(info, now=now)
            if self.task_aware
            else PriorityClass.from_value(info.priority)
        )
        budget = self.path.clients.timeout_s
        deadline = self.queue.deadline_for(info, cls, budget)
        views = self.fleet.fresh_views()
        refusal = None if self.working_set is None else self.working_set.refusal(info, views, now)
        if refusal is not None:
            self.adm["refused_kv_working_set"] += 1
            self._refuse(p, now, refusal)
            return
        # The core's up-front rule, applied as the gateway's admission applies it.
        up = ttft_up_front(self.ttft, self.fleet.fresh_views, info, cls, self.queue, self.shedder, now=now)
        if up.shed:
            self._refuse(p, now, f"shed_{up.reason.value}")
            return
        capacity, total = self._capacity(views)
        if capacity <= 0:
            signal = load_signal(
                [v for v in views if v.ready],
                queue_depth=self.queue.depth,
                oldest_wait_s=self.queue.oldest_wait_s(now=now),
                predictor=self.ttft.predictor,
                prompt_tokens=info.prompt_tokens,
            )
            shed = self.shedder.decide(cls, signal, now=now, deadline_s=deadline)
            if shed.shed:
                victim = None
                if self.task_aware:
                    victim = self.policy.victim(info, [qi for _, qi in self._queued.values()], now=now)
                if victim is None:
                    self._refuse(p, now, f"shed_{shed.reason.value}")
                    return
                self.queue.cancel(victim.request_id)
                vp, _ = self._queued.pop(victim.request_id)
                self._refuse(vp, now, "shed_for_value")
        adm = self.queue.offer(
            info, now=now, capacity=capacity, total_capacity=total, priority=cls, budget_s=budget
        )
        if adm.evicted is not None:
            vp, _ = self._queued.pop(adm.evicted.request.request_id)
            self._refuse(vp, now, "evicted")
        if adm.admitted:
            self.adm["admitted_now"] += 1
            self._send(p, info, now)
        elif adm.queued:
            self.adm["queued"] += 1
            self._queued[info.request_id] = (p, info)
            self.max_queue_depth = max(self.max_queue_depth, self.queue.depth)
            self.fleet.loop.schedule(adm.deadline_s, self._on_deadline, None)
            self._start_ticking(now)
        else:
            self._refuse(p, now, adm.reason.value)

    def _send(self, p: _Pending, info: RequestInfo, now: float) -> None:
        before = self.fleet.uid
        self.path.send(now, p)
        if self.fleet.uid == before:  # not submitted (no instance, too long): release the reservation
            self.queue.on_finish(info, now=now)

    def _refuse(self, p: _Pending, now: float, reason: str) -> None:
        wf = p.spec.workflow
        key = f"{reason}@step{wf.step if wf is not None else 1}"
        self.refused_by_step[key] = self.refused_by_step.get(key, 0) + 1
        self.path.end(p, now, ok=False, reason=reason)

    def retry_instead(self, p: _Pending, now: float, *, ok: bool, reason: str) -> bool:
        return not ok and self.task_aware and reason != "too_long" and self._task_retry(p, now)

    def on_end(self, p: _Pending, now: float, *, ok: bool) -> None:
        if self.working_set is not None:
            self.working_set.on_end(p.spec, now, ok=ok)

    def _task_retry(self, p: _Pending, now: float) -> bool:
        """A budgeted retry for a step of a started task whose failure would end it."""
        spec = p.spec
        wf = spec.workflow
        if wf is None or wf.step <= 1:
            return False
        rid = spec.request_id
        n = self._step_retries.get(rid, 0)
        if n >= self.settings.max_retries_per_step:
            return False
        info = self._info(p, now)
        c = self.prices.get(p.record.instance_id or "", self._mean_price)
        cost = info.prompt_tokens * c.prefill_usd_per_token + info.max_output_tokens * c.decode_usd_per_token
        if not self.policy.retry_worth(info, cost, self.settings.retry_p_success, now=now):
            self.adm["task_retries_not_worth"] += 1
            return False
        if not self.retry_budget.try_spend(retry_cost(info, 0), now=now).allowed:
            self.adm["task_retries_over_budget"] += 1
            return False
        self._step_retries[rid] = n + 1
        self.adm["task_retries"] += 1
        p.delivered = 0
        p.seq = None
        # The step starts over under a fresh plan of the core's (its first one has ended).
        self.fleet.loop.schedule(
            now + self.settings.retry_delay_s, self._regate, self.path.start_plan(p, now)
        )
        return True

    def _regate(self, now: float, driver: PlanDriver[_Pending]) -> None:
        driver.start(now)

    # -- capacity and the queue ----------------------------------------------------------------------
    def _capacity(self, views: Sequence[InstanceView]) -> tuple[int, int]:
        """(free slots, all slots) over the ready, healthy instances."""
        cap = self.cap
        usable = [v for v in views if v.ready and v.healthy]
        return sum(max(0, cap - v.outstanding_requests) for v in usable), cap * len(usable)

    def usable(self, candidates: Sequence[InstanceView]) -> Sequence[InstanceView]:
        """Instances with a free slot (``max_in_flight_per_instance``)."""
        cap = self.cap
        return [v for v in candidates if v.outstanding_requests < cap]

    def pump(self, now: float) -> None:
        """Dispatch queued requests into the slots that freed up."""
        self._expire(now)
        if not self.queue.depth:
            return
        capacity, total = self._capacity(self.fleet.fresh_views())
        while capacity > 0:
            item = self.queue.next(now=now, capacity=capacity, total_capacity=total)
            if item is None:
                break
            p, info = self._queued.pop(item.request.request_id)
            self.adm["dispatched_from_queue"] += 1
            self._send(p, info, now)
            capacity -= 1

    def _expire(self, now: float) -> None:
        for item, _reason in self.queue.expire(now):
            p, _ = self._queued.pop(item.request.request_id)
            self._refuse(p, now, "expired")

    def _on_deadline(self, now: float, _: object) -> None:
        self.pump(now)

    def _start_ticking(self, now: float) -> None:
        if not self._ticking:
            self._ticking = True
            self.fleet.loop.schedule(now + self.settings.pump_interval_s, self._tick, None)

    def _tick(self, now: float, _: object) -> None:
        self.pump(now)
        if self.queue.depth:
            self.fleet.loop.schedule(now + self.settings.pump_interval_s, self._tick, None)
        else:
            self._ticking = False

    def has_work(self) -> bool:
        return bool(self._queued)

    def report_extra(self) -> dict[str, Any]:
        ws = self.working_set
        return {
            "admission_policy": self.settings.policy,
            **{f"admission_{k}": v for k, v in self.adm.items()},
            "admission_max_queue_depth": self.max_queue_depth,
            "admission_max_working_set_tokens": ws.max_working_set_tokens if ws is not None else 0,
            "admission_max_context_tokens": ws.max_context_tokens if ws is not None else 0,
            "admission_refused_by_step": dict(sorted(self.refused_by_step.items())),
        }
