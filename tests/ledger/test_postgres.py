"""The PostgreSQL ledger against the real server: migrations, replicas writing together, idempotent
retries, and writes buffered while the database is unreachable (a TCP proxy cut in the test)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tokenplane.core.economics import TaskOutcome
from tokenplane.ledger import AsyncLedger, LedgerBufferFull, LedgerUnavailable
from tokenplane.ledger.migrate import applied_versions, migrations
from tokenplane.ledger.postgres import PostgresLedger
from tokenplane.ledger.store import LedgerWrite

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from pg_support import in_schema
from tcp_proxy import TcpProxy

FIELDS: dict[str, Any] = dict(
    tenant="acme",
    instance_id="i0",
    tokens_in=100,
    tokens_out=10,
    cost_usd=0.25,
    ok=True,
    reason="",
    model="m",
)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    p = TcpProxy("127.0.0.1", 5432)
    p.start()
    yield p
    p.close()


def via(url: str, proxy: TcpProxy) -> str:
    return url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")


def attempts_in(url: str) -> list[tuple[str, str | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            b"SELECT request_id, write_id FROM ledger_attempts ORDER BY request_id"
        ).fetchall()
    return [(str(r), w) for r, w in rows]


def test_migrations_run_once_in_order_and_are_recorded(pg_url: str) -> None:
    opened: list[PostgresLedger] = []
    lock = threading.Lock()

    def open_one() -> None:
        s = PostgresLedger(pg_url)
        with lock:
            opened.append(s)

    threads = [threading.Thread(target=open_one) for _ in range(4)]  # four replicas start together
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v for s in opened for v in s.migrated) == [m.version for m in migrations()] == [1, 2]
    for s in opened:
        s.close()
    with psycopg.connect(pg_url) as conn:
        assert applied_versions(conn) == [1, 2]
        names = [r[0] for r in conn.execute(b"SELECT name FROM ledger_migrations ORDER BY version")]
    assert names == ["initial", "attempt_write_ids"]
    again = PostgresLedger(pg_url)
    assert again.migrated == []
    again.close()


def test_a_batch_tried_again_with_its_keys_is_not_written_twice(pg_url: str) -> None:
    s = PostgresLedger(pg_url)
    writes: list[LedgerWrite] = [
        s.attempt(request_id=f"r{i}", workflow_id="w", t=float(i), step=i, total_steps=3, **FIELDS)
        for i in (1, 2)
    ]
    first = s.write_batch(writes, ["k1", "k2"])
    again = s.write_batch(writes, ["k1", "k2"])  # as after a commit whose acknowledgement was lost
    assert again[-1] == first[-1]
    w = s.get_workflow("w", "acme")
    assert w is not None and w.attempts == 2 and w.cost_usd == pytest.approx(0.5)
    assert s.tenant_totals("acme").cost_open_usd == pytest.approx(0.5)  # the totals moved once too
    assert [r for r, _ in attempts_in(pg_url)] == ["r1", "r2"]
    s.close()


def test_two_replicas_writing_the_same_workflows_lose_no_update(pg_url: str) -> None:
    """Two stores (as two gateway processes) write to the same workflows at once, new ones
    included: every attempt counts once, and the running totals equal a recount."""
    stores = [PostgresLedger(pg_url), PostgresLedger(pg_url)]
    per_replica, workflows = 120, 6

    def run(r: int) -> None:
        s = stores[r]
        for i in range(0, per_replica, 4):
            s.write_batch(
                [
                    s.attempt(request_id=f"r{r}-{j}", workflow_id=f"w{j % workflows}", t=float(j), **FIELDS)
                    for j in range(i, i + 4)
                ]
            )

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = 0
    for k in range(workflows):
        w = stores[0].get_workflow(f"w{k}", "acme")
        assert w is not None and w.attempts == 2 * per_replica // workflows
        total += w.attempts
    assert total == 2 * per_replica
    eco = stores[1].economics()[""]
    assert eco.tasks_open == workflows
    assert eco.cost_open_usd == pytest.approx(0.25 * 2 * per_replica)
    for s in stores:
        s.close()


def test_writes_wait_while_the_database_is_cut_off_then_land_once(pg_url: str, proxy: TcpProxy) -> None:
    store = PostgresLedger(via(pg_url, proxy), timeout_s=1.0)
    n = 300

    async def main() -> None:
        ledger = AsyncLedger(store, max_batch=64, retry_max_s=0.2)
        written: list[str] = []
        ledger.record_attempt_nowait(lambda w, s, e: written.append(w.request_id), request_id="before",
                                     workflow_id="w0", t=0.0, step=1, total_steps=2, **FIELDS)  # fmt: skip
        await ledger.flush()
        proxy.cut()
        for i in range(n):
            ledger.record_attempt_nowait(
                lambda w, s, e: written.append(w.request_id) if e is None else None,
                request_id=f"r{i}",
                workflow_id=f"w{i % 10}",
                t=1.0 + i,
                **FIELDS,
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while ledger.unavailable is None:  # the first batch fails (the pool's check, then a connect)
            assert loop.time() < deadline
            await asyncio.sleep(0.02)
        assert ledger.buffered == n
        started = loop.time()
        with pytest.raises(LedgerUnavailable):  # reads and awaited writes fail at once, not hang
            await ledger.get_workflow("w0", "acme")
        with pytest.raises(LedgerUnavailable):
            await ledger.record_outcome("w0", "acme", "succeeded", 5.0)
        assert loop.time() - started < 0.5
        while ledger.retries < 3:  # several tries fail meanwhile (each waits timeout_s for a connection)
            assert loop.time() < deadline
            await asyncio.sleep(0.05)
        assert ledger.buffered == n
        proxy.restore()
        restored = loop.time()
        await asyncio.wait_for(ledger.flush(), 15)
        print(f"queued writes committed {loop.time() - restored:.2f} s after the database came back")
        assert ledger.unavailable is None and ledger.buffered == 0 and ledger.dropped == 0
        assert sorted(written) == sorted(["before", *(f"r{i}" for i in range(n))])
        w = await ledger.get_workflow("w3", "acme")
        assert w is not None and w.attempts == n // 10
        await ledger.aclose()

    asyncio.run(main())
    rows = attempts_in(pg_url)
    assert len(rows) == n + 1 == len({r for r, _ in rows}) == len({k for _, k in rows})


def test_a_full_buffer_drops_and_counts(pg_url: str, proxy: TcpProxy) -> None:
    store = PostgresLedger(via(pg_url, proxy), timeout_s=1.0)

    async def main() -> None:
        ledger = AsyncLedger(store, max_batch=8, max_buffered=20, retry_max_s=0.1, close_timeout_s=5)
        errors: list[BaseException | None] = []
        proxy.cut()
        for i in range(25):
            ledger.record_attempt_nowait(
                lambda w, s, e: errors.append(e), request_id=f"r{i}", workflow_id=None, t=float(i), **FIELDS
            )
        assert ledger.dropped == 5 and ledger.buffered == 20
        assert len(errors) == 5 and all(isinstance(e, LedgerBufferFull) for e in errors)
        await asyncio.sleep(0.3)
        proxy.restore()
        await asyncio.wait_for(ledger.flush(), 15)
        assert errors.count(None) == 20
        await ledger.aclose()

    asyncio.run(main())
    assert [r for r, _ in attempts_in(pg_url)] == sorted(f"r{i}" for i in range(20))


class LostAcknowledgement:
    """The real store, but its first batch's commit is not acknowledged (it commits, then the
    caller sees the connection fail): the case idempotency keys exist for. A wrapper, not a
    subclass: the compiled build's classes are not subclassed by tests."""

    def __init__(self, inner: PostgresLedger) -> None:
        self.inner = inner
        self.lost = 0
        self.keyed_writes = True

    def write_batch(self, writes: Sequence[LedgerWrite], keys: Sequence[str | None] | None = None) -> Any:
        out = self.inner.write_batch(writes, keys)
        if self.lost == 0:
            self.lost += 1
            raise LedgerUnavailable("connection lost after COMMIT")
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_commit_whose_acknowledgement_was_lost_is_not_written_twice(pg_url: str) -> None:
    store = LostAcknowledgement(PostgresLedger(pg_url))

    async def main() -> None:
        ledger = AsyncLedger(store, retry_min_s=0.01)  # type: ignore[arg-type]
        done: list[Any] = []
        for i in range(5):
            ledger.record_attempt_nowait(lambda w, s, e: done.append(s), request_id=f"r{i}", workflow_id="w",
                                         t=float(i), **FIELDS)  # fmt: skip
        await ledger.flush()
        assert store.lost == 1 and ledger.retries == 1
        assert [s.attempts for s in done] == [5] * 5  # the stored workflow, once
        w = await ledger.get_workflow("w", "acme")
        assert w is not None and w.attempts == 5
        assert (await ledger.tenant_totals("acme")).cost_open_usd == pytest.approx(1.25)
        await ledger.aclose()

    asyncio.run(main())
    assert len(attempts_in(pg_url)) == 5


