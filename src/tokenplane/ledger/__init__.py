"""The workflow ledger: spend per request and per workflow, workflow outcomes, task economics.

State that several gateway replicas share, behind the small :class:`LedgerStore` protocol:
:class:`MemoryLedger` (one process), :class:`SqliteLedger` (one file, one host) and
:class:`~tokenplane.ledger.postgres.PostgresLedger` (one database, any number of replicas; imported
from its module, so that psycopg loads only when it is used). :class:`AsyncLedger` is the gateway's
asyncio face: batched writes off the request path, buffered while the store is unreachable.
"""

from tokenplane.ledger.aio import AsyncLedger
from tokenplane.ledger.errors import InvalidLedgerRecord, LedgerBufferFull, LedgerError, LedgerUnavailable
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
    "LedgerBufferFull",
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
