"""PostgreSQL :class:`LedgerStore`: the ledger several gateway replicas share.

``ledger: {url: postgresql://...}`` in the gateway config selects it. It is the SQLite store's
twin: the same tables (created by the versioned migrations of :mod:`tokenplane.ledger.migrate`), the
same pure rules (:class:`~tokenplane.ledger.store.BaseLedger`), the running economics in
``ledger_totals`` moved in the same transaction as the workflows they sum. Connections come from a
``psycopg_pool`` pool (checked before use, so a restarted server costs no failed request); the
gateway reaches the store through :class:`~tokenplane.ledger.aio.AsyncLedger`, which batches writes
off the request path (one writer thread, one transaction per batch), runs reads on
``read_threads`` threads of their own, and buffers writes while the server is unreachable.

Why a synchronous store under an asyncio face rather than psycopg's async pool: the store keeps the
synchronous :class:`~tokenplane.ledger.store.LedgerStore` protocol that SQLite, the in-memory
ledger and the twin share (and its tests run against all three); the request path never waits on
it (it appends to a list), and a batch is one thread hop whatever its size.

Concurrency between replicas: a batch takes a transaction-level advisory lock per workflow it
touches (in sorted order, so two batches cannot deadlock on them), then reads those workflows,
applies its writes and upserts them: two replicas writing to one workflow serialise, a new workflow
included (a row lock could not cover a row that does not exist yet). The totals rows are updated in
sorted order too. A deadlock or serialization failure the server reports anyway is retried here.

Idempotency: :meth:`PostgresLedger.write_batch` takes one key per write (``keys``); an attempt is
stored with its key under a unique index, and a batch skips the writes whose keys are already
stored. A batch retried after its commit's acknowledgement was lost (the connection dropped) is
therefore not written twice; if the first commit is still in flight on the server, the unique index
fails the retry, which is retried again once it is settled.

Failure modes: every driver or pool error is :class:`LedgerUnavailable` (the batch is rolled back
whole); a server unreachable at start fails the constructor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from tokenplane.core.economics import TaskOutcome
from tokenplane.ledger.errors import LedgerUnavailable
from tokenplane.ledger.migrate import apply_migrations
from tokenplane.ledger.records import AttemptRecord, WorkflowSummary
from tokenplane.ledger.schema import adapt
from tokenplane.ledger.sqlite import (
    _ATTEMPT_COLUMNS,
    _TOTALS_ADD,
    _WF_COLUMNS,
    _WF_SELECT,
    _WF_UPSERT,
    SqlLedger,
)
from tokenplane.ledger.store import DEFAULT_ABANDON_AFTER_S, LedgerWrite, TotalsKey
from tokenplane.ledger.store import add_to_totals as _add_to_totals

__all__ = ["PostgresLedger", "redact_url"]

_RETRIES = 5
"""Attempts of one batch when the server reports a deadlock or a serialization failure."""

_ATTEMPT_INSERT = (
    f"INSERT INTO ledger_attempts ({', '.join(_ATTEMPT_COLUMNS)}, write_id) "
    f"VALUES ({', '.join('%s' for _ in _ATTEMPT_COLUMNS)}, %s)"
)
_LOCK = "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(k, i) ORDER BY i"
_READ = (
    _WF_SELECT.replace("?", "%s")
    + " WHERE (tenant, workflow_id) IN (SELECT * FROM unnest(%s::varchar[], %s::varchar[]))"
)
_SEEN_KEYS = "SELECT write_id FROM ledger_attempts WHERE write_id = ANY(%s::varchar[])"


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable PostgreSQL URL>"
    host, port, db = info.get("host", ""), info.get("port", ""), info.get("dbname", "")
    return f"postgresql://{host}{':' + str(port) if port else ''}/{db}"


def _lock_key(tenant: str, workflow_id: str) -> int:
    digest = hashlib.blake2b(f"{tenant}\x00{workflow_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _f(sql: str) -> str:
    return adapt(sql, "format")


class PostgresLedger(SqlLedger):
    """:class:`LedgerStore` in a PostgreSQL database (its tables in the URL's ``search_path``)."""

    blocking = True
    """Its calls wait on the network: :class:`~tokenplane.ledger.aio.AsyncLedger` runs them off the loop."""
    keyed_writes = True
    """:meth:`write_batch` takes idempotency keys (:class:`~tokenplane.ledger.aio.AsyncLedger` makes them)."""

    def __init__(
        self,
        url: str,
        *,
        abandon_after_s: float = DEFAULT_ABANDON_AFTER_S,
        pool_min_size: int = 1,
        pool_max_size: int = 4,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(abandon_after_s=abandon_after_s)
        self.url = redact_url(url)
        self.read_threads = max(1, pool_max_size - 1)
        """Reads :class:`~tokenplane.ledger.aio.AsyncLedger` may run at once (a connection each;
        the remaining one is for its writer)."""
        self._pool = ConnectionPool(
            url,
            min_size=pool_min_size,
            max_size=pool_max_size,
            timeout=timeout_s,
            open=False,
            check=ConnectionPool.check_connection,
            # The pool's own reconnection backs off without a cap (1 s, 2 s, 4 s...): after a long
            # outage it could wait a minute past the server's return. Giving up after timeout_s
            # instead lets the next batch's request for a connection start a fresh attempt at once.
            reconnect_timeout=timeout_s,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout_s))},
            name="tokenplane-ledger",
        )
        try:
            self._pool.open(wait=True, timeout=timeout_s)
            with self._pool.connection() as conn:
                self.migrated = apply_migrations(conn)
        except psycopg.Error as exc:
            self._pool.close()
            raise LedgerUnavailable(f"ledger {self.url}: cannot open: {exc}") from exc

    # -- writes ------------------------------------------------------------------------------------
    def write_batch(
        self, writes: Sequence[LedgerWrite], keys: Sequence[str | None] | None = None
    ) -> list[WorkflowSummary]:
        """Apply ``writes`` in one transaction; a write whose key (``keys[i]``) is already stored
        is skipped (its result is its workflow as stored)."""
        if not writes:
            return []
        if keys is not None and len(keys) != len(writes):
            raise ValueError("write_batch: one key per write")
        for attempt in range(_RETRIES):
            try:
                with self._pool.connection() as conn, conn.transaction():
                    return self._write(conn, writes, keys)
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                if attempt == _RETRIES - 1:
                    raise LedgerUnavailable(f"ledger {self.url}: write failed: {exc}") from exc
            except psycopg.Error as exc:
                raise LedgerUnavailable(f"ledger {self.url}: write failed: {exc}") from exc
        raise AssertionError("unreachable")

    def _write(
        self, conn: psycopg.Connection, writes: Sequence[LedgerWrite], keys: Sequence[str | None] | None
    ) -> list[WorkflowSummary]:
        cur = conn.cursor()
        wf_keys = sorted({(w.tenant, w.workflow_id) for w in writes})
        cur.execute(_LOCK, (sorted({_lock_key(t, wid) for t, wid in wf_keys}),))
        cur.execute(_READ, ([t for t, _ in wf_keys], [wid for _, wid in wf_keys]))
        state = {(w.tenant, w.workflow_id): w for w in map(self._row, cur.fetchall())}
        seen: set[str] = set()
        given = [k for k in keys or () if k is not None]
        if given:
            cur.execute(_SEEN_KEYS, (given,))
            seen = {str(r[0]) for r in cur.fetchall()}
        out: list[WorkflowSummary] = []
        delta: dict[TotalsKey, list[float]] = {}
        attempts: list[tuple[Any, ...]] = []
        touched: set[tuple[str, str]] = set()
        for i, w in enumerate(writes):
            key = (w.tenant, w.workflow_id)
            prev = state.get(key)
            write_id = keys[i] if keys is not None else None
            if write_id is not None and write_id in seen and prev is not None:
                out.append(prev)  # stored by an earlier try of this batch
                continue
            summary = state[key] = self._apply(prev, w)
            touched.add(key)
            if prev is not None:
                _add_to_totals(delta, prev, -1)
            _add_to_totals(delta, summary, 1)
            if isinstance(w, AttemptRecord):
                attempts.append(
                    (
                        *(
                            int(v) if isinstance(v, bool) else v
                            for v in (getattr(w, c) for c in _ATTEMPT_COLUMNS)
                        ),
                        write_id,
                    )
                )
            out.append(summary)
        if touched:
            cur.executemany(
                _f(_WF_UPSERT), [tuple(getattr(state[k], c) for c in _WF_COLUMNS) for k in sorted(touched)]
            )
        if attempts:
            cur.executemany(_ATTEMPT_INSERT, attempts)
        totals = [
            (kind, group, outcome.value, int(a[0]), a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
            for (kind, group, outcome), a in sorted(delta.items(), key=lambda kv: _totals_order(kv[0]))
            if any(a)
        ]
        if totals:
            cur.executemany(_f(_TOTALS_ADD), totals)
        return out

    def sweep(self, now: float) -> list[WorkflowSummary]:
        rows = self._read(
            "SELECT tenant, workflow_id FROM ledger_workflows WHERE outcome = ? AND last_t <= ?",
            (TaskOutcome.OPEN.value, now - self.abandon_after_s),
        )
        return self._abandon(stale_keys=[(str(t), str(wid)) for t, wid in rows], now=now)

    # -- reads -------------------------------------------------------------------------------------
    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                cur.execute(_f(sql), tuple(params))
                return cur.fetchall()
        except psycopg.Error as exc:
            raise LedgerUnavailable(f"ledger {self.url}: {exc}") from exc

    def close(self) -> None:
        self._pool.close()


def _totals_order(key: TotalsKey) -> tuple[str, str, str]:
    kind, group, outcome = key
    return kind, group, outcome.value
