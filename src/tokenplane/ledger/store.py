"""The ledger interface, and its in-process implementation.

The workflow ledger is state that several gateway replicas share, so it sits behind
:class:`LedgerStore`: :class:`MemoryLedger` (tests, the twin) and
:class:`~tokenplane.ledger.sqlite.SqliteLedger` (the gateway's default, a file path in config)
now; a PostgreSQL store can take their place later without touching the callers. Both concrete
stores derive from :class:`BaseLedger`, which turns the keyword API into :class:`AttemptRecord` /
:class:`OutcomeRecord` writes and applies the shared rules of :mod:`tokenplane.ledger.rules`; a
store implements only :meth:`BaseLedger.write_batch` and the reads.

Every method is synchronous and may block on I/O: the asyncio gateway uses
:class:`~tokenplane.ledger.aio.AsyncLedger`, which runs a store in one worker thread (or, for a
store whose ``blocking`` attribute is false, on the loop itself) and batches writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec
from mypy_extensions import mypyc_attr

from tokenplane.core.economics import EconomicsSummary, TaskOutcome, add_task, summarize_sums
from tokenplane.ledger.errors import InvalidLedgerRecord
from tokenplane.ledger.records import AttemptRecord, WorkflowSummary, implicit_workflow_id
from tokenplane.ledger.rules import apply_attempt, apply_outcome, is_stale, parse_outcome

__all__ = [
    "DEFAULT_ABANDON_AFTER_S",
    "DEFAULT_MAX_SETTLED",
    "TOTALS_FIELDS",
    "BaseLedger",
    "GroupBy",
    "LedgerStore",
    "LedgerWrite",
    "MemoryLedger",
    "OutcomeRecord",
    "TotalsKey",
    "add_to_totals",
]

DEFAULT_ABANDON_AFTER_S = 900.0
"""An open workflow with no attempt for this long is abandoned at the next sweep."""

DEFAULT_MAX_SETTLED = 100_000
"""Settled workflows :class:`MemoryLedger` keeps readable (about 1 KB each with their attempts)."""

GroupBy = Literal["tenant", "model"]

TotalsKey = tuple[str, str, TaskOutcome]
"""``(group kind, group, outcome)``: kind ``""`` (the whole ledger, group ``""``), ``tenant``, ``model``."""
TOTALS_FIELDS = ("tasks", "cost_usd", "failed_attempt_cost_usd", "tokens", "attempts", "failed_attempts")


def totals_keys(w: WorkflowSummary) -> tuple[TotalsKey, TotalsKey, TotalsKey]:
    """The running sums one workflow counts in: the whole ledger's, its tenant's, its model's."""
    return ("", "", w.outcome), ("tenant", w.tenant, w.outcome), ("model", w.model, w.outcome)


def add_to_totals(acc: dict[TotalsKey, list[float]], w: WorkflowSummary, sign: int) -> None:
    """Add (``sign`` 1) or take back (-1) one workflow's part of the running economics: a write
    takes back the workflow's previous state and adds its new one, so reads never scan workflows."""
    for key in totals_keys(w):
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0.0] * 6
        add_task(a, w, sign)


class OutcomeRecord(msgspec.Struct, frozen=True, gc=False):
    """A client's (or the sweep's) verdict on a workflow.

    ``if_idle_since`` (the sweep's): apply only if the workflow is still open and had no attempt
    after that time, so an attempt that lands between the sweep's read and its write wins.
    """

    workflow_id: str
    tenant: str
    outcome: TaskOutcome
    t: float
    reason: str = "client"
    if_idle_since: float | None = None


LedgerWrite = AttemptRecord | OutcomeRecord


class LedgerStore(Protocol):
    """Spend per request and per workflow, and workflow outcomes, per tenant."""

    @property
    def abandon_after_s(self) -> float: ...

    def record_attempt(
        self,
        *,
        request_id: str,
        workflow_id: str | None,
        tenant: str,
        instance_id: str,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float,
        ok: bool,
        reason: str,
        t: float,
        model: str = "",
        step: int | None = None,
        total_steps: int | None = None,
        terminal: bool = False,
    ) -> WorkflowSummary:
        """Record one attempt; returns its workflow after the outcome rules were applied."""
        ...

    def record_outcome(
        self, workflow_id: str, tenant: str, outcome: str | TaskOutcome, t: float, *, reason: str = "client"
    ) -> WorkflowSummary: ...

    def write_batch(self, writes: Sequence[LedgerWrite]) -> list[WorkflowSummary]:
        """Apply validated writes in order, atomically where the store can; one result per write."""
        ...

    def get_workflow(self, workflow_id: str, tenant: str) -> WorkflowSummary | None:
        """The tenant's workflow; ``None`` if it does not exist *or belongs to another tenant*."""
        ...

    def list_attempts(self, workflow_id: str, tenant: str) -> list[AttemptRecord]: ...

    def request_cost(self, request_id: str, tenant: str) -> float | None:
        """Spend on all attempts of one request (retries included); ``None`` if unknown."""
        ...

    def sweep(self, now: float) -> list[WorkflowSummary]:
        """Abandon open workflows idle for ``abandon_after_s``; returns those it abandoned."""
        ...

    def tenant_totals(self, tenant: str) -> EconomicsSummary: ...

    def economics(self, *, by: GroupBy | None = None) -> dict[str, EconomicsSummary]:
        """Aggregates for metrics; ``by=None`` gives one entry under ``""`` (the whole ledger)."""
        ...

    def close(self) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)  # SqliteLedger is not compiled (setup.py)
