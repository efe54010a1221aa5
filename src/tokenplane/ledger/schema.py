"""The ledger's tables, in SQL that SQLite and PostgreSQL both accept, and a placeholder adapter.

Portability rules kept here: standard types only (``VARCHAR(n)``, ``INTEGER``, ``BIGINT``,
``DOUBLE PRECISION``, ``SMALLINT`` for booleans as 0/1); no ``AUTOINCREMENT``/``SERIAL`` (attempts
need no surrogate key: they are append-only and read by index); ``CREATE ... IF NOT EXISTS``;
upserts as ``INSERT ... ON CONFLICT (...) DO UPDATE SET col = excluded.col`` (SQLite >= 3.24,
PostgreSQL >= 9.5). Queries are written with ``?`` placeholders; :func:`adapt` rewrites them for a
driver's paramstyle (``%s`` for psycopg). No query may contain a literal ``?`` or ``%``.

Times are the shell's clock in seconds (a float): the gateway's wall clock, the twin's virtual time.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["SCHEMA_SQL", "SCHEMA_VERSION", "Paramstyle", "adapt", "schema_statements"]

SCHEMA_VERSION = 2
"""2 added ``ledger_totals`` (running economics; a store filled by version 1 backfills it once)."""

Paramstyle = Literal["qmark", "format"]

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS ledger_meta (
    name VARCHAR(64) NOT NULL PRIMARY KEY,
    value VARCHAR(256) NOT NULL
);

CREATE TABLE IF NOT EXISTS ledger_workflows (
    tenant VARCHAR(128) NOT NULL,
    workflow_id VARCHAR(300) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    first_t DOUBLE PRECISION NOT NULL,
    last_t DOUBLE PRECISION NOT NULL,
    model VARCHAR(256) NOT NULL,
    reason VARCHAR(256) NOT NULL,
    total_steps INTEGER,
    max_step INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    failed_attempts INTEGER NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    failed_attempt_cost_usd DOUBLE PRECISION NOT NULL,
    tokens_in BIGINT NOT NULL,
    tokens_out BIGINT NOT NULL,
    settled_t DOUBLE PRECISION,
    PRIMARY KEY (tenant, workflow_id)
);

CREATE INDEX IF NOT EXISTS ledger_workflows_by_state ON ledger_workflows (outcome, last_t);

CREATE TABLE IF NOT EXISTS ledger_attempts (
    tenant VARCHAR(128) NOT NULL,
    workflow_id VARCHAR(300) NOT NULL,
    request_id VARCHAR(256) NOT NULL,
    instance_id VARCHAR(256) NOT NULL,
    model VARCHAR(256) NOT NULL,
    step INTEGER,
    total_steps INTEGER,
    tokens_in BIGINT NOT NULL,
    tokens_out BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    ok SMALLINT NOT NULL,
    terminal SMALLINT NOT NULL,
    reason VARCHAR(256) NOT NULL,
    t DOUBLE PRECISION NOT NULL
);

CREATE INDEX IF NOT EXISTS ledger_attempts_by_workflow ON ledger_attempts (tenant, workflow_id, t);
CREATE INDEX IF NOT EXISTS ledger_attempts_by_request ON ledger_attempts (tenant, request_id);

CREATE TABLE IF NOT EXISTS ledger_totals (
    grp_kind VARCHAR(8) NOT NULL,
    grp VARCHAR(256) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    tasks BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    failed_attempt_cost_usd DOUBLE PRECISION NOT NULL,
    tokens BIGINT NOT NULL,
    attempts BIGINT NOT NULL,
    failed_attempts BIGINT NOT NULL,
    PRIMARY KEY (grp_kind, grp, outcome)
);
"""


def schema_statements() -> list[str]:
    """:data:`SCHEMA_SQL` split into single statements (drivers that execute one at a time)."""
    return [s.strip() for s in SCHEMA_SQL.split(";") if s.strip()]


def adapt(sql: str, paramstyle: Paramstyle) -> str:
    """A ``?``-placeholder query in the driver's paramstyle (``format``: ``%s``, as psycopg)."""
    return sql if paramstyle == "qmark" else sql.replace("?", "%s")
