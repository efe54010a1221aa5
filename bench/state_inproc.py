"""What the Redis state backend costs the gateway per request, counted in instructions.

``bench/replicas.py`` measures real processes with real sockets, but its CPU figures come from
``/proc`` on a shared 2-core machine, where they drift by tens of percent between runs and mix two
kinds of cost: what each request costs, and what each process costs per second whatever the load
(timers, syncs, health checks), which a comparison of three replicas with one counts three times.
This script runs ``bench/gateway_inproc.py``'s whole request path in one process (the fast front,
every stage, the hot-path upstream client; only the client and instance sockets are in memory) for
``--replicas`` gateways at once in one event loop, the load spread evenly over them, with either
state backend. With ``--backend redis`` every replica talks to the real Redis at ``--redis-url``
over real sockets (its own key prefix, deleted at the end): the Lua scripts, the pipelined
request-path connection, the ``redis`` client's syncs and pub/sub, and each replica receiving the
others' routing observations. Redis's own CPU is not counted (another process).

``--instructions`` counts the instructions the process executes under callgrind, as the difference
of a short and a long run over the requests between them (start-up cancels out). Timers run on the
wall clock and callgrind slows the process ~50x, so a per-second cost would be counted ~50 times
per request too; the count is therefore made with the background periods stretched
(``--fixed-costs off``: sync, lease renewal, scrape and health intervals of an hour) and the
per-second cost is measured on its own (``--idle``: instructions per second of an idle replica,
the difference of a short and a long idle run). A replica's CPU at ``r`` requests per second is
then ``per_request + idle_per_second / r``. Callgrind does not see the kernel: ``--syscalls``
counts the system calls per request under ``strace`` (each write to Redis's loopback socket costs
the gateway the kernel's whole delivery of it).

Usage::

    python bench/state_inproc.py --backend redis --replicas 3           # CPU us/request, best of 3
    python bench/state_inproc.py --instructions --json                  # memory-1/3, redis-1/3
    python bench/state_inproc.py --idle --backend redis --json          # instructions per idle second
    python bench/state_inproc.py --syscalls --concurrency 30 --json     # system calls per request
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import itertools
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gateway_inproc as inproc  # noqa: E402
import gateway_overhead as load  # noqa: E402

from tokenplane.gateway import create_app, parse_config  # noqa: E402
from tokenplane.gateway.app import GATEWAY_KEY  # noqa: E402
from tokenplane.gateway.server import GatewayServer  # noqa: E402
from tokenplane.runloop import freeze_startup_objects, new_event_loop  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
HOUR = 3600.0
CONFIGS = (("memory", 1), ("memory", 3), ("redis", 1), ("redis", 3))


def _config(ports: list[int], backend: str, url: str, prefix: str, fixed_costs: bool) -> dict[str, Any]:
    cfg = load._gateway_config(ports, 0)
    # the limits bench/replicas.py sets: far above the load, so each backend does its real work
    cfg["tenants"][0].update(rpm_limit=10**9, tpm_limit=10**12)
    cfg["scrape"] = {"interval_s": HOUR}
    cfg["health"] = {"interval_s": HOUR}
    state: dict[str, Any] = {"backend": backend}
    if backend == "redis":
        state |= {"url": url, "key_prefix": prefix}
        if not fixed_costs:
            state |= {"sync_interval_s": HOUR, "lease_ttl_s": 3 * HOUR}
    cfg["state"] = state
    return cfg


async def _drive(cfgs: list[dict[str, Any]], n: int, warmup: int, conc: int, answer: list[bytes]) -> float:
    """CPU ms per request over ``n`` requests through the replicas (clients spread evenly)."""
    servers = []
    for cfg in cfgs:
        app = create_app(parse_config(cfg))
        server = GatewayServer(app, "127.0.0.1", 0)
        await server.start()
        app[GATEWAY_KEY].upstream_client = inproc._in_memory_client(answer)
        servers.append(server)
    await freeze_startup_objects(None)  # type: ignore[arg-type]
    heads, tail = load._bodies(False, 1200)
    req_head = load._request_head(auth=True)
    counter = itertools.count()

    def request() -> bytes:
        return load._request(req_head, heads, tail, next(counter))

    clients = inproc.ChainedClients(n, warmup)
    for i in range(conc):
        clients.open(servers[i % len(servers)], request)
    cpu = await clients.cpu_ms()
    for server in servers:
        await server.close()
    clients.check()
    return cpu


async def _idle(cfgs: list[dict[str, Any]], seconds: float) -> None:
    servers = []
    for cfg in cfgs:
        server = GatewayServer(create_app(parse_config(cfg)), "127.0.0.1", 0)
        await server.start()
        servers.append(server)
    await asyncio.sleep(seconds)
    for server in servers:
        await server.close()


def _delete_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _run_once(a: argparse.Namespace) -> None:
    """One measurement in this process (what the callgrind runs execute)."""
    ports = load._free_ports(4)
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "_fake_upstream.py"), "--ports", ",".join(map(str, ports)),
         "--chunks", "16", "--delay-ms", "0"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    prefix = f"tp-inproc-{uuid.uuid4().hex[:8]}:"
    try:
        assert upstream.stdout is not None
        upstream.stdout.readline()
        cfgs = [
            _config(ports, a.backend, a.redis_url, prefix, a.fixed_costs == "on") for _ in range(a.replicas)
        ]
        answer = inproc._answer(False, 16)
        best = float("inf")
        for _ in range(a.rounds):
            loop = new_event_loop()
            try:
                if a.idle_seconds:
                    loop.run_until_complete(_idle(cfgs, a.idle_seconds))
                    best = 0.0
                else:
                    drive = _drive(cfgs, a.n, a.warmup, a.concurrency, answer)
                    best = min(best, loop.run_until_complete(drive))
            finally:
                loop.close()
            gc.unfreeze()
            gc.collect()
        name = f"{a.backend}-{a.replicas}"
        if a.json:
            print(json.dumps({"config": name, "cpu_ms_per_req": best}))
        elif not a.idle_seconds:
            print(f"{name}: gateway CPU {best * 1e3:.1f} us per request (best of {a.rounds})")
    finally:
        upstream.terminate()
        upstream.wait()
        if a.backend == "redis":
            _delete_prefix(a.redis_url, prefix)


def _count(extra: list[str]) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
           str(Path(__file__).resolve()), "--rounds", "1", *extra]  # fmt: skip
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(" ", 1)[1])
    raise SystemExit(f"callgrind reported no count:\n{proc.stderr[-2000:]}")


def _syscalls(extra: list[str]) -> dict[str, int]:
    """System calls by name of one run under ``strace -f -c``."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".strace") as out:
        cmd = ["strace", "-f", "-c", "-o", out.name, sys.executable, str(Path(__file__).resolve()),
               "--rounds", "1", *extra]  # fmt: skip
        subprocess.run(cmd, capture_output=True, check=True)
        counts: dict[str, int] = {}
        for line in Path(out.name).read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and re.fullmatch(r"[\d.]+", parts[0]) and parts[-1] != "total":
                counts[parts[-1]] = int(parts[3])
    return counts