def test_unreachable_at_start_fails_with_the_address_and_no_password() -> None:
    started = time.monotonic()
    with pytest.raises(LedgerUnavailable, match=r"postgresql://127\.0\.0\.1:1/x") as info:
        PostgresLedger("postgresql://postgres:s3cret@127.0.0.1:1/x", timeout_s=1.0)
    assert "s3cret" not in str(info.value)
    assert time.monotonic() - started < 10


def test_outcome_from_another_replica(pg_url: str) -> None:
    a, b = PostgresLedger(pg_url), PostgresLedger(pg_url)
    a.record_attempt(request_id="r1", workflow_id="w", t=1.0, step=1, total_steps=3, **FIELDS)
    w = b.record_outcome("w", "acme", "succeeded", 2.0)
    assert w.outcome is TaskOutcome.SUCCEEDED and w.attempts == 1
    got = a.get_workflow("w", "acme")
    assert got is not None and got.outcome is TaskOutcome.SUCCEEDED
    assert a.tenant_totals("acme").tasks_completed == 1
    a.close()
    b.close()


def test_schema_per_url(pg_database: str) -> None:
    """Two schemas in one database are two ledgers (how the tests isolate, and an operator may)."""
    one, two = (
        PostgresLedger(in_schema(pg_database, "s_one")),
        PostgresLedger(in_schema(pg_database, "s_two")),
    )
    one.record_attempt(request_id="r1", workflow_id="w", t=1.0, **FIELDS)
    assert two.get_workflow("w", "acme") is None
    one.close()
    two.close()


