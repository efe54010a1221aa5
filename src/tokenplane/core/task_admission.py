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
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenplane.core.admission import PriorityClass
from tokenplane.core.views import RequestInfo
from tokenplane.core.workflow_value import WorkflowValueModel

DEFAULT_PROTECT_DENSITY = 4.0
DEFAULT_SHED_DENSITY = 0.0


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
