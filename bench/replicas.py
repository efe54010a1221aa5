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
the direct run's at the same percentile; ``errors``. ``summary.redis3_over_memory1_cpu`` is the
median of the per-round ratios (robust to a shared machine's drift), and so is
``summary.workers2_over_workers1_cpu`` when both ran.

Usage::

    python bench/replicas.py --json                  # ~1 minute
    python bench/replicas.py --rounds 3 --window 5   # a table
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

REDIS_URL = "redis://127.0.0.1:6379/0"
SKIPPED = {"skipped": "serve --workers not available"}


# ---------------------------------------------------------------------------------------------
# Load generator (its own process)
# ---------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (a ``--workers`` master's worker processes)."""
    out: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            kids = []
        out += kids
        frontier += kids
    return out


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += go.proc_cpu_s(pid)
    return total


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
    pids = [p for top in target["pids"] for p in (top, *(_children(top) if target.get("tree") else ()))]
    cpu0 = _cpu(pids)
    t0 = time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(spec["window_s"])
    state["measuring"] = False
    cpu1 = _cpu(pids)
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
        "p50_ms": go._pct(total, 0.5) * 1000,
        "p99_ms": go._pct(total, 0.99) * 1000,
        "processes": len(pids),
    }


async def _loadgen(spec: dict[str, Any]) -> None:
    out = {}
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
            if diagnose:  # what three processes cost, and what Redis costs in one
                start("memory-3", 3, {"backend": "memory"})
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
    extra = ("memory-3", "redis-1") if args.diagnose else ()
    for name in ("memory-1", "redis-3", "workers-1", "workers-2", *extra):
        rounds = [raw[f"{name}#{r}"] for r in range(args.rounds) if f"{name}#{r}" in raw]
        if not rounds:
            result[name] = dict(SKIPPED)
            continue
        result[name] = {
            "rps": round(_median([x["rps"] for x in rounds]), 1),
            "gateway_cpu_ms_per_req": round(_median([x["cpu_ms_per_req"] for x in rounds]), 4),
            "added_p50_ms": round(_median([x["p50_ms"] for x in rounds]) - direct["p50_ms"], 3),
            "added_p99_ms": round(_median([x["p99_ms"] for x in rounds]) - direct["p99_ms"], 3),
            "errors": sum(x["errors"] for x in rounds),
            "processes": rounds[0]["processes"],
        }

    def ratio(a: str, b: str) -> float | None:
        per_round = [
            raw[f"{a}#{r}"]["cpu_ms_per_req"] / raw[f"{b}#{r}"]["cpu_ms_per_req"]
            for r in range(args.rounds)
            if f"{a}#{r}" in raw and f"{b}#{r}" in raw
        ]
        return round(_median(per_round), 3) if per_round else None

    result["summary"] = {
        "redis3_over_memory1_cpu": ratio("redis-3", "memory-1"),
        "workers2_over_workers1_cpu": ratio("workers-2", "workers-1"),
        **(
            {
                "memory3_over_memory1_cpu": ratio("memory-3", "memory-1"),
                "redis1_over_memory1_cpu": ratio("redis-1", "memory-1"),
                "redis3_over_memory3_cpu": ratio("redis-3", "memory-3"),
            }
            if args.diagnose
            else {}
        ),
        "direct_rps": round(direct["rps"], 1),
        "settings": {
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "window_s": args.window,
            "warmup_s": args.warmup,
            "pinned": cpus != (None, None),
        },
    }
    return result


def _table(res: dict[str, Any]) -> str:
    lines = [f"{'config':<10} {'rps':>8} {'cpu ms/req':>11} {'+p50 ms':>8} {'+p99 ms':>8} {'errors':>7}"]
    for name, r in res.items():
        if name == "summary":
            continue
        if "skipped" in r:
            lines.append(f"{name:<10} skipped: {r['skipped']}")
            continue
        lines.append(
            f"{name:<10} {r['rps']:>8.1f} {r['gateway_cpu_ms_per_req']:>11.4f} "
            f"{r['added_p50_ms']:>8.3f} {r['added_p99_ms']:>8.3f} {r['errors']:>7}"
        )
    s = res["summary"]
    lines.append(
        f"redis-3 / memory-1 CPU per request (median of per-round ratios): {s['redis3_over_memory1_cpu']}"
    )
    for key in ("memory3_over_memory1_cpu", "redis1_over_memory1_cpu", "redis3_over_memory3_cpu"):
        if key in s:
            lines.append(f"{key}: {s[key]}")
    if s["workers2_over_workers1_cpu"] is not None:
        lines.append(f"workers-2 / workers-1 CPU per request: {s['workers2_over_workers1_cpu']}")
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
        "--diagnose",
        action="store_true",
        help="also memory-3 (three replicas, memory backend) and redis-1 (one replica on Redis)",
    )
    args = ap.parse_args()
    res = run(args)
    print(json.dumps(res) if args.json else _table(res))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
