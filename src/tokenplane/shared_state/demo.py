"""``tokenplane replicas-demo``: several gateway replicas on the local Redis, for a few seconds.

It starts two emulated instances and ``replicas`` gateways (each its own process state, pipeline
and port, as separate ``tokenplane serve`` processes would have) with ``state: {backend: redis}``
under a fresh key prefix, drives chat completions through all of them round-robin from
``clients`` concurrent callers of one tenant whose ``max_concurrency`` and ``rpm_limit`` are set
low, and reports what each replica answered: the limits hold for the tenant as a whole, not per
replica. The prefix's keys are deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from typing import Any

import aiohttp
import msgspec

from tokenplane.gateway.config import hash_key, parse_config

DEMO_KEY = "sk-demo-replicas"
MODEL = "llama-3-8b"


def demo_config(urls: list[str], redis_url: str, prefix: str, max_concurrency: int, rpm: int) -> Any:
    return parse_config(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "tenants": [
                {
                    "name": "demo",
                    "api_keys": [hash_key(DEMO_KEY)],
                    "max_concurrency": max_concurrency,
                    "rpm_limit": rpm,
                }
            ],
            "models": [{"name": MODEL, "router": "prefix-affinity"}],
            "instances": [
                {"id": f"emu-{i}", "url": url, "model": MODEL, "kind": "emulated"}
                for i, url in enumerate(urls)
            ],
            "state": {"backend": "redis", "url": redis_url, "key_prefix": prefix},
        },
        source="replicas-demo",
    )


async def run_demo(
    *,
    replicas: int = 2,
    seconds: float = 5.0,
    clients: int = 8,
    max_concurrency: int = 4,
    rpm: int = 60,
    redis_url: str = "redis://127.0.0.1:6379/0",
) -> dict[str, Any]:
    """Run the demo; returns per-replica statuses and the limits (see the module docstring)."""
    import redis.asyncio as aioredis

    from tokenplane.emulator import EmulatorSettings, start_emulator
    from tokenplane.gateway import create_app
    from tokenplane.gateway.server import GatewayServer

    prefix = f"tokenplane-demo-{uuid.uuid4().hex[:8]}:"
    emulators = [
        await start_emulator(EmulatorSettings(instance_id=f"emu-{i}", speed=20.0, fixed_step_s=0.02))
        for i in range(2)
    ]
    config = demo_config([url for _, url in emulators], redis_url, prefix, max_concurrency, rpm)
    servers: list[GatewayServer] = []
    http = aiohttp.ClientSession()
    statuses: list[Counter[str]] = [Counter() for _ in range(replicas)]
    try:
        for _ in range(replicas):
            server = GatewayServer(create_app(config), "127.0.0.1", 0)
            await server.start()
            servers.append(server)
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        deadline = time.monotonic() + seconds
        turn = iter(range(1 << 62))

        async def client(c: int) -> None:
            while time.monotonic() < deadline:
                n = next(turn)
                replica = n % replicas
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"caller {c} asks question {n}"}],
                    "max_tokens": 8,
                }
                headers = {"Authorization": f"Bearer {DEMO_KEY}"}
                async with http.post(urls[replica] + "/v1/chat/completions", json=body, headers=headers) as r:
                    data = msgspec.json.decode(await r.read())
                    label = "ok" if r.status == 200 else f"{r.status} {data['error']['code']}"
                statuses[replica][label] += 1
                if r.status != 200:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client(c) for c in range(clients)))
    finally:
        await http.close()
        for server in servers:
            with contextlib.suppress(Exception):
                await server.close()
        for runner, _ in emulators:
            await runner.cleanup()
        client_ = aioredis.Redis.from_url(redis_url)
        keys = [k async for k in client_.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await client_.delete(*keys)
        await client_.aclose()
    return {
        "replicas": [dict(s) for s in statuses],
        "tenant_limits": {"max_concurrency": max_concurrency, "rpm_limit": rpm},
        "ok_total": sum(s["ok"] for s in statuses),
        "seconds": seconds,
    }


def report(result: dict[str, Any]) -> str:
    lines = []
    for i, s in enumerate(result["replicas"]):
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(s.items()))
        lines.append(f"replica {i}: {parts}")
    lim = result["tenant_limits"]
    lines.append(
        f"{result['ok_total']} answered in {result['seconds']:g} s for tenant 'demo' across every "
        f"replica (rpm_limit {lim['rpm_limit']}, max_concurrency {lim['max_concurrency']}: "
        "for the tenant, not per replica)"
    )
    return "\n".join(lines)
