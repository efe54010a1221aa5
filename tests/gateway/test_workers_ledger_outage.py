"""The gateway while its PostgreSQL ledger is unreachable: completions keep flowing, their attempts
wait in the bounded queue (gauged in ``/metrics``), the workflow endpoints answer 503, and once the
database is back every attempt is written exactly once. The database "goes away" behind a TCP
proxy the test cuts (tests/support/tcp_proxy.py); the shared server itself is never stopped."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from pg_support import database_url, fresh_database
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "plan the next step of the task"}]


@pytest.fixture
def pg_behind_proxy() -> Iterator[tuple[str, TcpProxy]]:
    with fresh_database() as name:
        proxy = TcpProxy("127.0.0.1", 5432)
        proxy.start()
        try:
            yield database_url(name), proxy
        finally:
            proxy.close()


async def ledger_metrics(gw) -> dict[str, float]:
    text = await gw.get("/metrics")
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("tokenplane_ledger_")
    }


async def test_attempts_wait_for_the_database_and_land_once(
    upstreams, gateway, names, pg_behind_proxy, wait, caplog
) -> None:
    url, proxy = pg_behind_proxy
    ups = await upstreams(1)
    ledger = {"url": database_url_via(url, proxy.port), "timeout_s": 1.0, "sweep_interval_s": 0.2}
    gw = await gateway(ups, ledger=ledger)
    client = gw.client()
    await client.chat.completions.create(
        model=names.MODEL, messages=MESSAGES, max_tokens=8, extra_headers={"x-tokenplane-workflow-id": "wf"}
    )
    await wait(lambda: _metric_is(gw, "tokenplane_ledger_buffered_writes", 0))
    proxy.cut()
    n = 12
    for _ in range(n):  # the completions themselves do not need the ledger
        r = await client.chat.completions.create(
            model=names.MODEL,
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"x-tokenplane-workflow-id": "wf"},
        )
        assert r.choices[0].message.content
    await wait(lambda: _metric_is(gw, "tokenplane_ledger_available", 0), timeout_s=15)
    m = await ledger_metrics(gw)
    assert m["tokenplane_ledger_buffered_writes"] == n and m["tokenplane_ledger_dropped_writes_total"] == 0
    status, body, _ = await gw.post("/v1/workflows/wf/outcome", {"outcome": "succeeded"})
    assert status == 503 and body["error"]["code"] == "ledger_unavailable"

    # the abandoned-workflow sweep meets the outage too: a one-line warning, not an error's traceback
    async def swept() -> bool:
        return any("ledger sweep skipped" in r.getMessage() for r in caplog.records)

    await wait(swept, timeout_s=10)
    assert not [r for r in caplog.records if r.name == "tokenplane.gateway.workflows" and r.levelno >= 40]
    proxy.restore()
    await wait(lambda: _metric_is(gw, "tokenplane_ledger_buffered_writes", 0), timeout_s=15)
    m = await ledger_metrics(gw)
    assert m["tokenplane_ledger_available"] == 1 and m["tokenplane_ledger_write_retries_total"] >= 1
    w = await gw.get("/v1/workflows/wf")
    assert w["attempts"] == n + 1 and len(w["attempt_log"]) == n + 1
    with psycopg.connect(url) as conn:
        rows = conn.execute(b"SELECT COUNT(*), COUNT(DISTINCT write_id) FROM ledger_attempts").fetchone()
    assert rows == (n + 1, n + 1)


def database_url_via(url: str, port: int) -> str:
    return url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")


async def _metric_is(gw, name: str, value: float) -> bool:
    return (await ledger_metrics(gw)).get(name) == value
