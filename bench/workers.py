"""CPU per request of ``tokenplane serve --workers 2`` against ``--workers 1``, side by side.

One fast fake upstream (``_fake_upstream.py``), then interleaved rounds: in each round the gateway
is started as ``tokenplane serve CONFIG --workers 1`` and as ``--workers 2`` (the order alternates),
warmed up, and driven with ``--n`` non-streamed chat completions from ``--concurrency`` keep-alive
connections (the kernel's SO_REUSEPORT spreads those connections across the workers). The figure
is the gateway's CPU (``utime + stime`` of the serving process and its workers, from /proc; the
supervisor included) per request, and the requests each worker served (its ``/metrics``, read on
new connections). The config is the plain one of ``gateway_overhead.py`` (memory backends).

Usage: ``python bench/workers.py --json`` (about a minute; ``--rounds``/``--n`` to change).
Prints a JSON object: per configuration the median ``gateway_cpu_ms_per_req`` over rounds, the
rounds' figures, ``rps`` and ``errors``, and ``cpu_ratio_workers2_over_workers1``. On a machine
whose cores are shared with the load generator, requests per second are reported, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from _proc_cpu import cpu_s
from gateway_overhead import API_KEY, MODEL, _free_ports, _gateway_config

HERE = Path(__file__).resolve().parent
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16}
).encode()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (the supervisor and its workers)."""
    return cpu_s([pid], tree=True)


async def drive(url: str, n: int, concurrency: int) -> tuple[int, float]:
    """``n`` requests over ``concurrency`` keep-alive connections; returns (errors, seconds)."""
    errors = 0
    left = n
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def worker() -> None:
            nonlocal errors, left
            while left > 0:
                left -= 1
                async with http.post(url + "/v1/chat/completions", data=BODY, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return errors, time.perf_counter() - t0


async def per_worker_requests(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:
        for _ in range(40):
            async with http.get(url + "/metrics", headers={"Connection": "close"}) as r:
                text = await r.text()
            pid = re.search(r'tokenplane_worker_info\{[^}]*pid="(\d+)"', text)
            total = sum(
                float(v) for v in re.findall(r"^tokenplane_requests_total\{[^}]*\} (\S+)$", text, re.M)
            )
            out[pid.group(1) if pid else "single"] = total
            if pid is None or len(out) >= 2:
                break
    return out


def start_gateway(cfg: Path, workers: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    cli = Path(sys.executable).parent / "tokenplane"
    cmd = [str(cli), "serve", str(cfg), "--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        text = log.read_text(errors="replace")
        m = re.search(r"serving on (http://\S+?)(?: with | \(|$)", text, re.M)
        if m and (workers == 1 or text.count("(worker ") >= workers):
            return proc, m.group(1)
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the gateway did not start:\n{text}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=3000, help="requests measured per configuration and round")
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args()
    (up_port,) = _free_ports(1)
    up = subprocess.Popen(
        [sys.executable, str(HERE / "_fake_upstream.py"), "--ports", str(up_port), "--chunks", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert up.stdout is not None and up.stdout.readline().strip() == b"ready"
    results: dict[str, dict[str, Any]] = {
        f"workers-{w}": {"rounds_cpu_ms_per_req": [], "rps": [], "errors": 0, "requests_per_worker": []}
        for w in (1, 2)
    }
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Path(tmp) / "gateway.yaml"
            (gw_port,) = _free_ports(1)
            cfg.write_text(yaml.safe_dump(_gateway_config([up_port], gw_port)))
            for r in range(args.rounds):
                for w in (1, 2) if r % 2 == 0 else (2, 1):
                    proc, url = start_gateway(cfg, w, Path(tmp) / f"gw-{r}-{w}.log")
                    try:
                        asyncio.run(drive(url, args.warmup, args.concurrency))
                        c0 = tree_cpu_s(proc.pid)
                        errors, secs = asyncio.run(drive(url, args.n, args.concurrency))
                        c1 = tree_cpu_s(proc.pid)
                        res = results[f"workers-{w}"]
                        res["rounds_cpu_ms_per_req"].append(round((c1 - c0) * 1000 / args.n, 4))
                        res["rps"].append(round(args.n / secs, 1))
                        res["errors"] += errors
                        if w == 2:
                            res["requests_per_worker"].append(asyncio.run(per_worker_requests(url)))
                    finally:
                        stop(proc)
    finally:
        up.terminate()
        up.wait()
    for res in results.values():
        res["gateway_cpu_ms_per_req"] = statistics.median(res["rounds_cpu_ms_per_req"])
        res["rps"] = statistics.median(res["rps"])
    one, two = (results[k]["gateway_cpu_ms_per_req"] for k in ("workers-1", "workers-2"))
    out = {**results, "cpu_ratio_workers2_over_workers1": round(two / one, 3)}
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        for k, v in out.items():
            print(k, v)


if __name__ == "__main__":
    main()
