"""``tokenplane replicas-demo`` (the README's command) on the local Redis, for a second and a half."""

from __future__ import annotations

import pytest

from tokenplane.shared_state.demo import report, run_demo

pytestmark = pytest.mark.anyio


async def test_the_demo_shows_one_tenant_limit_across_replicas(key_prefix: str) -> None:
    result = await run_demo(replicas=2, seconds=1.5, clients=6, rpm=15, max_concurrency=3)
    per_replica = result["replicas"]
    assert all(r.get("ok", 0) > 0 for r in per_replica)  # both replicas served
    assert result["ok_total"] == 15  # the tenant's rpm_limit, not 2 x 15
    assert sum(r.get("429 rate_limit_exceeded", 0) for r in per_replica) > 0
    assert "replica 1:" in report(result)
