"""The workflow ledger: spend per request and per workflow, workflow outcomes, task economics.

State that several gateway replicas share, behind the small :class:`LedgerStore` protocol:
:class:`MemoryLedger` and :class:`SqliteLedger` now, PostgreSQL later (the schema in
:mod:`tokenplane.ledger.schema` is portable). :class:`AsyncLedger` is the gateway's asyncio face.
"""

from tokenplane.ledger.aio import AsyncLedger
from tokenplane.ledger.errors import InvalidLedgerRecord, LedgerError, LedgerUnavailable
from tokenplane.ledger.records import AttemptRecord, TaskOutcome, WorkflowSummary, implicit_workflow_id
from tokenplane.ledger.schema import SCHEMA_SQL
from tokenplane.ledger.sqlite import SqliteLedger
from tokenplane.ledger.store import DEFAULT_ABANDON_AFTER_S, LedgerStore, MemoryLedger, OutcomeRecord

__all__ = [
    "DEFAULT_ABANDON_AFTER_S",
    "SCHEMA_SQL",
    "AsyncLedger",
    "AttemptRecord",
    "InvalidLedgerRecord",
    "LedgerError",
    "LedgerStore",
    "LedgerUnavailable",
    "MemoryLedger",
    "OutcomeRecord",
    "SqliteLedger",
    "TaskOutcome",
    "WorkflowSummary",
    "implicit_workflow_id",
]
