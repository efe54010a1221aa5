"""The ledger on PostgreSQL against SQLite, side by side, through the gateway's asyncio face.

Writes ``--attempts`` attempts without waiting (as the gateway's request path does: 5-step
workflows, so that they settle and move the running totals), through
:class:`~tokenplane.ledger.AsyncLedger` over a fresh PostgreSQL database and over a SQLite file,
and prints for each the writes committed per second and the batches they took. Then the outage:
the PostgreSQL ledger is reached through a TCP proxy (tests/support/tcp_proxy.py), the proxy is cut,
``--queued`` attempts are written meanwhile, the proxy is restored, and the time from restore to
the last queued write committed is measured; the attempt rows are counted (none lost, none twice).

Usage: ``python bench/ledger_postgres.py --json`` (needs PostgreSQL on 127.0.0.1:5432, user
postgres, trust auth: it creates a database ``tp_bench_<random>`` and drops it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from tokenplane.ledger import AsyncLedger, LedgerStore, SqliteLedger
from tokenplane.ledger.postgres import PostgresLedger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from tcp_proxy import TcpProxy

FIELDS: dict[str, Any] = dict(
    tenant="acme",
    instance_id="i0",
    tokens_in=1000,
    tokens_out=100,
    cost_usd=0.001,
    ok=True,
    reason="",
    model="m",
)


async def write(store: LedgerStore, n: int) -> dict[str, float]:
    ledger = AsyncLedger(store)
    t0 = time.perf_counter()
    for i in range(n):
        ledger.record_attempt_nowait(
            lambda w, s, e: None,
            request_id=f"r{i}",
            workflow_id=f"w{i // 5}",
            step=i % 5 + 1,
            total_steps=5,
            t=float(i),
            **FIELDS,
        )
        if i % 64 == 63:
            await asyncio.sleep(0)  # requests arrive over time, not in one loop iteration
    await ledger.flush()
    secs = time.perf_counter() - t0
    out = {"writes_per_s": round(n / secs), "batches": ledger.batches, "seconds": round(secs, 3)}
    await ledger.aclose()
    return out


async def outage(url: str, proxy: TcpProxy, queued: int) -> dict[str, Any]:
    store = PostgresLedger(url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), timeout_s=1.0)
    ledger = AsyncLedger(store)
    proxy.cut()
    for i in range(queued):
        ledger.record_attempt_nowait(
            lambda w, s, e: None, request_id=f"o{i}", workflow_id=None, t=float(i), **FIELDS
        )
    while ledger.retries < 3:
        await asyncio.sleep(0.05)
    buffered = ledger.buffered
    proxy.restore()
    t0 = time.perf_counter()
    await ledger.flush()
    drained = time.perf_counter() - t0
    await ledger.aclose()
    return {"queued": buffered, "drain_after_restore_s": round(drained, 3), "retries": ledger.retries}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attempts", type=int, default=20_000)
    p.add_argument("--queued", type=int, default=5_000)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    name = "tp_bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}".encode())
    url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    proxy = TcpProxy()
    proxy.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out: dict[str, Any] = {
                "sqlite": asyncio.run(write(SqliteLedger(Path(tmp) / "l.db"), args.attempts)),
                "postgres": asyncio.run(write(PostgresLedger(url), args.attempts)),
            }
        out["postgres_outage"] = asyncio.run(outage(url, proxy, args.queued))
        with psycopg.connect(url) as conn:
            row = conn.execute(
                b"SELECT COUNT(*), COUNT(DISTINCT write_id) FROM ledger_attempts WHERE request_id LIKE 'o%'"
            ).fetchone()
        assert row is not None
        out["postgres_outage"]["rows"], out["postgres_outage"]["distinct_keys"] = row
    finally:
        proxy.close()
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())
    print(json.dumps(out, indent=2, sort_keys=True) if args.json else out)


if __name__ == "__main__":
    main()
