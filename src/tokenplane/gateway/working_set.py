"""The tasks in progress per model pool, for the core's KV working-set limit at the gateway.

:class:`~tokenplane.core.task_admission.KvWorkingSetLimit` admits a new task only while the contexts
of the tasks already started, each projected to its last step, fit a share of the pool's KV cache.
This module keeps that state for the gateway shell: per model, per workflow id, the task's projected
peak context (prompt + max output of its latest step, plus the remaining steps times the learned
growth per step), the running sum, and the growth per step learned from consecutive steps of the
same workflow (an exponential average). A task leaves when its last step completes, when a step
fails, when its outcome is posted, or after ``idle_ttl_s`` without a step (a client that stopped
without saying so).

:class:`InMemoryWorkingSet` is one process's state; with ``state: {backend: redis}`` the replicas
share it through :class:`~tokenplane.shared_state.working_set.SharedWorkingSet` (the same
:class:`WorkingSetStore` interface). The clock is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenplane.core.task_admission import KvWorkingSetLimit, context_tokens
from tokenplane.core.views import RequestInfo

DEFAULT_IDLE_TTL_S = 600.0
GROWTH_ALPHA = 0.2


class WorkingSetStore(Protocol):
    def total(self, model: str, now: float) -> int: ...
    def growth(self, model: str) -> float: ...
    def observe(self, model: str, request: RequestInfo, limit: KvWorkingSetLimit, now: float) -> None: ...
    def drop(self, model: str, tenant: str, workflow_id: str) -> None: ...
    def active(self, model: str) -> int: ...


@dataclass
class _Task:
    context: int
    peak: int
    step: int
    seen_s: float


@dataclass
class _Pool:
    # Least recently seen first. An OrderedDict: pruning from the front of a plain dict leaves
    # dummies that every later look at its first entry walks past (per request, until a resize).
    tasks: OrderedDict[str, _Task] = field(default_factory=OrderedDict)
    total: int = 0
    growth: float = 0.0
    growth_samples: int = 0


class InMemoryWorkingSet:
    """:class:`WorkingSetStore` for one gateway process. ``now`` must not go backwards (a monotonic
    clock): tasks are kept in order of last seen, so expiry stops at the first fresh one."""

    def __init__(self, idle_ttl_s: float = DEFAULT_IDLE_TTL_S) -> None:
        if idle_ttl_s <= 0:
            raise ValueError("idle_ttl_s must be > 0")
        self.idle_ttl_s = idle_ttl_s
        self._pools: dict[str, _Pool] = {}

    def _pool(self, model: str) -> _Pool:
        pool = self._pools.get(model)
        if pool is None:
            pool = self._pools[model] = _Pool()
        return pool

    def total(self, model: str, now: float) -> int:
        pool = self._pools.get(model)
        if pool is None:
            return 0
        tasks = pool.tasks  # least recently seen first (observe re-inserts): stop at the first fresh one
        while tasks:
            task = next(iter(tasks.values()))  # O(1) on an OrderedDict
            if now - task.seen_s <= self.idle_ttl_s:
                break
            pool.total -= tasks.popitem(last=False)[1].peak
        return pool.total

    def growth(self, model: str) -> float:
        pool = self._pools.get(model)
        return 0.0 if pool is None else pool.growth

    def observe(self, model: str, request: RequestInfo, limit: KvWorkingSetLimit, now: float) -> None:
        wf = request.workflow
        if wf is None or (wf.total_steps is not None and wf.total_steps <= 1):
            return
        pool = self._pool(model)
        ctx = context_tokens(request)
        key = task_key(request.tenant, wf.workflow_id)
        prev = pool.tasks.get(key)
        if prev is not None and wf.step > prev.step and ctx > prev.context:
            sample = (ctx - prev.context) / (wf.step - prev.step)
            pool.growth_samples += 1
            alpha = max(GROWTH_ALPHA, 1.0 / pool.growth_samples)  # the plain mean until it settles
            pool.growth += alpha * (sample - pool.growth)
        peak = limit.request_tokens(request, pool.growth)
        if prev is not None:
            pool.total -= prev.peak
            del pool.tasks[key]  # re-inserted at the end: the dict stays in order of last seen
        pool.tasks[key] = _Task(ctx, peak, max(wf.step, prev.step if prev else 0), now)
        pool.total += peak

    def drop(self, model: str, tenant: str, workflow_id: str) -> None:
        pool = self._pools.get(model)
        if pool is not None and (task := pool.tasks.pop(task_key(tenant, workflow_id), None)) is not None:
            pool.total -= task.peak

    def active(self, model: str) -> int:
        pool = self._pools.get(model)
        return 0 if pool is None else len(pool.tasks)

    def task(self, model: str, tenant: str, workflow_id: str) -> tuple[int, int] | None:
        """The task's (latest step, projected peak), or ``None`` when it is not in progress here."""
        pool = self._pools.get(model)
        task = None if pool is None else pool.tasks.get(task_key(tenant, workflow_id))
        return None if task is None else (task.step, task.peak)

    def tasks(self, model: str) -> dict[str, tuple[int, int]]:
        """Every task in progress here (by :func:`task_key`): (latest step, projected peak)."""
        pool = self._pools.get(model)
        return {} if pool is None else {k: (t.step, t.peak) for k, t in pool.tasks.items()}


def task_key(tenant: str, workflow_id: str) -> str:
    return tenant + "\x00" + workflow_id  # workflow ids are the tenant's own namespace


class WorkingSetCollector(Collector):
    """``tokenplane_working_set_tasks{model}``, ``tokenplane_working_set_tokens{model}`` and
    ``tokenplane_working_set_budget_tokens{model}``, read at scrape time."""

    def __init__(
        self, store: WorkingSetStore, budgets: Callable[[], Mapping[str, int]], clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._budgets = budgets
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        tasks = GaugeMetricFamily("tokenplane_working_set_tasks", "Tasks in progress", labels=["model"])
        tokens = GaugeMetricFamily(
            "tokenplane_working_set_tokens",
            "KV tokens the tasks in progress are projected to need by their last step",
            labels=["model"],
        )
        budget = GaugeMetricFamily(
            "tokenplane_working_set_budget_tokens",
            "KV tokens the tasks in progress may fill (the limit's share of the pool's KV cache)",
            labels=["model"],
        )
        now = self._clock()
        for model, limit in self._budgets().items():
            tokens.add_metric([model], self._store.total(model, now))
            tasks.add_metric([model], self._store.active(model))
            budget.add_metric([model], limit)
        yield tasks
        yield tokens
        yield budget
