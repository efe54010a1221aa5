"""Working set (only when some model limits it): the core's KV working-set limit. A new task
waits (429) while the tasks in progress fill the pool's KV cache; an admitted step (re)enters the
working set with its projected peak. On the way out, a task that ended or whose step failed leaves
the working set."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tokenplane.core.task_admission import KvWorkingSetLimit
from tokenplane.gateway.admission import AdmissionMetrics
from tokenplane.gateway.errors import KvWorkingSetFull
from tokenplane.gateway.proxy import OUTCOME_OK
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.working_set import WorkingSetStore


class WorkingSet:
    __slots__ = ("kv_capacity", "limits", "metrics", "retry_after", "store")

    def __init__(
        self,
        store: WorkingSetStore,
        limits: Mapping[str, KvWorkingSetLimit],
        kv_capacity: Callable[[str], int],
        metrics: AdmissionMetrics,
        retry_after: Callable[[str, float], float],
    ) -> None:
        self.store = store
        self.limits = limits
        self.kv_capacity = kv_capacity
        self.metrics = metrics
        self.retry_after = retry_after

    def enter(self, ctx: RequestContext) -> None:
        info = ctx.info
        assert info is not None
        limit = self.limits.get(ctx.model)
        if limit is None or info.workflow is None:
            return
        model, now, ws = ctx.model, ctx.arrival, self.store
        decision = limit.decide(
            info,
            active_context_tokens=ws.total(model, now),
            kv_capacity_tokens=self.kv_capacity(model),
            growth_per_step_tokens=ws.growth(model),
        )
        if not decision.admit:
            self.metrics.rejected.labels(decision.reason.value).inc()
            self._drop(ctx, failed=True)  # this step failed: its task leaves the working set
            raise KvWorkingSetFull(
                f"{model!r} is busy with tasks in progress ({decision.working_set_tokens} of "
                f"{decision.budget_tokens} KV tokens); start this task later",
                retry_after_s=self.retry_after(model, now),
            )
        ws.observe(model, info, limit, now)

    def exit(self, ctx: RequestContext) -> None:
        self._drop(ctx, failed=ctx.outcome != OUTCOME_OK)

    def _drop(self, ctx: RequestContext, *, failed: bool) -> None:
        info = ctx.info
        if info is None or (wf := info.workflow) is None or ctx.model not in self.limits:
            return
        last = wf.total_steps is not None and wf.step >= wf.total_steps
        if failed or last:  # the task ended or this step failed
            self.store.drop(ctx.model, info.tenant, wf.workflow_id)
