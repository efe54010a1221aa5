"""Running economics in both stores agree with a full scan; the in-memory ledger stays bounded."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.economics import EconomicsSummary, TaskOutcome, summarize, summarize_by
from tokenplane.ledger import InvalidLedgerRecord, LedgerStore, MemoryLedger, SqliteLedger
from tokenplane.ledger.sqlite import _WF_SELECT

TENANTS = ("acme", "beta")
MODELS = ("big", "small")

attempts = st.fixed_dictionaries(
    {
        "kind": st.just("attempt"),
        "workflow_id": st.one_of(st.none(), st.sampled_from(["w1", "w2", "w3", "w4"])),
        "tenant": st.sampled_from(TENANTS),
        "model": st.sampled_from(MODELS),
        "ok": st.booleans(),
        "terminal": st.booleans(),
        "step": st.integers(1, 3),
        "cost_usd": st.floats(0.0, 2.0, allow_nan=False),
        "tokens_out": st.integers(0, 500),
    }
)
outcomes = st.fixed_dictionaries(
    {
        "kind": st.just("outcome"),
        "workflow_id": st.sampled_from(["w1", "w2", "w3", "w4"]),
        "tenant": st.sampled_from(TENANTS),
        "outcome": st.sampled_from(["succeeded", "failed", "abandoned"]),
    }
)
ATTEMPT: dict[str, Any] = {
    "kind": "attempt", "workflow_id": "w1", "tenant": "acme", "model": "big", "ok": True,
    "terminal": False, "step": 1, "cost_usd": 0.25, "tokens_out": 10,
}  # fmt: skip
sweeps = st.fixed_dictionaries({"kind": st.just("sweep"), "advance_s": st.floats(0.0, 200.0)})
ops = st.lists(st.one_of(attempts, outcomes, sweeps), max_size=60)


def apply(store: LedgerStore, op_list: list[dict[str, Any]], skip: set[int] | None = None) -> set[int]:
    """Run ``op_list``; a client outcome for a workflow ``store`` does not know is skipped (the
    gateway answers 404 for it). Returns the skipped ops; ``skip`` skips those instead."""
    t = 0.0
    skipped: set[int] = set()
    for i, op in enumerate(op_list):
        t += 1.0
        if op["kind"] == "attempt":
            store.record_attempt(
                request_id=f"r{i}",
                workflow_id=op["workflow_id"],
                tenant=op["tenant"],
                instance_id="i0",
                tokens_in=100,
                tokens_out=op["tokens_out"],
                cost_usd=op["cost_usd"],
                ok=op["ok"],
                reason="" if op["ok"] else "upstream_error",
                t=t,
                model=op["model"],
                step=op["step"] if op["workflow_id"] else None,
                total_steps=3 if op["workflow_id"] else None,
                terminal=op["terminal"] and not op["ok"],
            )
        elif op["kind"] == "outcome":
            known = store.get_workflow(op["workflow_id"], op["tenant"]) is not None
            if (i not in skip) if skip is not None else known:
                store.record_outcome(op["workflow_id"], op["tenant"], op["outcome"], t)
            else:
                skipped.add(i)
        else:
            t += op["advance_s"]
            store.sweep(t)
    return skipped


def same(a: EconomicsSummary, b: EconomicsSummary) -> None:
    for field in a.__struct_fields__:
        x, y = getattr(a, field), getattr(b, field)
        if isinstance(x, float) or isinstance(y, float):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-9), field
        else:
            assert x == y, field


@settings(max_examples=150, deadline=None)
@given(op_list=ops)
def test_running_economics_of_both_stores_match_a_full_scan(op_list) -> None:
    memory = MemoryLedger(abandon_after_s=60.0)
    sqlite = SqliteLedger(":memory:", abandon_after_s=60.0)
    apply(sqlite, op_list, skip=apply(memory, op_list))
    tasks = [SqliteLedger._row(r).task_cost() for r in sqlite._read(_WF_SELECT, ())]
    scans: dict[Any, dict[str, EconomicsSummary]] = {
        None: {"": summarize(tasks)},
        "tenant": summarize_by(tasks, lambda t: t.tenant),
        "model": summarize_by(tasks, lambda t: t.model),
    }
    for store in (memory, sqlite):
        for by, scan in scans.items():
            running = store.economics(by=by)
            assert set(running) == set(scan) or (by is None and not tasks)
            for k in scan:
                same(running[k], scan[k])
        for tenant in TENANTS:
            same(store.tenant_totals(tenant), summarize(t for t in tasks if t.tenant == tenant))
    sqlite.close()


def test_a_version_1_file_backfills_its_totals_once(tmp_path) -> None:
    path = tmp_path / "ledger.db"
    store = SqliteLedger(path)
    apply(store, [dict(ATTEMPT, workflow_id=w) for w in ["a", "a", "b", None, None, "c"]])
    before = store.economics(by="tenant")
    store._db.execute("DROP TABLE ledger_totals")  # as a file from before the running totals
    store._db.execute("UPDATE ledger_meta SET value = '1' WHERE name = 'schema_version'")
    store.close()
    reopened = SqliteLedger(path)
    after = reopened.economics(by="tenant")
    assert set(after) == set(before) and after
    for k in before:
        same(after[k], before[k])
    reopened.close()
    again = SqliteLedger(path)  # version 2 now: no second backfill doubling the sums
    same(again.economics()[""], reopened_total(before))
    again.close()


def reopened_total(by_tenant: dict[str, EconomicsSummary]) -> EconomicsSummary:
    assert len(by_tenant) == 1
    return next(iter(by_tenant.values()))


@settings(max_examples=150, deadline=None)
@given(op_list=ops, max_settled=st.integers(0, 5))
def test_memory_is_bounded_and_forgetting_loses_no_task_from_the_totals(op_list, max_settled) -> None:
    bounded = MemoryLedger(abandon_after_s=60.0, max_settled=max_settled)
    apply(bounded, op_list)
    kept = list(bounded._workflows.values())
    assert sum(w.outcome is not TaskOutcome.OPEN for w in kept) <= max_settled
    assert len(bounded._attempts) <= len(kept)
    # Every task ever started is counted once (a write to a forgotten workflow starts a new one).
    total = bounded.economics()[""]
    started = sum(1 for op in op_list if op["kind"] == "attempt")
    assert total.tasks_settled + total.tasks_open <= started
    assert total.tasks_open == sum(w.outcome is TaskOutcome.OPEN for w in kept)


def test_settled_workflows_beyond_the_bound_are_forgotten_oldest_first() -> None:
    store = MemoryLedger(max_settled=3)
    for i in range(10):  # ten one-step tasks, each settled by its own attempt
        store.record_attempt(
            request_id=f"r{i}", workflow_id=None, tenant="acme", instance_id="i0", tokens_in=10,
            tokens_out=10, cost_usd=1.0, ok=True, reason="", t=float(i), model="m",
        )  # fmt: skip
    open_ = store.record_attempt(
        request_id="long", workflow_id="agent", tenant="acme", instance_id="i0", tokens_in=10,
        tokens_out=10, cost_usd=5.0, ok=True, reason="", t=20.0, model="m", step=1, total_steps=5,
    )  # fmt: skip
    assert open_.outcome.value == "open"
    assert store.request_cost("r0", "acme") is None and store.request_cost("r9", "acme") == 1.0
    assert [store.request_cost(f"r{i}", "acme") is not None for i in range(10)] == [False] * 7 + [True] * 3
    assert store.get_workflow("agent", "acme") is not None  # open workflows are never forgotten
    total = store.economics()[""]
    assert (total.tasks_completed, total.tasks_open) == (10, 1)  # the forgotten still count
    assert total.cost_usd == 10.0 and total.cost_open_usd == 5.0


def test_max_settled_must_not_be_negative() -> None:
    with pytest.raises(InvalidLedgerRecord):
        MemoryLedger(max_settled=-1)


def test_what_the_memory_ledger_keeps_is_not_scanned_by_the_cyclic_collector() -> None:
    """A full ledger holds ~100k workflows with their attempts; were they tracked, every full
    collection on the gateway's loop would scan them all (bench/ledger_scale.py: ~70 ms)."""
    import gc

    store = MemoryLedger()
    for i in range(3):
        store.record_attempt(
            request_id=f"r{i}", workflow_id="w1", tenant="acme", instance_id="i0", tokens_in=10,
            tokens_out=5, cost_usd=0.1, ok=True, reason="ok", t=float(i), step=i + 1, total_steps=3,
        )  # fmt: skip
    gc.collect()  # a tuple of untracked items is untracked at its first collection
    workflow = store.get_workflow("w1", "acme")
    kept = store._attempts[("acme", "w1")]
    assert workflow is not None and workflow.outcome is TaskOutcome.SUCCEEDED
    assert len(kept) == 3 and [a.request_id for a in store.list_attempts("w1", "acme")] == ["r0", "r1", "r2"]
    assert not gc.is_tracked(workflow)
    assert not any(gc.is_tracked(a) for a in kept)
    assert not gc.is_tracked(kept)
