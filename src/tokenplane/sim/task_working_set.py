"""The KV working set of the started, unfinished tasks that the twin's admission layer limits.

The admission shell (:mod:`tokenplane.sim.admission_shell`) holds one when a task-aware scenario
keeps ``kv_working_set_fraction``; its :meth:`TaskWorkingSet.refusal` is asked about every request
before the queue, and :meth:`TaskWorkingSet.on_end` is told how each logical request ended.

For the limit, the shell keeps, per started and unfinished workflow, the KV its context
needs (prompt + output of its latest step: ``max_output`` when the step is gated, the real output
once it finished), projected to the task's last step with the growth per step it has measured (an
EWMA over the tasks that moved on; before the first one, each step is assumed to add as much as the
request holds), and the running sum of those projections. A workflow enters when its step 1 is
admitted by the limit (or when a later step of one it does not know arrives), and leaves when a
step fails for good (the task is abandoned), when its last step (``step == total_steps``) succeeds,
or when no step of it was seen for :data:`WORKING_SET_STALE_S` (a task that ended without the shell
seeing its last step). The fleet's KV capacity is the sum of ``InstanceView.kv_capacity_tokens``
over instances that are ready and healthy. Reported: ``admission_refused_kv_working_set``,
``admission_max_working_set_tokens`` (the largest sum of projections) and
``admission_max_context_tokens`` (the largest sum of contexts as they were).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tokenplane.core.task_admission import (
    KvWorkingSetLimit,
    context_tokens,
    fleet_kv_capacity_tokens,
    peak_context_tokens,
    starts_reusable_task,
)
from tokenplane.core.views import InstanceView, RequestInfo
from tokenplane.sim.workloads.base import RequestSpec

__all__ = ["WORKING_SET_STALE_S", "TaskWorkingSet"]

WORKING_SET_STALE_S = 300.0
"""A workflow with no step seen for this long leaves the working set (it ended unseen)."""


class TaskWorkingSet:
    """The contexts of started tasks, their projections and the limit on them (module docstring)."""

    def __init__(self, limit: KvWorkingSetLimit, *, growth_alpha: float) -> None:
        self.limit = limit
        self._alpha = growth_alpha
        # workflow id -> (context tokens now, projected to the last step, step, total steps, when last
        # seen), least recently seen first; the limit sums the projections
        self.contexts: OrderedDict[str, tuple[int, int, int, int | None, float]] = OrderedDict()
        self.working_set_tokens = 0
        self.context_now_tokens = 0
        self.growth: float | None = None  # EWMA of a task's context growth per step (tokens)
        self.max_working_set_tokens = 0
        self.max_context_tokens = 0

    def _growth_estimate(self, tokens: int) -> float:
        # Until a task has been seen to grow, assume each step adds as much as this one holds.
        return self.growth if self.growth is not None else float(tokens)

    def refusal(self, info: RequestInfo, views: Sequence[InstanceView], now: float) -> str | None:
        """Track the request's workflow in the working set; the reason when it is refused (step 1
        only), else ``None``."""
        wf = info.workflow
        if wf is None:
            return None
        self._prune(now)
        tokens = context_tokens(info)
        old = self.contexts.get(wf.workflow_id)
        if old is None and starts_reusable_task(info):
            d = self.limit.decide(
                info,
                active_context_tokens=self.working_set_tokens,
                kv_capacity_tokens=fleet_kv_capacity_tokens(views),
                growth_per_step_tokens=self._growth_estimate(tokens),
            )
            if not d.admit:
                return d.reason.value
        elif old is not None and wf.step > old[2]:  # the task moved on: learn how fast contexts grow
            g = float(max(0, tokens - old[0]) / (wf.step - old[2]))
            self.growth = g if self.growth is None else self.growth + self._alpha * (g - self.growth)
        self._set_context(wf.workflow_id, tokens, wf.step, wf.total_steps, now)
        return None

    def _set_context(
        self, workflow_id: str, tokens: int, step: int, total_steps: int | None, now: float
    ) -> None:
        old = self.contexts.pop(workflow_id, None)
        peak = peak_context_tokens(
            tokens,
            step,
            total_steps,
            self._growth_estimate(tokens),
            unknown_remaining_steps=self.limit.unknown_remaining_steps,
        )
        if old is not None:
            self.context_now_tokens -= old[0]
            self.working_set_tokens -= old[1]
        self.contexts[workflow_id] = (tokens, peak, step, total_steps, now)
        self.context_now_tokens += tokens
        self.working_set_tokens += peak
        self.max_working_set_tokens = max(self.max_working_set_tokens, self.working_set_tokens)
        self.max_context_tokens = max(self.max_context_tokens, self.context_now_tokens)

    def _forget(self, workflow_id: str) -> None:
        old = self.contexts.pop(workflow_id, None)
        if old is not None:
            self.context_now_tokens -= old[0]
            self.working_set_tokens -= old[1]

    def _prune(self, now: float) -> None:
        contexts = self.contexts
        while contexts:
            wid, entry = next(iter(contexts.items()))
            if entry[4] > now - WORKING_SET_STALE_S:
                break
            self._forget(wid)

    def on_end(self, spec: RequestSpec, now: float, *, ok: bool) -> None:
        """A logical request ended: its task ended (abandoned or done) or moved on."""
        wf = spec.workflow
        if wf is None or wf.workflow_id not in self.contexts:
            return
        if not ok or (wf.total_steps is not None and wf.step >= wf.total_steps):
            self._forget(wf.workflow_id)  # abandoned, or done: its context is no longer needed
        else:  # what the step really generated is what stays cached
            tokens = spec.prompt_tokens + spec.output_tokens
            self._set_context(wf.workflow_id, tokens, wf.step, wf.total_steps, now)
