"""Both ledger stores under endless traffic: memory held, and the cost of one economics read.

Writes ``--tasks`` one-step tasks (each request without a workflow is its own task) in batches, as
the gateway does, into two :class:`~tokenplane.ledger.MemoryLedger` s side by side: one bounded at
``--max-settled`` (the default) and one that never forgets (``max_settled`` above the task count:
what the ledger did before it was bounded). Prints, for each, the Python heap it holds
(``tracemalloc``), and the time of one ``economics(by="tenant")`` (what every ``/metrics`` scrape
reads) against a full scan of the kept workflows (what that read cost before running sums), and
the pause of one full garbage collection while the bounded ledger is held. Then
the same tasks into a SQLite file: write time per task, and one economics read from its running
totals against the ``GROUP BY`` over every workflow row it used to run.

Usage::

    python bench/ledger_scale.py                 # 300,000 tasks, ~1.5 minutes
    python bench/ledger_scale.py --tasks 50000   # quicker
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

from tokenplane.core.economics import summarize_by
from tokenplane.ledger import MemoryLedger, SqliteLedger
from tokenplane.ledger.store import DEFAULT_MAX_SETTLED, BaseLedger


def fill(store: MemoryLedger | SqliteLedger, tasks: int, batch: int = 32, start: int = 0) -> None:
    writes = []
    for i in range(start, start + tasks):
        writes.append(
            BaseLedger.attempt(
                request_id=f"req-{i}", workflow_id=None, tenant=f"tenant-{i % 8}", instance_id="h100-0",
                tokens_in=1200, tokens_out=64, cost_usd=1e-5, ok=True, reason="ok", t=float(i), model="m",
            )
        )  # fmt: skip
        if len(writes) == batch:
            store.write_batch(writes)
            writes = []
    store.write_batch(writes)


def heap_mb(tasks: int, max_settled: int) -> tuple[float, MemoryLedger]:
    gc.collect()
    tracemalloc.start()
    store = MemoryLedger(max_settled=max_settled)
    fill(store, tasks)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held / 2**20, store


def best_ms(fn: object, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=300_000)
    p.add_argument("--max-settled", type=int, default=DEFAULT_MAX_SETTLED)
    a = p.parse_args()
    gc.collect()
    gc.freeze()  # as the gateway does at start-up: what a full collection scans is then traffic's
    bounded_mb, bounded = heap_mb(a.tasks, a.max_settled)
    full_gc_ms = best_ms(gc.collect, repeat=3)  # the pause of one full collection, ledger held
    tracked = len(gc.get_objects())
    more = max(1, a.tasks // 4)  # into the full bounded ledger: each write now evicts the oldest
    t0 = time.perf_counter()
    fill(bounded, more, start=a.tasks)
    memory_write_us = (time.perf_counter() - t0) / more * 1e6
    unbounded_mb, unbounded = heap_mb(a.tasks, a.tasks + 1)
    sums_ms = best_ms(lambda: bounded.economics(by="tenant"))
    scan_ms = best_ms(
        lambda: summarize_by((w.task_cost() for w in unbounded._workflows.values()), lambda t: t.tenant)
    )
    same = bounded.economics(by="tenant").keys() == unbounded.economics(by="tenant").keys() and all(
        bounded.economics(by="tenant")[k].tasks_completed
        == unbounded.economics(by="tenant")[k].tasks_completed
        for k in bounded.economics(by="tenant")
    )
    print(f"{a.tasks} one-step tasks; bounded at {a.max_settled} settled workflows")
    print(f"heap_mb_bounded = {bounded_mb:.1f}")
    print(f"heap_mb_unbounded = {unbounded_mb:.1f}")
    print(f"heap_ratio_unbounded_over_bounded = {unbounded_mb / bounded_mb:.2f}")
    print(f"economics_read_ms_running_sums = {sums_ms:.3f}")
    print(f"economics_read_ms_full_scan = {scan_ms:.1f}")
    print(f"economics_equal = {same}")
    print(f"full_collection_ms_bounded_ledger_held = {full_gc_ms:.1f}")
    print(f"memory_write_us_per_task_at_the_bound = {memory_write_us:.1f}")
    print(f"gc_tracked_objects_after_freeze = {tracked}")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteLedger(Path(tmp) / "ledger.db")
        t0 = time.perf_counter()
        fill(sqlite, a.tasks)
        write_us = (time.perf_counter() - t0) / a.tasks * 1e6
        totals_ms = best_ms(lambda: sqlite.economics(by="tenant"))
        group_by = (
            "SELECT tenant, outcome, COUNT(*), SUM(cost_usd), SUM(failed_attempt_cost_usd), "
            "SUM(tokens_in + tokens_out), SUM(attempts), SUM(failed_attempts) "
            "FROM ledger_workflows GROUP BY tenant, outcome"
        )
        group_by_ms = best_ms(lambda: sqlite._read(group_by, ()), repeat=3)
        sqlite.close()
    print(f"sqlite_write_us_per_task = {write_us:.1f}")
    print(f"sqlite_economics_read_ms_running_totals = {totals_ms:.3f}")
    print(f"sqlite_economics_read_ms_group_by_scan = {group_by_ms:.1f}")


if __name__ == "__main__":
    main()
