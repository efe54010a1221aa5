"""Workflow outcome rules, as pure transitions shared by every store (same rules, same answers).

* An attempt always adds its cost and tokens to its workflow, whatever the workflow's state: money
  spent after a workflow settled was still spent on it.
* An open workflow **succeeds** when an attempt of its last step completes (``ok`` and
  ``step >= total_steps``; ``total_steps`` from the attempt or, if it carries none, from an earlier
  one) and **fails** when an attempt fails terminally (``ok=False, terminal=True``: no retry
  follows). A failed attempt that will be retried leaves it open.
* The client has the last word: :func:`apply_outcome` sets the outcome whatever the state (a client
  that comes back after a workflow was swept as abandoned can still report success).
* :func:`is_stale`: an open workflow with no attempt for ``abandon_after_s`` is abandoned by the
  store's ``sweep(now)``.
"""

from __future__ import annotations

from tokenplane.ledger.errors import InvalidLedgerRecord
from tokenplane.ledger.records import AttemptRecord, TaskOutcome, WorkflowSummary

__all__ = ["apply_attempt", "apply_outcome", "is_stale", "parse_outcome"]

_CLIENT_OUTCOMES = (TaskOutcome.SUCCEEDED, TaskOutcome.FAILED, TaskOutcome.ABANDONED)


def parse_outcome(outcome: str | TaskOutcome) -> TaskOutcome:
    """``succeeded``, ``failed`` or ``abandoned``; anything else is an :class:`InvalidLedgerRecord`."""
    try:
        value = TaskOutcome(outcome)
    except ValueError:
        value = TaskOutcome.OPEN
    if value is TaskOutcome.OPEN:
        raise InvalidLedgerRecord(
            f"outcome must be one of {[o.value for o in _CLIENT_OUTCOMES]}, got {outcome!r}"
        )
    return value


def apply_attempt(prev: WorkflowSummary | None, a: AttemptRecord) -> WorkflowSummary:
    if prev is None:  # a new workflow: the empty summary's fields, without building one
        workflow_id, tenant, first_t, last_t, model = a.workflow_id, a.tenant, a.t, a.t, a.model
        total, max_step, outcome, reason, settled_t = None, 0, TaskOutcome.OPEN, "", None
        attempts = failed_attempts = tokens_in = tokens_out = 0
        cost_usd = failed_cost_usd = 0.0
    else:
        workflow_id, tenant, model = prev.workflow_id, prev.tenant, prev.model or a.model
        first_t, last_t = min(prev.first_t, a.t), max(prev.last_t, a.t)
        total, max_step = prev.total_steps, prev.max_step
        outcome, reason, settled_t = prev.outcome, prev.reason, prev.settled_t
        attempts, failed_attempts = prev.attempts, prev.failed_attempts
        cost_usd, failed_cost_usd = prev.cost_usd, prev.failed_attempt_cost_usd
        tokens_in, tokens_out = prev.tokens_in, prev.tokens_out
    if a.total_steps is not None:
        total = a.total_steps
    step = a.step
    if a.ok and step is not None:
        max_step = max(max_step, step)
    if outcome is TaskOutcome.OPEN:
        if a.ok and step is not None and total is not None and step >= total:
            outcome, reason, settled_t = TaskOutcome.SUCCEEDED, "last_step", a.t
        elif not a.ok and a.terminal:
            outcome, reason, settled_t = TaskOutcome.FAILED, f"step_failed:{a.reason or 'error'}", a.t
    return WorkflowSummary(
        workflow_id=workflow_id,
        tenant=tenant,
        outcome=outcome,
        first_t=first_t,
        last_t=last_t,
        model=model,
        reason=reason,
        total_steps=total,
        max_step=max_step,
        attempts=attempts + 1,
        failed_attempts=failed_attempts + (0 if a.ok else 1),
        cost_usd=cost_usd + a.cost_usd,
        failed_attempt_cost_usd=failed_cost_usd + (0.0 if a.ok else a.cost_usd),
        tokens_in=tokens_in + a.tokens_in,
        tokens_out=tokens_out + a.tokens_out,
        settled_t=settled_t,
    )


def apply_outcome(
    prev: WorkflowSummary | None,
    *,
    workflow_id: str,
    tenant: str,
    outcome: TaskOutcome,
    t: float,
    reason: str,
) -> WorkflowSummary:
    if prev is None:
        prev = WorkflowSummary(
            workflow_id=workflow_id, tenant=tenant, outcome=TaskOutcome.OPEN, first_t=t, last_t=t
        )
    return WorkflowSummary(
        **{
            **{f: getattr(prev, f) for f in prev.__struct_fields__},
            "outcome": outcome,
            "reason": reason,
            "settled_t": t,
        }
    )


def is_stale(w: WorkflowSummary, *, now: float, abandon_after_s: float) -> bool:
    return w.outcome is TaskOutcome.OPEN and now - w.last_t >= abandon_after_s
