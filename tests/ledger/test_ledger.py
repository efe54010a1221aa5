"""Both ledger stores through the same tests: attribution, outcome rules, sweep, tenant isolation."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tokenplane.core.economics import TaskOutcome
from tokenplane.ledger import (
    SCHEMA_SQL,
    AsyncLedger,
    InvalidLedgerRecord,
    LedgerStore,
    MemoryLedger,
    SqliteLedger,
    implicit_workflow_id,
)
from tokenplane.ledger.schema import adapt, schema_statements

ABANDON_S = 60.0


def open_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> LedgerStore:
    if kind == "memory":
        return MemoryLedger(abandon_after_s=ABANDON_S)
    if kind == "sqlite":
        return SqliteLedger(tmp_path / "ledger.db", abandon_after_s=ABANDON_S)
    from tokenplane.ledger.postgres import PostgresLedger

    return PostgresLedger(request.getfixturevalue("pg_url"), abandon_after_s=ABANDON_S)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    s = open_store(request.param, request, tmp_path)
    yield s
    s.close()


def attempt(store: LedgerStore, **kw: Any) -> Any:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "workflow_id": "w1",
        "tenant": "acme",
        "instance_id": "h100-0",
        "tokens_in": 1000,
        "tokens_out": 100,
        "cost_usd": 0.01,
        "ok": True,
        "reason": "",
        "t": 0.0,
        "model": "llama-3-8b",
    }
    fields.update(kw)
    return store.record_attempt(**fields)


def test_five_step_workflow_succeeds_at_its_last_step_with_retry_cost(store: LedgerStore) -> None:
    for step in range(1, 6):
        if step == 3:  # step 3 fails once and is retried: the failed attempt is paid for too
            w = attempt(
                store,
                request_id="r3",
                step=3,
                total_steps=5,
                ok=False,
                reason="timeout",
                t=3.0,
                cost_usd=0.005,
            )
            assert w.outcome is TaskOutcome.OPEN
        w = attempt(store, request_id=f"r{step}", step=step, total_steps=5, t=float(step) + 0.5)
        assert w.outcome is (TaskOutcome.SUCCEEDED if step == 5 else TaskOutcome.OPEN)
    got = store.get_workflow("w1", "acme")
    assert got is not None
    assert got.outcome is TaskOutcome.SUCCEEDED
    assert got.reason == "last_step"
    assert got.settled_t == 5.5
    assert got.attempts == 6
    assert got.failed_attempts == 1
    assert got.cost_usd == pytest.approx(5 * 0.01 + 0.005)
    assert got.failed_attempt_cost_usd == pytest.approx(0.005)
    assert got.tokens_in == 6000
    assert got.max_step == 5
    assert got.model == "llama-3-8b"
    assert store.request_cost("r3", "acme") == pytest.approx(0.015)
    assert store.request_cost("r3", "other") is None
    attempts = store.list_attempts("w1", "acme")
    assert [a.request_id for a in attempts] == ["r1", "r2", "r3", "r3", "r4", "r5"]
    assert [a.ok for a in attempts].count(False) == 1


def test_total_steps_remembered_from_an_earlier_attempt(store: LedgerStore) -> None:
    attempt(store, step=1, total_steps=2, t=1.0)
    w = attempt(store, step=2, t=2.0)  # this attempt does not repeat total_steps
    assert w.outcome is TaskOutcome.SUCCEEDED


def test_terminal_failure_fails_the_workflow_and_later_spend_still_counts(store: LedgerStore) -> None:
    attempt(store, step=1, total_steps=5, t=1.0)
    attempt(store, step=2, total_steps=5, t=2.0)
    w = attempt(store, step=3, total_steps=5, ok=False, terminal=True, reason="backend_unavailable", t=3.0)
    assert w.outcome is TaskOutcome.FAILED
    assert w.reason == "step_failed:backend_unavailable"
    # A late attempt does not revive it, but its cost is still the workflow's.
    w = attempt(store, step=4, total_steps=5, t=4.0)
    assert w.outcome is TaskOutcome.FAILED
    assert w.cost_usd == pytest.approx(0.04)


def test_client_outcome_has_the_last_word(store: LedgerStore) -> None:
    attempt(store, step=1, t=1.0)
    w = store.record_outcome("w1", "acme", "succeeded", 2.0)
    assert (w.outcome, w.reason, w.settled_t) == (TaskOutcome.SUCCEEDED, "client", 2.0)
    w = store.record_outcome("w1", "acme", TaskOutcome.FAILED, 3.0)
    assert w.outcome is TaskOutcome.FAILED
    # An outcome for a workflow with no attempts creates it (all of it served from cache, say).
    w = store.record_outcome("fresh", "acme", "abandoned", 4.0)
    assert w.outcome is TaskOutcome.ABANDONED
    assert w.cost_usd == 0.0


@pytest.mark.parametrize("bad", ["open", "done", ""])
def test_invalid_outcome(store: LedgerStore, bad: str) -> None:
    with pytest.raises(InvalidLedgerRecord):
        store.record_outcome("w1", "acme", bad, 1.0)


@pytest.mark.parametrize(
    "kw", [{"tokens_in": -1}, {"cost_usd": -0.1}, {"cost_usd": float("nan")}, {"step": 0}, {"tenant": ""}]
)
def test_invalid_attempt(store: LedgerStore, kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidLedgerRecord):
        attempt(store, **kw)


def test_sweep_abandons_idle_open_workflows_only(store: LedgerStore) -> None:
    attempt(store, workflow_id="idle", step=1, total_steps=3, t=0.0)
    attempt(store, workflow_id="busy", step=1, total_steps=3, t=0.0)
    attempt(store, workflow_id="busy", step=2, total_steps=3, t=50.0)
    attempt(store, workflow_id="done", step=1, total_steps=1, t=0.0)
    assert store.sweep(59.0) == []
    swept = store.sweep(60.0)
    assert [(w.workflow_id, w.outcome, w.reason) for w in swept] == [
        ("idle", TaskOutcome.ABANDONED, "abandoned")
    ]
    busy = store.get_workflow("busy", "acme")
    done = store.get_workflow("done", "acme")
    assert busy is not None and busy.outcome is TaskOutcome.OPEN
    assert done is not None and done.outcome is TaskOutcome.SUCCEEDED
    assert [w.workflow_id for w in store.sweep(200.0)] == ["busy"]
    assert store.sweep(10_000.0) == []


def test_tenant_isolation(store: LedgerStore) -> None:
    attempt(store, tenant="a", workflow_id="shared-id", cost_usd=1.0, step=1, total_steps=1)
    attempt(store, tenant="b", workflow_id="b-only", cost_usd=2.0)
    assert store.get_workflow("b-only", "a") is None
    assert store.get_workflow("shared-id", "b") is None
    assert store.list_attempts("b-only", "a") == []
    # Same id, other tenant: a separate workflow.
    attempt(store, tenant="b", workflow_id="shared-id", cost_usd=5.0)
    a = store.get_workflow("shared-id", "a")
    b = store.get_workflow("shared-id", "b")
    assert a is not None and b is not None
    assert (a.cost_usd, b.cost_usd) == (1.0, 5.0)
    assert (a.outcome, b.outcome) == (TaskOutcome.SUCCEEDED, TaskOutcome.OPEN)
    assert store.tenant_totals("a").tasks_completed == 1
    assert store.tenant_totals("b").tasks_completed == 0
    assert store.tenant_totals("nobody").tasks_completed == 0


def test_request_without_workflow_is_a_one_step_task(store: LedgerStore) -> None:
    w = attempt(store, workflow_id=None, request_id="solo", step=None)
    assert w.workflow_id == implicit_workflow_id("solo")
    assert w.outcome is TaskOutcome.SUCCEEDED
    failed = attempt(store, workflow_id=None, request_id="solo2", ok=False, terminal=True, reason="x")
    assert failed.outcome is TaskOutcome.FAILED


def test_economics_per_tenant_and_model(store: LedgerStore) -> None:
    # acme: two tasks succeed (1.0 each), one fails (1.0): cost per successful task 1.5.
    attempt(store, workflow_id="s1", step=1, total_steps=1, cost_usd=1.0)
    attempt(store, workflow_id="s2", step=1, total_steps=1, cost_usd=1.0, model="small")
    attempt(store, workflow_id="f1", ok=False, terminal=True, cost_usd=1.0)
    attempt(store, workflow_id="open", cost_usd=7.0)
    attempt(store, tenant="beta", workflow_id="b1", step=1, total_steps=1, cost_usd=0.5)
    acme = store.tenant_totals("acme")
    assert (acme.tasks_completed, acme.tasks_failed, acme.tasks_open) == (2, 1, 1)
    assert acme.cost_per_successful_task == pytest.approx(1.5)
    assert acme.success_per_dollar == pytest.approx(2 / 3)
    assert acme.cost_open_usd == pytest.approx(7.0)
    by_tenant = store.economics(by="tenant")
    assert set(by_tenant) == {"acme", "beta"}
    assert by_tenant["beta"].cost_per_successful_task == pytest.approx(0.5)
    by_model = store.economics(by="model")
    assert by_model["small"].tasks_completed == 1
    assert by_model["llama-3-8b"].tasks_completed == 2
    total = store.economics()[""]
    assert total.tasks_completed == 3
    assert total.cost_usd == pytest.approx(3.5)


def test_sqlite_persists_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.db"
    s = SqliteLedger(path)
    attempt(s, step=1, total_steps=2)
    s.close()
    again = SqliteLedger(path)
    w = again.get_workflow("w1", "acme")
    assert w is not None and w.attempts == 1
    again.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_schema_is_portable_sql() -> None:
    upper = SCHEMA_SQL.upper()
    for sqlite_only in ("AUTOINCREMENT", " REAL", " BLOB", "WITHOUT ROWID", "PRAGMA", "STRICT"):
        assert sqlite_only not in upper
    assert len(schema_statements()) == 7
    assert (
        adapt("SELECT a FROM t WHERE x = ? AND y = ?", "format") == "SELECT a FROM t WHERE x = %s AND y = %s"
    )
    assert adapt("SELECT ?", "qmark") == "SELECT ?"


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_async_wrapper_batches_writes_and_reads_its_writes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    base = open_store(kind, request, tmp_path)

    async def main() -> None:
        ledger = AsyncLedger(base, max_batch=64)
        results = await asyncio.gather(
            *(
                ledger.record_attempt(
                    request_id=f"r{i}",
                    workflow_id=f"w{i % 10}",
                    tenant="acme",
                    instance_id="i0",
                    tokens_in=10,
                    tokens_out=1,
                    cost_usd=0.5,
                    ok=True,
                    reason="",
                    t=float(i),
                )
                for i in range(200)
            )
        )
        assert len(results) == 200
        # 200 concurrent writes share a handful of transactions, not 200.
        assert ledger.batches <= 200 // 64 + 2
        w = await ledger.get_workflow("w3", "acme")
        assert w is not None and w.attempts == 20 and w.cost_usd == pytest.approx(10.0)
        assert await ledger.get_workflow("w3", "other") is None
        done = await ledger.record_outcome("w3", "acme", "succeeded", 500.0)
        assert done.outcome is TaskOutcome.SUCCEEDED
        totals = await ledger.tenant_totals("acme")
        assert totals.tasks_completed == 1
        assert totals.cost_per_successful_task == pytest.approx(10.0)
        assert (await ledger.economics(by="tenant"))["acme"].tasks_completed == 1
        assert await ledger.request_cost("r3", "acme") == pytest.approx(0.5)
        assert len(await ledger.list_attempts("w3", "acme")) == 20
        swept = await ledger.sweep(10_000.0)
        assert len(swept) == 9
        with pytest.raises(InvalidLedgerRecord):  # validated at once, on the loop
            await ledger.record_outcome("w3", "acme", "maybe", 1.0)
        await ledger.aclose()

    asyncio.run(main())


def test_sweep_write_loses_to_an_attempt_that_landed_after_its_read(store: LedgerStore) -> None:
    from tokenplane.ledger import OutcomeRecord

    attempt(store, step=1, total_steps=3, t=0.0)
    attempt(store, step=2, total_steps=3, t=100.0)  # arrived between the sweep's read and write
    stale = OutcomeRecord("w1", "acme", TaskOutcome.ABANDONED, 100.0, "abandoned", if_idle_since=40.0)
    [w] = store.write_batch([stale])
    assert w.outcome is TaskOutcome.OPEN
    assert w.attempts == 2


def test_writes_without_waiting_report_through_their_callback_in_order() -> None:
    """``record_attempt_nowait``: validated at once, committed with the next batch, and its
    callback called once per write with the summary, or with the batch's error."""

    class FailingOnce:
        """A memory ledger whose first batch fails (a wrapper: the compiled build's ledger
        cannot be subclassed by a test's class)."""

        def __init__(self) -> None:
            self.inner = MemoryLedger()
            self.failed = False

        def write_batch(self, writes: Any) -> Any:
            if not self.failed:
                self.failed = True
                raise sqlite3.OperationalError("disk I/O error")
            return self.inner.write_batch(writes)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    async def main() -> None:
        ledger = AsyncLedger(FailingOnce(), max_batch=8)
        seen: list[tuple[str, str | None, str | None]] = []

        def on_written(w: Any, summary: Any, exc: BaseException | None) -> None:
            seen.append(
                (
                    w.request_id,
                    None if summary is None else summary.outcome.value,
                    type(exc).__name__ if exc else None,
                )
            )
            if w.request_id == "r1":
                raise RuntimeError("a broken callback must not stop the rest of its batch")

        fields = dict(workflow_id=None, tenant="acme", instance_id="i0", tokens_in=1, tokens_out=1,
                      cost_usd=0.1, ok=True, reason="ok", t=1.0, model="m")  # fmt: skip
        for i in range(3):
            ledger.record_attempt_nowait(on_written, request_id=f"f{i}", **fields)
        await ledger.flush()
        for i in range(3):
            ledger.record_attempt_nowait(on_written, request_id=f"r{i}", **fields)
        with pytest.raises(InvalidLedgerRecord):
            ledger.record_attempt_nowait(on_written, request_id="bad", **{**fields, "tokens_in": -1})
        await ledger.flush()
        assert seen == [(f"f{i}", None, "OperationalError") for i in range(3)] + [
            (f"r{i}", "succeeded", None) for i in range(3)
        ]
        await ledger.aclose()

    asyncio.run(main())