class BaseLedger:
    """The keyword API and the shared rules; subclasses store and read."""

    def __init__(self, *, abandon_after_s: float = DEFAULT_ABANDON_AFTER_S) -> None:
        if not abandon_after_s > 0:
            raise InvalidLedgerRecord(f"abandon_after_s must be > 0, got {abandon_after_s!r}")
        self._abandon_after_s = float(abandon_after_s)

    @property
    def abandon_after_s(self) -> float:
        return self._abandon_after_s

    @staticmethod
    def attempt(
        *,
        request_id: str,
        workflow_id: str | None,
        tenant: str,
        instance_id: str,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float,
        ok: bool,
        reason: str,
        t: float,
        model: str = "",
        step: int | None = None,
        total_steps: int | None = None,
        terminal: bool = False,
    ) -> AttemptRecord:
        """A validated attempt; a request without a workflow is its own one-step task."""
        if workflow_id is None:
            workflow_id = implicit_workflow_id(request_id)
            step, total_steps = 1, 1
        return AttemptRecord(
            request_id=request_id,
            workflow_id=workflow_id,
            tenant=tenant,
            instance_id=instance_id,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost_usd,
            ok=ok,
            reason=reason,
            t=t,
            model=model,
            step=step,
            total_steps=total_steps,
            terminal=terminal,
        ).validate()

    @staticmethod
    def outcome(
        workflow_id: str, tenant: str, outcome: str | TaskOutcome, t: float, *, reason: str = "client"
    ) -> OutcomeRecord:
        if not workflow_id or not tenant:
            raise InvalidLedgerRecord("workflow_id and tenant must not be empty")
        return OutcomeRecord(workflow_id, tenant, parse_outcome(outcome), t, reason)

    def record_attempt(
        self,
        *,
        request_id: str,
        workflow_id: str | None,
        tenant: str,
        instance_id: str,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float,
        ok: bool,
        reason: str,
        t: float,
        model: str = "",
        step: int | None = None,
        total_steps: int | None = None,
        terminal: bool = False,
    ) -> WorkflowSummary:
        record = self.attempt(
            request_id=request_id,
            workflow_id=workflow_id,
            tenant=tenant,
            instance_id=instance_id,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost_usd,
            ok=ok,
            reason=reason,
            t=t,
            model=model,
            step=step,
            total_steps=total_steps,
            terminal=terminal,
        )
        return self.write_batch([record])[0]

    def record_outcome(
        self, workflow_id: str, tenant: str, outcome: str | TaskOutcome, t: float, *, reason: str = "client"
    ) -> WorkflowSummary:
        return self.write_batch([self.outcome(workflow_id, tenant, outcome, t, reason=reason)])[0]

    def write_batch(self, writes: Sequence[LedgerWrite]) -> list[WorkflowSummary]:
        raise NotImplementedError

    @staticmethod
    def _apply(prev: WorkflowSummary | None, w: LedgerWrite) -> WorkflowSummary:
        if isinstance(w, AttemptRecord):
            return apply_attempt(prev, w)
        if w.if_idle_since is not None and (
            prev is None or prev.outcome is not TaskOutcome.OPEN or prev.last_t > w.if_idle_since
        ):
            return (
                prev
                if prev is not None
                else apply_outcome(
                    None,
                    workflow_id=w.workflow_id,
                    tenant=w.tenant,
                    outcome=w.outcome,
                    t=w.t,
                    reason=w.reason,
                )
            )
        return apply_outcome(
            prev, workflow_id=w.workflow_id, tenant=w.tenant, outcome=w.outcome, t=w.t, reason=w.reason
        )

    def _abandon(self, *, stale_keys: Sequence[tuple[str, str]], now: float) -> list[WorkflowSummary]:
        """Abandon the given workflows if still idle at write time; returns those abandoned."""
        idle_since = now - self._abandon_after_s
        writes = [
            OutcomeRecord(wid, tenant, TaskOutcome.ABANDONED, now, "abandoned", if_idle_since=idle_since)
            for tenant, wid in stale_keys
        ]
        results = self.write_batch(writes)
        return [w for w in results if w.outcome is TaskOutcome.ABANDONED and w.settled_t == now]

    def close(self) -> None:
        return None