def test_after_an_outage_with_nothing_queued_the_next_call_tries_the_database(
    pg_url: str, proxy: TcpProxy
) -> None:
    """An awaited write that failed leaves nothing queued: once the database is back, the next
    read or write goes to it (no error remembered from the outage)."""
    store = PostgresLedger(via(pg_url, proxy), timeout_s=1.0)

    async def main() -> None:
        ledger = AsyncLedger(store, retry_max_s=0.1)
        await ledger.record_attempt(request_id="r1", workflow_id="w", t=1.0, step=1, total_steps=3, **FIELDS)
        proxy.cut()
        with pytest.raises(LedgerUnavailable):
            await ledger.record_outcome("w", "acme", "succeeded", 2.0)
        assert ledger.unavailable is not None
        proxy.restore()
        await ledger.flush()
        w = await ledger.get_workflow("w", "acme")
        assert w is not None and w.outcome is TaskOutcome.OPEN  # the failed outcome was not written
        w = await ledger.record_outcome("w", "acme", "succeeded", 3.0)
        assert w.outcome is TaskOutcome.SUCCEEDED and ledger.unavailable is None
        await ledger.aclose()

    asyncio.run(main())


class MeetingReads:
    """The real store, whose ``get_workflow`` waits until a second read has started too."""

    def __init__(self, inner: PostgresLedger) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(2, timeout=10)

    def get_workflow(self, workflow_id: str, tenant: str) -> Any:
        self.barrier.wait()  # BrokenBarrierError if the reads ran one after the other
        return self.inner.get_workflow(workflow_id, tenant)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_reads_are_served_at_once_on_the_pool(pg_url: str) -> None:
    store = MeetingReads(PostgresLedger(pg_url, pool_max_size=3))

    async def main() -> None:
        ledger = AsyncLedger(store)  # type: ignore[arg-type]
        await ledger.record_attempt(request_id="r1", workflow_id="w", t=1.0, **FIELDS)
        a, b = await asyncio.gather(ledger.get_workflow("w", "acme"), ledger.get_workflow("w", "acme"))
        assert a == b and a is not None and a.attempts == 1
        await ledger.aclose()

    asyncio.run(main())


def test_the_migrations_build_the_tables_of_the_sqlite_schema(pg_url: str) -> None:
    """The schema is written twice (``ledger/schema.py`` for SQLite, the migrations for PostgreSQL:
    a released migration is never edited, so it cannot be rendered from a schema that moves on).
    This keeps the two from drifting: the same tables, the same columns in the same order, the same
    nullability; PostgreSQL alone has ``ledger_migrations`` and the attempts' idempotency keys."""
    import sqlite3

    from tokenplane.ledger.schema import SCHEMA_SQL

    lite = sqlite3.connect(":memory:")
    lite.executescript(SCHEMA_SQL)
    tables = [r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    want = {
        t: [(c[1], bool(c[3] or c[5])) for c in lite.execute(f"PRAGMA table_info({t})")]
        for t in tables
        if t != "ledger_meta"  # SQLite's own schema version; PostgreSQL records ledger_migrations
    }
    want["ledger_attempts"].append(("write_id", False))
    PostgresLedger(pg_url, timeout_s=5.0).close()  # applies the migrations
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            b"SELECT table_name, column_name, is_nullable FROM information_schema.columns"
            b" WHERE table_schema = current_schema() AND table_name <> 'ledger_migrations'"
            b" ORDER BY table_name, ordinal_position"
        ).fetchall()
    got: dict[str, list[tuple[str, bool]]] = {}
    for table, column, nullable in rows:
        got.setdefault(str(table), []).append((str(column), nullable == "NO"))
    assert got == want
