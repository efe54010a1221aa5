"""The twin's driver of the core's retry plan, its client mapping, and precise KV-aware routing.

The parity of the driver with the gateway's is ``tests/test_parity.py``; the twin's end-to-end
behaviour (timeouts, losses, continuations, budgets and breakers) is ``test_resilience.py``.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.retry_budget import AttemptKind, PlanResult, RetryPolicy, RetryReason
from tokenplane.core.routing import build_router
from tokenplane.core.views import RequestInfo
from tokenplane.sim.engine import EngineConfig
from tokenplane.sim.faults import ClientSpec, ControlSpec
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.retry_driver import UNBOUNDED_CONTINUATIONS, PlanDriver, RetryPlanner, twin_retry_policy
from tokenplane.sim.workloads.base import RequestSpec

SIM = Path(__file__).resolve().parents[2] / "src" / "tokenplane" / "sim"


@pytest.mark.parametrize(
    ("clients", "policy"),
    [
        (ClientSpec(), RetryPolicy(1, 0.0, 2.0, 30.0, UNBOUNDED_CONTINUATIONS)),
        (ClientSpec(retry="naive", max_attempts=4), RetryPolicy(4, 0.0, 2.0, 30.0, UNBOUNDED_CONTINUATIONS)),
        (
            ClientSpec(retry="backoff", max_attempts=3, backoff_base_s=0.2, backoff_max_s=1.0),
            RetryPolicy(3, 0.2, 2.0, 1.0, UNBOUNDED_CONTINUATIONS),
        ),
    ],
)
def test_client_settings_map_onto_the_core_policy(clients: ClientSpec, policy: RetryPolicy) -> None:
    assert twin_retry_policy(clients) == policy


def test_driver_dispatches_after_the_delay_and_finishes_with_the_plan() -> None:
    loop = EventLoop()
    planner = RetryPlanner.from_specs(
        ClientSpec(retry="backoff", max_attempts=3, backoff_base_s=0.5, backoff_max_s=0.5),
        ControlSpec(),
        seed=1,
    )
    dispatched: list[tuple[float, int, AttemptKind]] = []
    ended: list[PlanResult] = []
    info = RequestInfo("1", "m", prompt_tokens=10, max_output_tokens=5)

    def dispatch(now: float, d: PlanDriver[str]) -> None:
        dispatched.append((now, d.attempt.number, d.attempt.kind))
        loop.schedule(
            now + 1.0, lambda t, _: d.report(AttemptOutcome(AttemptResult.TIMEOUT, "i0", 0, t)), None
        )

    driver: PlanDriver[str] = PlanDriver(
        planner.plan(info, now=0.0), "req", loop=loop, dispatch=lambda t, _: dispatch(t, driver),
        finish=lambda t, item, r: ended.append(r),
    )  # fmt: skip
    driver.start(0.0)
    loop.run()
    assert [n for _, n, _ in dispatched] == [1, 2, 3]
    assert all(k is AttemptKind.RETRY for _, _, k in dispatched[1:])
    gaps = [b - a - 1.0 for (a, _, _), (b, _, _) in itertools.pairwise(dispatched)]
    assert all(0.0 <= g <= 0.5 for g in gaps)  # full jitter under the cap
    assert len(ended) == 1 and ended[0].reason is RetryReason.ATTEMPTS_EXHAUSTED


def test_no_retry_loop_left_in_the_twin_outside_the_driver() -> None:
    # the twin's own retry loop, backoff and budget cost are gone: the core's plan decides
    for path in SIM.rglob("*.py"):
        if path.name == "retry_driver.py":
            continue
        text = path.read_text()
        for needle in ("_retry_or_fail", "_redispatch", "allow_retry", "2 ** (p.attempt"):
            assert needle not in text, (path.name, needle)


# -- precise KV-aware routing from the engines' own prefix caches ------------------------------------


def _prefix_case(fakes: SimpleNamespace, *, precise: bool, caching: bool = True) -> list[str]:
    hashes = tuple(range(100, 104))  # 4 blocks of 16 tokens
    specs = [
        RequestSpec(1, 0.0, 4 * 16 + 1, 5, block_hashes=hashes, hash_block_tokens=16),
        RequestSpec(2, 1.0, 4 * 16 + 1, 5, block_hashes=hashes, hash_block_tokens=16),
    ]
    h = fakes.make_fleet(
        specs,
        engines=2,
        config=EngineConfig(enable_prefix_caching=caching),
        router=build_router({"name": "prefix-affinity"}, random.Random(0)),
        precise_kv=precise,
    )
    h.run()
    return [f"{r.instance_id}:{r.route_reason}" for r in h.fleet.records]


def test_precise_kv_routes_on_what_the_engine_holds(fakes: SimpleNamespace) -> None:
    first, second = _prefix_case(fakes, precise=True)
    assert second == f"{first.split(':')[0]}:kv_cache_match"
    # the approximate index (default) routes the same request there on its own record of routing
    first, second = _prefix_case(fakes, precise=False)
    assert second == f"{first.split(':')[0]}:prefix_match"


def test_precise_kv_sees_that_an_engine_does_not_cache(fakes: SimpleNamespace) -> None:
    # the index believes the prefix is on the first instance; the engines cache nothing
    _, second = _prefix_case(fakes, precise=True, caching=False)
    assert second.endswith(":kv_cache_miss_least_loaded")
    _, second = _prefix_case(fakes, precise=False, caching=False)
    assert second.endswith(":prefix_match")
