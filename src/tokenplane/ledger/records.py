"""What the ledger stores: attempts (append-only) and one running summary per workflow.

A workflow is keyed by ``(tenant, workflow_id)``: two tenants may use the same id and never see
each other's. A request sent without a workflow id is its own one-step task, recorded under the id
``request:<request_id>`` so that cost per successful task counts it too.
"""

from __future__ import annotations

import math

import msgspec

from tokenplane.core.economics import TaskCost, TaskOutcome
from tokenplane.ledger.errors import InvalidLedgerRecord

__all__ = [
    "IMPLICIT_WORKFLOW_PREFIX",
    "AttemptRecord",
    "TaskOutcome",
    "WorkflowSummary",
    "implicit_workflow_id",
]

IMPLICIT_WORKFLOW_PREFIX = "request:"


def implicit_workflow_id(request_id: str) -> str:
    return IMPLICIT_WORKFLOW_PREFIX + request_id


class AttemptRecord(msgspec.Struct, frozen=True, gc=False):
    """One attempt of one request on one instance, with what it cost (see core.economics).

    ``gc=False`` here and on :class:`WorkflowSummary`: they hold only strings and numbers (no
    cycles), and an in-memory ledger keeps hundreds of thousands of them, which the cyclic
    collector would otherwise scan on every full collection (``bench/ledger_scale.py``).

    ``step``/``total_steps`` come from the request's workflow context; ``terminal`` says that a
    failed attempt will not be retried, so the step (and the workflow) failed.
    """

    request_id: str
    workflow_id: str
    tenant: str
    instance_id: str
    tokens_in: int
    tokens_out: int
    cost_usd: float
    ok: bool
    reason: str
    t: float
    model: str = ""
    step: int | None = None
    total_steps: int | None = None
    terminal: bool = False

    def validate(self) -> AttemptRecord:
        if not self.request_id:
            raise InvalidLedgerRecord("request_id must not be empty")
        if not self.workflow_id:
            raise InvalidLedgerRecord("workflow_id must not be empty")
        if not self.tenant:
            raise InvalidLedgerRecord("tenant must not be empty")
        for name in ("tokens_in", "tokens_out"):
            if getattr(self, name) < 0:
                raise InvalidLedgerRecord(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (math.isfinite(self.cost_usd) and self.cost_usd >= 0):
            raise InvalidLedgerRecord(f"cost_usd must be a finite number >= 0, got {self.cost_usd!r}")
        if not math.isfinite(self.t):
            raise InvalidLedgerRecord(f"t must be finite, got {self.t!r}")
        if self.step is not None and self.step < 1:
            raise InvalidLedgerRecord(f"step must be >= 1, got {self.step}")
        if self.total_steps is not None and self.total_steps < 1:
            raise InvalidLedgerRecord(f"total_steps must be >= 1, got {self.total_steps}")
        return self


class WorkflowSummary(msgspec.Struct, frozen=True, gc=False):
    """A workflow's spend and state, as ``GET /v1/workflows/{id}`` shows it to its tenant.

    ``model`` is the model of the first attempt (a fallback to another model does not move the
    task). ``reason`` says how it settled: ``last_step``, ``client``, ``step_failed:<reason>``,
    ``abandoned``.
    """

    workflow_id: str
    tenant: str
    outcome: TaskOutcome
    first_t: float
    last_t: float
    model: str = ""
    reason: str = ""
    total_steps: int | None = None
    max_step: int = 0
    attempts: int = 0
    failed_attempts: int = 0
    cost_usd: float = 0.0
    failed_attempt_cost_usd: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    settled_t: float | None = None

    def task_cost(self) -> TaskCost:
        return TaskCost(
            workflow_id=self.workflow_id,
            tenant=self.tenant,
            outcome=self.outcome,
            cost_usd=self.cost_usd,
            model=self.model,
            attempts=self.attempts,
            failed_attempts=self.failed_attempts,
            failed_attempt_cost_usd=self.failed_attempt_cost_usd,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
        )