def _syscalls_per_request(backend: str, replicas: int, a: argparse.Namespace) -> dict[str, float]:
    """System calls per request by name (the kernel's share, which callgrind does not see): the
    difference of a short and a long run over the requests between them."""
    common = ["--backend", backend, "--replicas", str(replicas), "--redis-url", a.redis_url,
              "--warmup", "300", "--concurrency", str(a.concurrency)]  # fmt: skip
    short = _syscalls([*common, "--n", "1000"])
    long = _syscalls([*common, "--n", "3000"])
    per = {k: (long.get(k, 0) - short.get(k, 0)) / 2000 for k in long.keys() | short.keys()}
    out = {k: round(v, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.05}
    return {"total": round(sum(per.values()), 2), **out}


def _per_request(backend: str, replicas: int, a: argparse.Namespace) -> float:
    common = ["--backend", backend, "--replicas", str(replicas), "--redis-url", a.redis_url,
              "--warmup", str(a.warmup), "--concurrency", str(a.concurrency),
              "--fixed-costs", "off"]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        short, long = pool.map(_count, ([*common, "--n", str(a.n)], [*common, "--n", str(4 * a.n)]))
    return float(long - short) / (3 * a.n)


def _per_idle_second(backend: str, replicas: int, a: argparse.Namespace) -> float:
    """Instructions per wall second of idle replicas with their real periods (under callgrind the
    periodic work is the same per second; only its duration stretches)."""
    common = ["--backend", backend, "--replicas", str(replicas), "--redis-url", a.redis_url,
              "--fixed-costs", "on"]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        short, long = pool.map(_count, ([*common, "--idle-seconds", "2"], [*common, "--idle-seconds", "12"]))
    return (long - short) / 10


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("memory", "redis"), default="redis")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--redis-url", default=REDIS_URL)
    p.add_argument("--n", type=int, default=10_000, help="measured requests")
    p.add_argument("--warmup", type=int, default=2_000)
    p.add_argument("--concurrency", type=int, default=30, help="client connections, spread over replicas")
    p.add_argument("--rounds", type=int, default=3, help="best of this many runs")
    p.add_argument("--fixed-costs", choices=("on", "off"), default="on",
                   help="off: the backend's sync and lease-renewal periods stretched to an hour")  # fmt: skip
    p.add_argument("--idle-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    p.add_argument("--instructions", action="store_true",
                   help="instructions per request: memory-1, memory-3, redis-1, redis-3")  # fmt: skip
    p.add_argument("--idle", action="store_true", help="instructions per idle second (one configuration)")
    p.add_argument("--syscalls", action="store_true", help="system calls per request (strace), all four")
    a = p.parse_args()
    if a.syscalls:
        if shutil.which("strace") is None:
            raise SystemExit("--syscalls needs strace (apt install strace)")
        res = {f"{b}-{r}": _syscalls_per_request(b, r, a) for b, r in CONFIGS}
        print(json.dumps(res) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))
        return
    if not (a.instructions or a.idle):
        _run_once(a)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions and --idle need valgrind (apt install valgrind)")
    if a.idle:
        per_s = _per_idle_second(a.backend, a.replicas, a)
        out = {"config": f"{a.backend}-{a.replicas}", "idle_instructions_per_s": round(per_s)}
        print(json.dumps(out) if a.json else f"{out['config']}: {per_s:,.0f} instructions per idle second")
        return
    if a.n == 10_000:
        a.n, a.warmup = 300, 300
    res: dict[str, Any] = {}
    for backend, replicas in CONFIGS:
        res[f"{backend}-{replicas}"] = round(_per_request(backend, replicas, a))
    res["redis3_over_memory1"] = round(res["redis-3"] / res["memory-1"], 3)
    res["redis3_over_memory3"] = round(res["redis-3"] / res["memory-3"], 3)
    res["redis1_over_memory1"] = round(res["redis-1"] / res["memory-1"], 3)
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k}: {v:,}" if isinstance(v, int) else f"{k}: {v}")


if __name__ == "__main__":
    main()
