"""The gateway's own work per request, stage by stage, in-process (no sockets, no event loop).

``bench/gateway_overhead.py`` measures a whole gateway process under load, side by side with a
bare aiohttp proxy; its absolute figures drift by ~30 % between runs on a shared 2-core machine,
which hides a change of a few microseconds. This script times the pure stages of one non-stream
chat request on the same configuration as that benchmark (prefix-affinity routing over 4
instances, one tenant, admission, breakers, retry plan, ledger in memory, metrics): each stage in a
tight loop, best of several rounds, in microseconds per call. Side by side in one run, so the
shares are comparable even where the absolute numbers are not.

Usage::

    python bench/gateway_stages.py            # ~20 s
    python bench/gateway_stages.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

import msgspec

from tokenplane.core.admission import PriorityClass
from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.prompt_hash import block_hashes
from tokenplane.gateway import create_app, hash_key, parse_config
from tokenplane.gateway.app import GATEWAY_KEY, PIPELINE_KEY, Gateway
from tokenplane.gateway.request import parse_request
from tokenplane.gateway.stages.forward import Forward
from tokenplane.gateway.stages.limits import TenantLimits
from tokenplane.ledger import MemoryLedger
from tokenplane.ledger.store import BaseLedger

API_KEY = "sk-bench-0123456789"
SYSTEM = "You are a careful assistant that plans the next step of a long agentic task. " * 16


def _config() -> dict[str, Any]:
    return {
        "tenants": [
            {
                "name": "bench",
                "priority": "interactive",
                "api_keys": [hash_key(API_KEY)],
                "max_concurrency": 4096,
            }
        ],
        "models": [{"name": "bench-model", "router": {"name": "prefix-affinity"}}],
        "instances": [
            {
                "id": f"up-{i}",
                "url": f"http://127.0.0.1:{9000 + i}",
                "model": "bench-model",
                "kind": "vllm",
                "gpu": "H100",
                "price_per_hour": 2.5,
            }
            for i in range(4)
        ],
    }


def _body(i: int) -> bytes:
    messages = [
        {"role": "system", "content": SYSTEM + str(i % 16)},  # 16 shared prefixes, as the load bench
        {"role": "user", "content": f"request {i}: what next?"},
    ]
    return msgspec.json.encode({"model": "bench-model", "messages": messages, "max_tokens": 64})


def _time(fn: Callable[[int], object], n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def measure(n: int = 5000, rounds: int = 5) -> dict[str, float]:
    app = create_app(parse_config(_config()), rng=random.Random(7))
    gw: Gateway = app[GATEWAY_KEY]
    stages = app[PIPELINE_KEY].stages
    describer = next(s for s in stages if isinstance(s, TenantLimits)).describer
    forward = next(s for s in stages if isinstance(s, Forward))
    bodies = [_body(i) for i in range(n)]
    tenant = gw.auth.authenticate(f"Bearer {API_KEY}")
    parsed = [parse_request(b, "chat", gw.limits) for b in bodies]
    model = gw.catalog.resolve(parsed[0].model, tenant)
    now = time.monotonic()
    infos = [describer.describe(p, model, tenant, now) for p in parsed]
    pool = gw.admission[model.name]
    board = gw.resilience.board
    ledger = MemoryLedger()
    out: dict[str, float] = {}

    out["authenticate"] = _time(lambda i: gw.auth.authenticate(f"Bearer {API_KEY}"), n, rounds)
    out["parse_request"] = _time(lambda i: parse_request(bodies[i], "chat", gw.limits), n, rounds)
    out["hash_prompt"] = _time(lambda i: block_hashes(parsed[i].prompt_text), n, rounds)
    out["describe (incl. hashing)"] = _time(
        lambda i: describer.describe(parsed[i], model, tenant, now), n, rounds
    )
    out["pool capacity"] = _time(lambda i: pool.capacity(), n, rounds)

    def admit_release(i: int) -> None:
        adm = pool.queue.offer(infos[i], now=now, capacity=64, priority=PriorityClass.INTERACTIVE)
        assert adm.admitted
        pool.queue.on_finish(infos[i], now=now)

    out["admission offer + finish"] = _time(admit_release, n, rounds)

    def route(i: int) -> None:
        upstream, _ = forward.route(infos[i], model, now)
        model.router.on_routed(infos[i], upstream.id, now=now)
        upstream.begin(100)
        upstream.end(100)
        model.router.on_finished(infos[i], upstream.id, now=now)

    out["route + router/instance accounting"] = _time(route, n, rounds)
    out["retry plan (first attempt)"] = _time(
        lambda i: next(gw.resilience.plan(infos[i], now=now, deadline_s=now + 30, allow_continuation=False)),
        n,
        rounds,
    )

    def breaker(i: int) -> None:
        iid = f"up-{i % 4}"
        board.on_attempt(iid, now=now + i * 1e-4)
        gw.resilience.on_outcome(AttemptOutcome(AttemptResult.OK, iid, 0, now + i * 1e-4, 0.002))

    out["breaker attempt + outcome"] = _time(breaker, n, rounds)

    def ledger_write(i: int) -> None:
        ledger.write_batch(
            [
                BaseLedger.attempt(
                    request_id=f"r{i}-{time.perf_counter_ns()}", workflow_id=None, tenant="bench",
                    instance_id="up-0", tokens_in=300, tokens_out=64, cost_usd=1e-5, ok=True,
                    reason="ok", t=now, model="bench-model",
                )
            ]
        )  # fmt: skip

    out["ledger record (memory)"] = _time(ledger_write, n, rounds)

    def metrics(i: int) -> None:
        gw.metrics.request_done(model.name, "bench", "ok", "prefix_match", 0.002, False)
        gw.path_metrics.request(model.name, "bench", 0.002)
        gw.path_metrics.attempt(model.name, "up-0", 0.002, 64, None)

    out["metrics (request + path)"] = _time(metrics, n, rounds)
    out["sum of stages"] = sum(v for k, v in out.items() if k != "hash_prompt")  # in describe
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--n", type=int, default=5000, help="calls per round")
    a = p.parse_args()
    res = measure(a.n)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    total = res["sum of stages"]
    for k, v in res.items():
        share = "" if k == "sum of stages" else f"{100 * v / total:5.1f} %"
        print(f"{k:<38} {v:8.2f} us  {share}")


if __name__ == "__main__":
    main()