class MemoryLedger(BaseLedger):
    """In-process :class:`LedgerStore`: dicts, no persistence, not shared between processes.

    Bounded: it keeps every open workflow (the sweep settles idle ones) and the ``max_settled``
    most recently settled ones; older settled workflows, their attempts and their requests' costs
    are forgotten (reads then find nothing, and a late write starts the workflow afresh), while the
    economics keep counting them. Economics are
    running sums per tenant, per model and overall, moved on every write, so a read costs
    O(groups), not O(workflows ever seen); the sweep looks at open workflows only.
    """

    blocking = False
    """Its calls do no I/O: :class:`~tokenplane.ledger.aio.AsyncLedger` runs them on the loop."""

    def __init__(
        self, *, abandon_after_s: float = DEFAULT_ABANDON_AFTER_S, max_settled: int = DEFAULT_MAX_SETTLED
    ) -> None:
        super().__init__(abandon_after_s=abandon_after_s)
        if max_settled < 0:
            raise InvalidLedgerRecord(f"max_settled must be >= 0, got {max_settled!r}")
        self.max_settled = max_settled
        self._workflows: dict[tuple[str, str], WorkflowSummary] = {}
        # tuples, not lists: a tuple of untracked records leaves the cyclic collector's lists
        self._attempts: dict[tuple[str, str], tuple[AttemptRecord, ...]] = {}
        self._request_cost: dict[tuple[str, str], float] = {}
        self._open: dict[tuple[str, str], None] = {}
        # The settled, in a line (oldest first): workflow -> its place, and place -> workflow. Not
        # one dict popped from the front: that leaves dummies every later next(iter(...)) walks
        # past, ~50 µs a write at 100,000 entries (bench/ledger_scale.py). Not an OrderedDict
        # either: plain dicts of strings, ints and string tuples leave the cyclic collector's
        # lists, where an OrderedDict of 100,000 is walked by every full collection (~20 ms).
        self._settled: dict[tuple[str, str], int] = {}
        self._line: dict[int, tuple[str, str]] = {}
        self._head = 0  # no place before it is in the line
        self._next_place = 0
        self._totals: dict[TotalsKey, list[float]] = {}

    def write_batch(self, writes: Sequence[LedgerWrite]) -> list[WorkflowSummary]:
        out: list[WorkflowSummary] = []
        for w in writes:
            key = (w.tenant, w.workflow_id)
            prev = self._workflows.get(key)
            summary = self._apply(prev, w)
            if prev is not None:
                add_to_totals(self._totals, prev, -1)
                self._clear_empty(prev)
            add_to_totals(self._totals, summary, 1)
            self._workflows[key] = summary
            place = self._settled.pop(key, None)  # (re)settled: to the back of the line
            if place is not None:
                del self._line[place]
            if summary.outcome is TaskOutcome.OPEN:
                self._open[key] = None
            else:
                self._open.pop(key, None)
                self._settled[key] = self._next_place
                self._line[self._next_place] = key
                self._next_place += 1
            if isinstance(w, AttemptRecord):
                self._attempts[key] = (*self._attempts.get(key, ()), w)
                rkey = (w.tenant, w.request_id)
                self._request_cost[rkey] = self._request_cost.get(rkey, 0.0) + w.cost_usd
            out.append(summary)
        self._forget_beyond_bound()
        return out

    def _clear_empty(self, w: WorkflowSummary) -> None:
        """Exact zeros, not rounding residue, under an outcome no task holds any more."""
        for key in totals_keys(w):
            a = self._totals[key]
            if a[0] == 0:
                a[:] = [0.0] * 6

    def _forget_beyond_bound(self) -> None:
        settled = self._settled
        line = self._line
        while len(settled) > self.max_settled:
            while self._head not in line:  # places left by workflows settled again since
                self._head += 1
            key = line.pop(self._head)
            self._head += 1
            del settled[key]
            del self._workflows[key]
            for a in self._attempts.pop(key, ()):
                self._request_cost.pop((a.tenant, a.request_id), None)

    def get_workflow(self, workflow_id: str, tenant: str) -> WorkflowSummary | None:
        return self._workflows.get((tenant, workflow_id))

    def list_attempts(self, workflow_id: str, tenant: str) -> list[AttemptRecord]:
        return sorted(self._attempts.get((tenant, workflow_id), ()), key=lambda a: a.t)

    def request_cost(self, request_id: str, tenant: str) -> float | None:
        return self._request_cost.get((tenant, request_id))

    def sweep(self, now: float) -> list[WorkflowSummary]:
        workflows = self._workflows
        stale = [
            workflows[k]
            for k in self._open
            if is_stale(workflows[k], now=now, abandon_after_s=self._abandon_after_s)
        ]
        writes = [
            OutcomeRecord(w.workflow_id, w.tenant, TaskOutcome.ABANDONED, now, "abandoned") for w in stale
        ]
        return self.write_batch(writes)

    def _summary(self, kind: str, group: str) -> EconomicsSummary:
        totals = self._totals
        return summarize_sums(
            {o: totals[(kind, group, o)] for o in TaskOutcome if (kind, group, o) in totals}
        )

    def tenant_totals(self, tenant: str) -> EconomicsSummary:
        return self._summary("tenant", tenant)

    def economics(self, *, by: GroupBy | None = None) -> dict[str, EconomicsSummary]:
        if by is None:
            return {"": self._summary("", "")}
        return {g: self._summary(by, g) for g in sorted({g for k, g, _ in self._totals if k == by})}
