"""Task-aware admission: map workflow value onto the admission queue's classes and pick shed victims.

Algorithm. :class:`TaskAwareAdmission` wraps a :class:`WorkflowValueModel` and makes three decisions,
each a pure function of a :class:`RequestInfo` (with ``workflow.sunk_cost_usd`` filled by the shell)
and ``now``:

* :meth:`~TaskAwareAdmission.priority`: the request's own class (``RequestInfo.priority``) raised one
  level when its shedding density (value lost per dollar freed, see
  :mod:`tokenplane.core.workflow_value`) is at least ``protect_density``, lowered one level when it
  is below ``shed_density``. The :class:`~tokenplane.core.admission.AdmissionQueue` then serves raised
  requests first and, when full, evicts the newest request of a lower class: a late step of an
  expensive task is kept ahead of new cheap work. With the model's defaults, a new single request
  scores about 0.9, step 1 of a five-step task 2.7, step 2 4.1 and step 5 8.5, so the default
  threshold 4 protects tasks that have started; a step past its workflow's deadline scores below 0
  and drops a class (no rule that later steps always win).
* :meth:`~TaskAwareAdmission.victim`: among queued requests, the one to shed for a newcomer when
  capacity runs out: the lowest density (``compare_for_shedding``), if it is lower than the
  newcomer's; else ``None`` (shed the newcomer).
* :meth:`~TaskAwareAdmission.retry_worth`: whether a refused or failed step deserves one more
  attempt (``retry_worth`` with the step's cost and ``p_success``). The shell bounds how many.

Params: ``protect_density`` 4.0, ``shed_density`` 0.0, the model's params. Cost: O(1) per request;
``victim`` O(queued). Failure modes: those of the value model (one ``p`` for every step, value as a
multiple of cost); without ``sunk_cost_usd`` every step looks like step 1 of its task.

Working-set limit (:class:`KvWorkingSetLimit`, the talk's Avoid + Delay). A started task comes back
after its think time for a step whose prompt starts with everything it has seen so far; if that
context is still in its instance's KV cache the step only prefills what is new. When more tasks are
in progress than the fleet's KV cache can hold, LRU eviction removes exactly the contexts of the
tasks about to come back (those that have been thinking longest) and every step re-prefills its
whole history: the fleet pays again for work it already did, steps get slower, fewer tasks finish.
The limit keeps the tasks in progress within the cache: a *new* task (step 1 of a multi-step
workflow) is admitted only while

    active_context_tokens + peak(request) <= target_fraction x kv_capacity_tokens

``peak`` is a task's context (prompt + max output, :func:`context_tokens`) projected to its last
step, ``current + (total_steps - step) x growth_per_step_tokens`` (:func:`peak_context_tokens`;
``unknown_remaining_steps`` steps when the length is unknown); ``active_context_tokens`` is the
shell's sum of the peaks of the started, unfinished tasks (each re-projected from its real context
as it moves on), so a task admitted now still fits when it and the others have grown;
``growth_per_step_tokens`` is the shell's estimate of how much a context grows per step;
``kv_capacity_tokens`` is the fleet's KV capacity (``InstanceView.kv_capacity_tokens`` summed over
the instances that take work, :func:`fleet_kv_capacity_tokens`).
Otherwise the request is refused with reason :attr:`WorkingSetReason.OVER_BUDGET`
(``kv_working_set``) before it cost anything, and its user tries again later. Steps of started
tasks (``step > 1``) are never refused by this rule, nor are requests without a workflow or with
``total_steps == 1`` (nothing of theirs is reused), nor anything while no task is active (a task
larger than the budget still runs, alone), nor anything when the capacity is unknown (``0``: fail
open).

Params: ``target_fraction`` (default 0.85): the share of the KV cache the projected working set may
fill. The rest holds what is not in the estimate: contexts of tasks that just finished or failed
(they stay cached until LRU reaches them), and the imbalance of prefix-affinity routing (a task's
context lives on one instance, the sum is over the fleet); the estimate in turn over-counts the
system prompt shared by all tasks and the tasks that are not yet at their peak. Higher admits more
tasks and gets fewer prefix hits (past the point where the cache thrashes, as many re-prefills as
without the limit); lower keeps the hits but leaves the fleet short of work. In the twin's
agentic-overload example (4 x H100, 5-step tasks) hits stay within 10 % of the infinite-cache bound
up to 0.8 and fall off past 0.9; completed tasks peak over 0.85-0.9. ``unknown_remaining_steps``
(default 0). Cost: O(1) per request (the shell keeps the running sum). Failure modes: one fleet-wide
sum (a hot instance can thrash while the fleet fits), one growth rate for every task, and a shell
that misses a task's end leaks its tokens until it drops stale entries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum

import msgspec

from tokenplane.core.admission import PriorityClass
from tokenplane.core.views import InstanceView, RequestInfo
from tokenplane.core.workflow_value import WorkflowValueModel

DEFAULT_PROTECT_DENSITY = 4.0
DEFAULT_SHED_DENSITY = 0.0
DEFAULT_KV_TARGET_FRACTION = 0.85


class TaskAwareAdmission:
    def __init__(
        self,
        model: WorkflowValueModel | None = None,
        *,
        protect_density: float = DEFAULT_PROTECT_DENSITY,
        shed_density: float = DEFAULT_SHED_DENSITY,
    ) -> None:
        if not shed_density <= protect_density:
            raise ValueError("task-aware admission: need shed_density <= protect_density")
        self.model = model or WorkflowValueModel()
        self.protect_density = protect_density
        self.shed_density = shed_density

    def density(self, request: RequestInfo, *, now: float) -> float:
        return self.model.assess(request, now=now).density

    def priority(self, request: RequestInfo, *, now: float) -> PriorityClass:
        base = int(PriorityClass.from_value(request.priority))
        d = self.density(request, now=now)
        if d >= self.protect_density:
            base += 1
        elif d < self.shed_density:
            base -= 1
        return PriorityClass.from_value(base)

    def victim(
        self, newcomer: RequestInfo, queued: Iterable[RequestInfo], *, now: float
    ) -> RequestInfo | None:
        worst: RequestInfo | None = None
        for q in queued:
            if worst is None or self.model.compare_for_shedding(q, worst, now=now) < 0:
                worst = q
        if worst is not None and self.model.compare_for_shedding(worst, newcomer, now=now) < 0:
            return worst
        return None

    def retry_worth(
        self, request: RequestInfo, attempt_cost_usd: float, p_success: float, *, now: float
    ) -> bool:
        return self.model.retry_worth(request, attempt_cost_usd, p_success, now=now)


# -- the working-set limit ---------------------------------------------------------------------------


class WorkingSetReason(StrEnum):
    """Why :class:`KvWorkingSetLimit` decided what it decided; stable values, used as metric labels."""

    STARTED_TASK = "started_task"  # step > 1: never refused by this rule
    NO_REUSE = "no_reuse"  # no workflow, or a one-step one: nothing of it is kept for later
    CAPACITY_UNKNOWN = "capacity_unknown"  # no KV capacity reported: fail open
    NO_ACTIVE_TASKS = "no_active_tasks"  # nothing to protect: even an oversized task runs alone
    FITS = "fits"
    OVER_BUDGET = "kv_working_set"  # the refusal reason


class WorkingSetDecision(msgspec.Struct, frozen=True):
    """One decision of :class:`KvWorkingSetLimit`; ``working_set_tokens`` includes the request."""

    admit: bool
    reason: WorkingSetReason
    working_set_tokens: int
    budget_tokens: int


def context_tokens(request: RequestInfo) -> int:
    """The KV a task needs to keep after this step: its prompt plus what the step may generate."""
    return max(0, request.prompt_tokens) + max(0, request.max_output_tokens)


def fleet_kv_capacity_tokens(views: Iterable[InstanceView]) -> int:
    """KV capacity of the instances that take work (ready and healthy), in tokens."""
    return sum(max(0, v.kv_capacity_tokens) for v in views if v.ready and v.healthy)


def peak_context_tokens(
    current_tokens: int,
    step: int,
    total_steps: int | None,
    growth_per_step_tokens: float,
    *,
    unknown_remaining_steps: int = 0,
) -> int:
    """What a task's context will have grown to by its last step: ``current + remaining x growth``
    (``remaining`` = ``total_steps - step``, ``unknown_remaining_steps`` when the length is unknown)."""
    remaining = unknown_remaining_steps if total_steps is None else total_steps - max(1, step)
    growth = growth_per_step_tokens if math.isfinite(growth_per_step_tokens) else 0.0
    return max(0, current_tokens) + round(max(0, remaining) * max(0.0, growth))


def starts_reusable_task(request: RequestInfo) -> bool:
    """Whether the request opens a task whose later steps reuse its context (step 1 of > 1 steps)."""
    wf = request.workflow
    return wf is not None and wf.step <= 1 and (wf.total_steps is None or wf.total_steps > 1)


class KvWorkingSetLimit:
    """Admit a new task only while the started tasks' contexts fit the fleet's KV cache (see the
    module docstring). Pure: the shell passes the state in, the decision depends on nothing else."""

    def __init__(
        self, target_fraction: float = DEFAULT_KV_TARGET_FRACTION, *, unknown_remaining_steps: int = 0
    ) -> None:
        if not (target_fraction > 0 and math.isfinite(target_fraction)):
            raise ValueError(f"kv working-set limit: target_fraction must be > 0, got {target_fraction}")
        if unknown_remaining_steps < 0:
            raise ValueError(
                f"kv working-set limit: unknown_remaining_steps must be >= 0, got {unknown_remaining_steps}"
            )
        self.target_fraction = target_fraction
        self.unknown_remaining_steps = unknown_remaining_steps

    def budget_tokens(self, kv_capacity_tokens: int) -> int:
        return int(self.target_fraction * max(0, kv_capacity_tokens))

    def request_tokens(self, request: RequestInfo, growth_per_step_tokens: float = 0.0) -> int:
        """The working set the request adds: its context, projected to its task's last step."""
        wf = request.workflow
        now_tokens = context_tokens(request)
        if wf is None:
            return now_tokens
        return peak_context_tokens(
            now_tokens,
            wf.step,
            wf.total_steps,
            growth_per_step_tokens,
            unknown_remaining_steps=self.unknown_remaining_steps,
        )

    def decide(
        self,
        request: RequestInfo,
        *,
        active_context_tokens: int,
        kv_capacity_tokens: int,
        growth_per_step_tokens: float = 0.0,
    ) -> WorkingSetDecision:
        active = max(0, active_context_tokens)
        budget = self.budget_tokens(kv_capacity_tokens)
        if not starts_reusable_task(request):
            wf = request.workflow
            reason = (
                WorkingSetReason.STARTED_TASK if wf is not None and wf.step > 1 else WorkingSetReason.NO_REUSE
            )
            return WorkingSetDecision(True, reason, active, budget)
        total = active + self.request_tokens(request, growth_per_step_tokens)
        if kv_capacity_tokens <= 0:
            return WorkingSetDecision(True, WorkingSetReason.CAPACITY_UNKNOWN, total, budget)
        if active == 0:
            return WorkingSetDecision(True, WorkingSetReason.NO_ACTIVE_TASKS, total, budget)
        if total <= budget:
            return WorkingSetDecision(True, WorkingSetReason.FITS, total, budget)
        return WorkingSetDecision(False, WorkingSetReason.OVER_BUDGET, total, budget)
