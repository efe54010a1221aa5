"""Schemathesis against the live gateway, from the OpenAPI document it serves.

Starts emulated instances (:mod:`tokenplane.emulator`) and the gateway in front of them (the fast
front, as ``tokenplane serve`` runs it) on loopback ports, loads ``GET /openapi.json`` from it, and
sends cases schemathesis generates for every operation, valid ones (half of them naming the
configured model, so that they reach the instances) and invalid ones, over real HTTP. It checks:

* no answer is a 5xx (no input makes the gateway fail);
* every 4xx is an OpenAI error object, ``{"error": {"message", "type", "param", "code"}}``.

Usage::

    python bench/schemathesis_run.py --cases 5000        # the figure for the issue
    python bench/schemathesis_run.py --cases 200 --json  # what the test runs

Prints a JSON summary (cases sent, statuses, failures with the request that caused them); exits 1
when some case failed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import random
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tokenplane.emulator import EmulatorSettings, start_emulator
from tokenplane.gateway import create_app, hash_key, parse_config
from tokenplane.gateway.server import GatewayServer

KEY = "sk-schemathesis"
MODEL = "llama-3-8b"
ERROR_FIELDS = {"message", "type", "param", "code"}


def _config(urls: list[str]) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "limits": {"max_body_bytes": 256 * 1024, "max_tokens": 16},
        "tenants": [{"name": "fuzz", "priority": "interactive", "api_keys": [hash_key(KEY)]}],
        "models": [{"name": MODEL, "router": "round-robin"}],
        "instances": [
            {"id": f"emu-{i}", "url": url, "model": MODEL, "kind": "emulated"} for i, url in enumerate(urls)
        ],
        "scrape": {"interval_s": 0.2},
        "health": {"interval_s": 0.2, "failures_to_down": 1000},
    }


@contextlib.contextmanager
def running_gateway(instances: int = 2) -> Iterator[str]:
    """A gateway over emulated instances, served from a thread of its own; yields its base URL."""
    loop = asyncio.new_event_loop()
    ready: Future[str] = Future()
    stop = asyncio.Event()

    async def serve() -> None:
        runners = []
        try:
            urls = []
            for i in range(instances):
                settings_ = EmulatorSettings(
                    speed=50.0, fixed_step_s=0.001, default_max_tokens=4, instance_id=f"emu-{i}"
                )
                runner, url = await start_emulator(settings_)
                runners.append(runner)
                urls.append(url)
            server = GatewayServer(create_app(parse_config(_config(urls))), "127.0.0.1", 0)
            await server.start()
        except BaseException as exc:
            ready.set_exception(exc)
            raise
        ready.set_result(str(server.make_url("")).rstrip("/"))
        await stop.wait()
        await server.close()
        for runner in runners:
            await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield ready.result(timeout=30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()


def _problem(status: int, body: bytes) -> str | None:
    """What is wrong with an answer, if anything."""
    if status >= 500:
        return f"a {status} answer: {body[:300]!r}"
    if 400 <= status < 500:
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"a {status} answer that is not an OpenAI error: {body[:200]!r}"
        if not isinstance(error, dict) or set(error) != ERROR_FIELDS:
            return f"a {status} error without exactly {sorted(ERROR_FIELDS)}: {body[:200]!r}"
    return None


def run(cases: int, seed_: int = 0) -> dict[str, Any]:
    """Send about ``cases`` generated cases, spread over every operation and both modes."""
    statuses: collections.Counter[int] = collections.Counter()
    failures: list[dict[str, Any]] = []
    skipped: list[str] = []
    sent = 0
    rng = random.Random(seed_)
    started = time.monotonic()
    with running_gateway() as base, requests.Session() as session:
        schema = schemathesis.openapi.from_url(base + "/openapi.json")
        operations = [r.ok() for r in schema.get_all_operations()]
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        per = max(1, math.ceil(cases / (len(operations) * len(modes))))

        def drive_all(op: Any, mode: GenerationMode, examples: int, round_seed: int) -> None:
            @seed(round_seed)
            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(op.as_strategy(generation_mode=mode))
            def drive(case: Any) -> None:
                nonlocal sent
                if mode is GenerationMode.POSITIVE and isinstance(case.body, dict) and rng.random() < 0.5:
                    case.body["model"] = MODEL  # reach the instances, not only the model lookup
                key = KEY if rng.random() < 0.9 else "sk-wrong"
                resp = case.call(
                    base_url=base, session=session, headers={"Authorization": f"Bearer {key}"}, timeout=30
                )
                sent += 1
                statuses[resp.status_code] += 1
                problem = _problem(resp.status_code, resp.content)
                if problem is not None and len(failures) < 20:
                    failures.append(
                        {
                            "operation": op.label,
                            "mode": mode.value,
                            "problem": problem,
                            "case": repr(case)[:600],
                        }
                    )

            try:
                drive()
            except Unsatisfiable:
                skipped.append(f"{op.label} ({mode.value}): nothing to generate")

        for op in operations:
            for mode in modes:
                drive_all(op, mode, per, seed_)
        # Operations without a body have few distinct cases; the rest of the budget goes to those with one.
        with_body = [op for op in operations if op.body]
        round_ = 1
        while sent < cases and with_body:
            left = cases - sent
            each = max(1, math.ceil(left / (len(with_body) * len(modes))))
            for op in with_body:
                for mode in modes:
                    drive_all(op, mode, each, seed_ + round_)
            round_ += 1
    return {
        "cases": sent,
        "operations": len(operations),
        "statuses": dict(sorted(statuses.items())),
        "server_errors": sum(n for s, n in statuses.items() if s >= 500),
        "failures": failures,
        "skipped": skipped,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="only the JSON summary")
    args = parser.parse_args()
    out = run(args.cases, args.seed)
    print(json.dumps(out, indent=None if args.json else 2))
    sys.exit(1 if out["failures"] else 0)


if __name__ == "__main__":
    main()
