"""Several gateway replicas: what the Redis state backend costs, side by side in one run.

On one fleet of fake OpenAI instances (``_fake_upstream.py``, 4 ports) it brings up, as separate
``tokenplane serve`` processes:

* ``memory-1``: one replica, ``state: {backend: memory}``;
* ``redis-3``: three replicas, ``state: {backend: redis}`` on the local Redis (a fresh key prefix,
  deleted at the end), the load spread over the three;
* ``workers-1``, ``workers-2``: ``tokenplane serve --workers N`` (one port, N processes) with the
  Redis backend, when this ``tokenplane`` has the option; otherwise each is reported as
  ``{"skipped": "serve --workers not available"}``.

Every configuration enforces the same tenant limits (``max_concurrency``, ``rpm_limit``,
``tpm_limit``, all far above the load), so each backend does its real per-request work. A
closed-loop load generator (``gateway_overhead.py``'s raw-protocol client, in its own process) runs
``--concurrency`` workers of non-streamed chat completions against each configuration in turn,
``--rounds`` times in alternating order, after a run straight at the instances (``direct``).

Per configuration (the median over rounds): ``rps``; ``gateway_cpu_ms_per_req``, the gateway
processes' CPU (``utime + stime`` from ``/proc``, every replica or worker summed; Redis's own CPU
is not counted) per completed request; ``added_p50_ms`` / ``added_p99_ms``, client latency minus
the direct run's at the same percentile; ``errors``. Also ``idle_cpu_ms_per_s``: what the
configuration's processes cost per second with no load at all (timers, syncs, health checks,
scrapes; measured first, every configuration idle at once for ``--idle`` seconds), and
``cpu_ms_per_req_less_idle``: the CPU per request less that idle cost over the measured time, the
per-request cost alone. Three processes have three times one process's fixed costs, and at a
third of the load each a third of the requests to spread them over, so ``redis-3`` against
``memory-1`` mixes that with what Redis costs; ``memory-3`` (three replicas on the memory backend)
is ``redis-3``'s like for like. ``summary`` holds the ratios (each the median of the per-round
ratios, robust to a shared machine's drift): ``redis3_over_memory1_cpu`` (the issue's),
``redis3_over_memory3_cpu``, ``memory3_over_memory1_cpu``, ``workers2_over_workers1_cpu``, and each
again ``..._less_idle``. ``bench/state_inproc.py`` counts the same comparison in instructions.

Usage::

    python bench/replicas.py --json                  # ~1 minute
    python bench/replicas.py --rounds 3 --window 5   # a table
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gateway_overhead as go  # noqa: E402  (the fake fleet's helpers and the raw client)
from _proc_cpu import cpu_s, descendants  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
SKIPPED = {"skipped": "serve --workers not available"}


# ---------------------------------------------------------------------------------------------
# Load generator (its own process)
# ---------------------------------------------------------------------------------------------


async def _run_target(target: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    conc = spec["concurrency"]
    heads, tail = go._bodies(False, spec["prompt_chars"])
    req_head = go._request_head(target["auth"])
    counter = itertools.count()
    loop = asyncio.get_running_loop()
    state = {"measuring": False, "stop": False}
    total: list[float] = []
    errors = [0]
    ports = target["ports"]

    async def worker(i: int) -> None:
        conn: Any = None
        while not state["stop"]:
            if conn is None or conn.lost:
                _, conn = await loop.create_connection(go._Conn, "127.0.0.1", ports[i % len(ports)])
                conn.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = go._request(req_head, heads, tail, next(counter))
            t0 = time.perf_counter()
            try:
                ok, _first, end = await conn.send(data)
            except ConnectionError:
                ok, end = False, 0.0
                conn = None
            if state["measuring"]:
                if ok:
                    total.append(end - t0)
                else:
                    errors[0] += 1
            if not ok and not state["stop"]:
                await asyncio.sleep(0.01)
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    tasks = [asyncio.create_task(worker(i)) for i in range(conc)]
    await asyncio.sleep(spec["warmup_s"])
    pids = [p for top in target["pids"] for p in (top, *(descendants(top) if target.get("tree") else ()))]
    cpu0 = cpu_s(pids)
    t0 = time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(spec["window_s"])
    state["measuring"] = False
    cpu1 = cpu_s(pids)
    wall = time.perf_counter() - t0
    state["stop"] = True
    _, pending = await asyncio.wait(tasks, timeout=2.0)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    n = len(total)
    return {
        "requests": n,
        "errors": errors[0],
        "rps": n / wall,
        "cpu_ms_per_req": (cpu1 - cpu0) * 1000 / n if n else float("nan"),
        "cpu_ms": (cpu1 - cpu0) * 1000,
        "wall_s": wall,
        "p50_ms": go._pct(total, 0.5) * 1000,
        "p99_ms": go._pct(total, 0.99) * 1000,
        "processes": len(pids),
    }


async def _idle(spec: dict[str, Any]) -> dict[str, float]:
    """Each configuration's CPU ms per second with no load at all (its timers, syncs, health
    checks and scrapes: what its processes cost whatever the traffic), every configuration idle at
    once for ``idle_s``."""
    groups = {t["config"]: t for t in spec["targets"] if "config" in t}
    pids = {
        name: [p for top in t["pids"] for p in (top, *(descendants(top) if t.get("tree") else ()))]
        for name, t in groups.items()
    }
    before = {name: cpu_s(ps) for name, ps in pids.items()}
    t0 = time.perf_counter()
    await asyncio.sleep(spec["idle_s"])
    wall = time.perf_counter() - t0
    return {name: (cpu_s(ps) - before[name]) * 1000 / wall for name, ps in pids.items()}


async def _loadgen(spec: dict[str, Any]) -> None:
    out: dict[str, Any] = {"idle": await _idle(spec)} if spec["idle_s"] > 0 else {}
    for target in spec["targets"]:
        out[target["name"]] = await _run_target(target, spec)
        await asyncio.sleep(0.3)
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------


def _config(up_ports: list[int], port: int, state: dict[str, Any]) -> dict[str, Any]:
    config = go._gateway_config(up_ports, port)
    config["tenants"][0].update(rpm_limit=10**9, tpm_limit=10**12)
    config["state"] = state
    return config


def _has_workers(serve: list[str]) -> bool:
    out = subprocess.run([*serve, "serve", "--help"], capture_output=True, text=True, check=False)
    return "--workers" in out.stdout


class Fleet:
    def __init__(
        self, tmp: Path, prefix: str, cpus: tuple[int | None, int | None], diagnose: bool = False
    ) -> None:
        import yaml

        lg_cpu, gw_cpu = cpus
        py = sys.executable
        quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.up_ports = go._free_ports(go.N_UPSTREAMS)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.upstream = go._spawn(
            [py, str(HERE / "_fake_upstream.py"), "--ports", ",".join(map(str, self.up_ports)),
             "--chunks", "16", "--delay-ms", "0"],
            lg_cpu, **quiet,
        )  # fmt: skip
        self.procs.append(self.upstream)
        cli = Path(py).parent / "tokenplane"
        serve = [str(cli)] if cli.exists() else [py, "-c", "from tokenplane.cli import main; main()"]
        redis_state = {"backend": "redis", "url": REDIS_URL, "key_prefix": prefix}
        self.configs: dict[str, dict[str, Any]] = {}

        def start(name: str, n: int, state: dict[str, Any], workers: int | None = None) -> None:
            ports = go._free_ports(1 if workers else n)
            procs = []
            for port in ports:
                cfg = tmp / f"{name}-{port}.yaml"
                cfg.write_text(yaml.safe_dump(_config(self.up_ports, port, state)))
                extra = ["--workers", str(workers)] if workers else []
                procs.append(go._spawn([*serve, "serve", str(cfg), *extra], gw_cpu, **quiet))
            self.procs += procs
            self.configs[name] = {"ports": ports, "procs": procs, "tree": bool(workers)}

        try:
            start("memory-1", 1, {"backend": "memory"})
            start("redis-3", 3, redis_state)
            start("memory-3", 3, {"backend": "memory"})  # redis-3's like for like
            if diagnose:  # what Redis costs in one process
                start("redis-1", 1, redis_state)
            if _has_workers(serve):
                start("workers-1", 1, redis_state, workers=1)
                start("workers-2", 1, redis_state, workers=2)
            go._wait_http(f"http://127.0.0.1:{self.up_ports[0]}/health", self.upstream)
            for c in self.configs.values():
                for port, proc in zip(c["ports"], c["procs"], strict=True):
                    go._wait_http(f"http://127.0.0.1:{port}/health", proc)
        except BaseException:
            self.close()
            raise

    def target(self, name: str, round_: int) -> dict[str, Any]:
        c = self.configs[name]
        pids = [p.pid for p in c["procs"]]
        return {
            "name": f"{name}#{round_}",
            "config": name,
            "ports": c["ports"],
            "pids": pids,
            "auth": True,
            "tree": c["tree"],
        }

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _delete_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"tp-bench-{uuid.uuid4().hex[:8]}:"
    cpus = go._cpus()
    with tempfile.TemporaryDirectory() as tmpdir:
        fleet = Fleet(Path(tmpdir), prefix, cpus, args.diagnose)
        try:
            names = list(fleet.configs)
            targets = [
                {"name": "direct", "ports": fleet.up_ports, "pids": [fleet.upstream.pid], "auth": False}
            ]
            for r in range(args.rounds):
                order = names if r % 2 == 0 else names[::-1]
                targets += [fleet.target(n, r) for n in order]
            spec = {
                "targets": targets,
                "concurrency": args.concurrency,
                "warmup_s": args.warmup,
                "window_s": args.window,
                "prompt_chars": args.prompt_chars,
                "idle_s": args.idle,
            }
            p = go._spawn(
                [sys.executable, str(Path(__file__).resolve()), "--_loadgen", json.dumps(spec)],
                cpus[0],
                stdout=subprocess.PIPE,
            )
            out, _ = p.communicate()
            if p.returncode != 0:
                raise RuntimeError("the load generator failed")
            raw = json.loads(out)
        finally:
            fleet.close()
            _delete_prefix(prefix)
    direct = raw["direct"]
    result: dict[str, Any] = {}
    idle = raw.get("idle", {})

    def less_idle(x: dict[str, Any], name: str) -> float:
        """CPU per request less what the configuration's processes cost idle over the same time."""
        if not x["requests"] or name not in idle:
            return float("nan")
        return (x["cpu_ms"] - idle[name] * x["wall_s"]) / x["requests"]

    extra = ("redis-1",) if args.diagnose else ()
    for name in ("memory-1", "redis-3", "memory-3", "workers-1", "workers-2", *extra):
        rounds = [raw[f"{name}#{r}"] for r in range(args.rounds) if f"{name}#{r}" in raw]
        if not rounds:
            result[name] = dict(SKIPPED)
            continue
        result[name] = {
            "rps": round(_median([x["rps"] for x in rounds]), 1),
            "gateway_cpu_ms_per_req": round(_median([x["cpu_ms_per_req"] for x in rounds]), 4),
            "idle_cpu_ms_per_s": round(idle.get(name, float("nan")), 3),
            "cpu_ms_per_req_less_idle": round(_median([less_idle(x, name) for x in rounds]), 4),
            "added_p50_ms": round(_median([x["p50_ms"] for x in rounds]) - direct["p50_ms"], 3),
            "added_p99_ms": round(_median([x["p99_ms"] for x in rounds]) - direct["p99_ms"], 3),
            "errors": sum(x["errors"] for x in rounds),
            "processes": rounds[0]["processes"],
        }

    def ratio(a: str, b: str, net: bool = False) -> float | None:
        def per_req(name: str, r: int) -> float:
            x = raw[f"{name}#{r}"]
            return less_idle(x, name) if net else float(x["cpu_ms_per_req"])

        per_round = [
            per_req(a, r) / per_req(b, r)
            for r in range(args.rounds)
            if f"{a}#{r}" in raw and f"{b}#{r}" in raw
        ]
        return round(_median(per_round), 3) if per_round else None

    pairs = [
        ("redis-3", "memory-1"),
        ("redis-3", "memory-3"),
        ("memory-3", "memory-1"),
        ("workers-2", "workers-1"),
    ]
    if args.diagnose:
        pairs.append(("redis-1", "memory-1"))
    key = {name: name.replace("-", "") for pair in pairs for name in pair}
    result["summary"] = {
        **{f"{key[a]}_over_{key[b]}_cpu": ratio(a, b) for a, b in pairs},
        **{f"{key[a]}_over_{key[b]}_cpu_less_idle": ratio(a, b, net=True) for a, b in pairs},
        "direct_rps": round(direct["rps"], 1),
        "settings": {
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "window_s": args.window,
            "warmup_s": args.warmup,
            "idle_s": args.idle,
            "pinned": cpus != (None, None),
        },
    }
    return result


def _table(res: dict[str, Any]) -> str:
    head = f"{'config':<10} {'rps':>8} {'cpu ms/req':>11} {'less idle':>10} {'idle ms/s':>10}"
    lines = [head + f" {'+p50 ms':>8} {'+p99 ms':>8} {'errors':>7}"]
    for name, r in res.items():
        if name == "summary":
            continue
        if "skipped" in r:
            lines.append(f"{name:<10} skipped: {r['skipped']}")
            continue
        lines.append(
            f"{name:<10} {r['rps']:>8.1f} {r['gateway_cpu_ms_per_req']:>11.4f} "
            f"{r['cpu_ms_per_req_less_idle']:>10.4f} {r['idle_cpu_ms_per_s']:>10.2f} "
            f"{r['added_p50_ms']:>8.3f} {r['added_p99_ms']:>8.3f} {r['errors']:>7}"
        )
    for key, value in res["summary"].items():
        if key.endswith(("_cpu", "_cpu_less_idle")) and value is not None:
            lines.append(f"{key}: {value} (median of per-round ratios)")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--_loadgen":
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        asyncio.run(_loadgen(json.loads(sys.argv[2])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object keyed by configuration")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=4.0, help="measurement seconds per configuration")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--prompt-chars", type=int, default=2000)
    ap.add_argument(
        "--idle", type=float, default=5.0, help="seconds every configuration is measured idle first (0: not)"
    )
    ap.add_argument(
        "--diagnose",
        action="store_true",
        help="also redis-1 (one replica on Redis)",
    )
    args = ap.parse_args()
    res = run(args)
    print(json.dumps(res) if args.json else _table(res))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
