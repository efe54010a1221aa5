"""Tenant fairness at the gateway: does a heavy tenant's flood raise a light tenant's TTFT p99?

Issue 4's gateway bullet: "A heavy tenant flooding the gateway does not raise a light tenant's TTFT
p99 by more than 20 %." Separate processes, side by side in one run:

* one emulated GPU instance (``python -m tokenplane.emulator``, ``--speed 1 --fixed-step-ms 10
  --max-num-seqs 16``): every engine step costs 10 ms whatever the batch, so contention is for the
  16 batch slots, not for step time;
* the gateway (``python -m tokenplane serve`` with a generated config), restarted per scenario;
* the light tenant's client (this file with ``--_light``): open loop, ``--light-rps`` streaming
  completions of 16 tokens, Poisson arrivals (seeded; ``--light-arrivals steady`` for a fixed
  period); TTFT = send to the first SSE event carrying text;
* the heavy tenant's client (this file with ``--_heavy``): closed loop, ``--heavy-concurrency``
  completions of 256 tokens back to back (non-streaming unless ``--heavy-stream``); a refusal
  (429/503) is retried after its ``Retry-After``, as the ``openai`` client does.

Why Poisson: the engine steps on a fixed 10 ms grid, and a light request that finds it busy waits
for the step in progress. Arrivals at a fixed 100 ms period land at one phase of that grid for a
whole phase, so a steady run measures the luck of that phase (ratios from 1.06 to 1.70 between runs
of one build), and it hides bursts: at 10 req/s x 160 ms the light tenant holds 1.6 slots on
average, but Poisson arrivals need 6 or more now and then.

Per scenario: (1) the light tenant alone, (2) "busy": one background heavy stream keeps the engine
stepping (the floor: a new request waits for the step in progress), (3) the heavy flood starts and,
after a settling second, the light tenant is measured again for ``--phase-s``. A light request
belongs to the phase in which it was *sent*. Reported: light TTFT p50/p99 in each phase and
p99(flood) / p99(alone).

Scenarios (gateway config; the instance's ``max_concurrency`` is 16 = the emulator's batch, so the
gateway's admission queue holds the rest, unless said otherwise):

* ``fair``: light ``interactive``, heavy ``standard``, ``reserve: {interactive: 0.4}``: while the
  light tenant is active, 7 of the 16 slots are kept free of standard requests;
* ``fair-same-class``: both ``standard``, per-tenant ``max_in_flight`` 9 (fairness from the
  in-flight limit and the least-served-tokens order alone);
* ``cap-12``: light ``interactive``, heavy ``standard``, ``max_in_flight`` 12: the heavy tenant can
  never hold all 16 slots, but the 4 it leaves are fewer than a Poisson burst of light requests
  needs now and then (the configuration this bench used to call ``fair``);
* ``off``: both ``standard``, no per-tenant limit: the heavy tenant takes all 16 slots, and a light
  request waits in the gateway queue (first in line, by least service) for a heavy one to finish;
* ``off-no-queue``: both ``standard``, no limit, ``max_concurrency`` 256: the gateway never
  queues, everything waits FIFO in the emulator behind the heavy backlog.

``--quick`` runs ``fair``, ``fair-same-class`` and ``off``.

Pinning (where ``os.sched_setaffinity`` works with 2+ CPUs): the gateway on one CPU, the emulator,
both clients and this orchestrator on the other. Each phase also reports the gateway's and the
emulator's CPU use (from ``/proc/<pid>/stat``), to tell a saturated core from a scheduling effect.

Usage::

    python bench/tenant_fairness.py            # a table, 30 s phases: 300 light requests each (~8 minutes)
    python bench/tenant_fairness.py --quick    # 3 scenarios, 5 s phases (~1 minute)
    python bench/tenant_fairness.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

MODEL = "m"
LIGHT_KEY = "sk-light-0123456789"
HEAVY_KEY = "sk-heavy-0123456789"
MAX_NUM_SEQS = 16
STEP_MS = 10.0
LIGHT_WARM_S = 1.0  # first light requests open connections: not measured
BUSY_SETTLE_S = 0.5  # the one background heavy stream starts
FLOOD_SETTLE_S = 1.0  # the heavy tenant fills its slots and the queue before the flood phase

_OFF: dict[str, Any] = {
    "light": "standard", "heavy": "standard", "max_in_flight": None, "reserve": None, "max_concurrency": 16
}  # fmt: skip
SCENARIOS: dict[str, dict[str, Any]] = {
    "fair": {**_OFF, "light": "interactive", "reserve": {"interactive": 0.4}},
    "fair-same-class": {**_OFF, "max_in_flight": 9},
    "cap-12": {**_OFF, "light": "interactive", "max_in_flight": 12},
    "off": _OFF,
    "off-no-queue": {**_OFF, "max_concurrency": 256},
}
QUICK = ["fair", "fair-same-class", "off"]


# --------------------------------------------------------------------------- clients (subprocesses)


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


async def _light(spec: dict[str, Any]) -> None:
    """Open loop: one streaming request every 1/rps s from ``start`` to ``end``; prints JSON rows."""
    import aiohttp

    url, rps, start, end = spec["url"], spec["rps"], spec["start"], spec["end"]
    rows: list[dict[str, Any]] = []

    async def one(i: int, http: aiohttp.ClientSession) -> None:
        body = {"model": MODEL, "prompt": f"light request {i}: hello", "max_tokens": 16, "stream": True}
        t0 = time.monotonic()
        first: float | None = None
        status = 0
        try:
            async with http.post(url, json=body, headers=_headers(LIGHT_KEY)) as r:
                status = r.status
                async for line in r.content:
                    if first is None and line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                        choices = json.loads(line[6:]).get("choices") or []
                        if choices and choices[0].get("text"):
                            first = time.monotonic() - t0
        except (TimeoutError, aiohttp.ClientError) as exc:
            status = -1
            print(f"light request {i}: {exc!r}", file=sys.stderr)
        rows.append({"sent": t0, "ttft": first, "total": time.monotonic() - t0, "status": status})

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        tasks = []
        i, t = 0, start
        rng = random.Random(spec["seed"])
        while t < end:
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            tasks.append(asyncio.create_task(one(i, http)))
            i += 1
            t = start + i / rps if spec["arrivals"] == "steady" else t + rng.expovariate(rps)
        await asyncio.gather(*tasks)
    print(json.dumps(rows), flush=True)


async def _heavy(spec: dict[str, Any]) -> None:
    """Closed loop: ``concurrency`` workers, each sending the next request when one ends."""
    import aiohttp

    url, start, end = spec["url"], spec["start"], spec["end"]
    body = {"model": MODEL, "prompt": "heavy " * 50, "max_tokens": 256, "stream": spec["stream"]}
    done = {"ok": 0, "err": 0}

    async def worker(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            try:
                async with http.post(url, json=body, headers=_headers(HEAVY_KEY)) as r:
                    await r.read()
                    done["ok" if r.status == 200 else "err"] += 1
                    if r.status != 200:
                        done[f"status_{r.status}"] = done.get(f"status_{r.status}", 0) + 1
                        await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
            except (TimeoutError, aiohttp.ClientError):
                done["err"] += 1
                await asyncio.sleep(0.1)

    await asyncio.sleep(max(0.0, start - time.monotonic()))
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        workers = [asyncio.create_task(worker(http)) for _ in range(spec["concurrency"])]
        await asyncio.wait(workers, timeout=max(0.0, end - time.monotonic()))
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    print(json.dumps(done), flush=True)


# --------------------------------------------------------------------------- orchestration


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _cpus() -> tuple[int | None, int | None]:
    """(CPU for the emulator + clients, CPU for the gateway), or Nones when pinning is impossible."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def _spawn(args: list[str], cpu: int | None, **kw: Any) -> subprocess.Popen[bytes]:
    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    return subprocess.Popen(args, preexec_fn=pin, **kw)


def _get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            _get(url, 1.0)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


def _probe(gw_url: str, timeout_s: float = 20.0) -> None:
    """One tiny completion through the gateway: the instance is known healthy and serving."""
    body = json.dumps({"model": MODEL, "prompt": "probe", "max_tokens": 1}).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        req = urllib.request.Request(gw_url + "/v1/completions", body, _headers(LIGHT_KEY))
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway did not serve a probe completion")
        time.sleep(0.2)


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_idle(emu_url: str, timeout_s: float = 30.0) -> None:
    """Until the emulator has nothing running or waiting (the last flood's requests were aborted)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = _get(emu_url + "/metrics")
        if _metric(m, "vllm:num_requests_running") + _metric(m, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("the emulator did not drain")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gateway_config(sc: dict[str, Any], emu_port: int, port: int) -> dict[str, Any]:
    from tokenplane.gateway.config import hash_key

    queue: dict[str, Any] = {"max_per_tenant": 1024, "max_depth": 4096}
    if sc["max_in_flight"] is not None:
        queue["max_in_flight"] = sc["max_in_flight"]
    if sc["reserve"] is not None:
        queue["reserve"] = sc["reserve"]
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "tenants": [
            {"name": "light", "priority": sc["light"], "api_keys": [hash_key(LIGHT_KEY)]},
            {"name": "heavy", "priority": sc["heavy"], "api_keys": [hash_key(HEAVY_KEY)]},
        ],
        "models": [{"name": MODEL, "router": "round-robin"}],
        "instances": [
            {
                "id": "emu-0",
                "url": f"http://127.0.0.1:{emu_port}",
                "model": MODEL,
                "kind": "emulated",
                "max_concurrency": sc["max_concurrency"],
            }
        ],
        "scrape": {"interval_s": 1.0},
        "health": {"interval_s": 2.0, "failures_to_down": 1000},
        "admission": {"queue": queue},
    }


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))]


def _phase_stats(rows: list[dict[str, Any]], lo: float, hi: float) -> dict[str, Any]:
    sel = [r for r in rows if lo <= r["sent"] < hi]
    ttft = [r["ttft"] * 1e3 for r in sel if r["status"] == 200 and r["ttft"] is not None]
    return {
        "n": len(sel),
        "errors": len(sel) - len(ttft),
        "ttft_p50_ms": _pct(ttft, 0.50),
        "ttft_p99_ms": _pct(ttft, 0.99),
        "ttft_max_ms": max(ttft) if ttft else float("nan"),
        "ttft_ms": [round(x, 1) for x in sorted(ttft)],
    }


def _run_scenario(
    name: str, args: argparse.Namespace, emu: subprocess.Popen[bytes], emu_port: int, tmp: Path
) -> dict[str, Any]:
    import yaml

    client_cpu, gw_cpu = _cpus()
    sc = SCENARIOS[name]
    (gw_port,) = _free_ports(1)
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(_gateway_config(sc, emu_port, gw_port)))
    gw_url = f"http://127.0.0.1:{gw_port}"
    emu_url = f"http://127.0.0.1:{emu_port}"
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed in the finally below
    gw = _spawn([sys.executable, "-m", "tokenplane", "serve", str(cfg)], gw_cpu, stdout=log, stderr=log)
    heavies: list[subprocess.Popen[bytes]] = []
    try:
        _wait_http(gw_url + "/health", gw)
        _probe(gw_url)
        _wait_idle(emu_url)
        t0 = time.monotonic() + 1.0  # the clients' interpreters start meanwhile
        alone = (t0 + LIGHT_WARM_S, t0 + LIGHT_WARM_S + args.phase_s)
        busy = (alone[1] + BUSY_SETTLE_S, alone[1] + BUSY_SETTLE_S + args.phase_s)
        t_heavy = busy[1]
        flood = (t_heavy + FLOOD_SETTLE_S, t_heavy + FLOOD_SETTLE_S + args.phase_s)
        me = [sys.executable, __file__]
        url = gw_url + "/v1/completions"
        light_spec = {
            "url": url, "rps": args.light_rps, "start": t0, "end": flood[1],
            "arrivals": args.light_arrivals, "seed": args.seed,
        }  # fmt: skip
        stream = args.heavy_stream
        bg_spec = {"url": url, "concurrency": 1, "stream": stream, "start": alone[1], "end": flood[1] + 0.5}
        heavy_spec = {**bg_spec, "concurrency": args.heavy_concurrency - 1, "start": t_heavy}
        light = _spawn([*me, "--_light", json.dumps(light_spec)], client_cpu, stdout=subprocess.PIPE)
        for spec in (bg_spec, heavy_spec):
            heavies.append(_spawn([*me, "--_heavy", json.dumps(spec)], client_cpu, stdout=subprocess.PIPE))
        cpu: dict[str, dict[str, float]] = {}
        depth: list[float] = []
        for phase, (lo, hi) in (("alone", alone), ("busy", busy), ("flood", flood)):
            time.sleep(max(0.0, lo - time.monotonic()))
            g0, e0, w0 = _cpu_s(gw.pid), _cpu_s(emu.pid), time.monotonic()
            while time.monotonic() < hi - 0.3:
                if phase == "flood":
                    depth.append(_metric(_get(gw_url + "/metrics"), "tokenplane_queue_depth"))
                time.sleep(min(1.0, max(0.0, hi - 0.3 - time.monotonic())))
            time.sleep(max(0.0, hi - time.monotonic()))
            wall = time.monotonic() - w0
            cpu[phase] = {
                "gateway": (_cpu_s(gw.pid) - g0) / wall,
                "emulator": (_cpu_s(emu.pid) - e0) / wall,
            }
        out, _ = light.communicate(timeout=180)
        rows = json.loads(out)
        heavy_done = {"ok": 0, "err": 0}
        for h in heavies:
            for k, v in json.loads(h.communicate(timeout=60)[0]).items():
                heavy_done[k] = heavy_done.get(k, 0) + v
    finally:
        for h in heavies:
            if h.poll() is None:
                h.kill()
        gw.terminate()
        try:
            gw.wait(10)
        except subprocess.TimeoutExpired:
            gw.kill()
        log.close()
    a, b, f = _phase_stats(rows, *alone), _phase_stats(rows, *busy), _phase_stats(rows, *flood)
    return {
        "config": sc,
        "alone": a,
        "busy": b,
        "flood": f,
        "ratio": f["ttft_p99_ms"] / a["ttft_p99_ms"],
        "ratio_vs_busy": f["ttft_p99_ms"] / b["ttft_p99_ms"],
        "cpu": cpu,
        "queue_depth_mean": sum(depth) / len(depth) if depth else float("nan"),
        "heavy": heavy_done,
    }


def _table(res: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    lines = [
        "tenant fairness: light TTFT (ms) alone / engine busy (1 heavy stream) / heavy flood "
        f"(emulator: {MAX_NUM_SEQS} seqs, {STEP_MS:g} ms steps; light {settings['light_rps']:g} req/s "
        f"x 16 tok; heavy {settings['heavy_concurrency']} x 256 tok"
        f"{' streamed' if settings['heavy_stream'] else ''}; {settings['phase_s']:g} s per phase)",
        f"{'scenario':<16} {'alone':^13} | {'busy':^13} | {'flood':^21} | {'ratio p99':^13} | "
        f"{'queue':>5} {'heavy':>5} {'heavy':>7} | cpu gateway/emulator",
        f"{'':<16} {'p50':>6} {'p99':>6} | {'p50':>6} {'p99':>6} | {'p50':>6} {'p99':>6} {'max':>7} | "
        f"{'/alone':>6} {'/busy':>6} | {'depth':>5} {'done':>5} {'refused':>7} | alone, flood",
    ]
    for name, r in res.items():
        a, b, f, c = r["alone"], r["busy"], r["flood"], r["cpu"]
        errors = a["errors"] + b["errors"] + f["errors"]
        lines.append(
            f"{name:<16} {a['ttft_p50_ms']:>6.1f} {a['ttft_p99_ms']:>6.1f} | "
            f"{b['ttft_p50_ms']:>6.1f} {b['ttft_p99_ms']:>6.1f} | "
            f"{f['ttft_p50_ms']:>6.1f} {f['ttft_p99_ms']:>6.1f} {f['ttft_max_ms']:>7.1f} | "
            f"{r['ratio']:>6.2f} {r['ratio_vs_busy']:>6.2f} | "
            f"{r['queue_depth_mean']:>5.0f} {r['heavy']['ok']:>5} {r['heavy']['err']:>7} | "
            f"{c['alone']['gateway']:.2f}/{c['alone']['emulator']:.2f}, "
            f"{c['flood']['gateway']:.2f}/{c['flood']['emulator']:.2f}"
            + (f"  ({errors} light errors)" if errors else "")
        )
    n = next(iter(res.values()))["flood"]["n"]
    lines.append(
        f"{n} light requests per phase. Target (issue 4): p99 ratio <= 1.20 with fairness on. 'busy' is "
        "the floor no admission policy can beat: a busy engine makes a new request wait for the step "
        "in progress."
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 scenarios, 5 s phases (~1 minute)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--phase-s", type=float, default=None, help="seconds per phase (default 30, quick 5)")
    p.add_argument("--light-rps", type=float, default=10.0)
    p.add_argument("--light-arrivals", choices=("poisson", "steady"), default="poisson")
    p.add_argument("--seed", type=int, default=1, help="seed of the light tenant's Poisson arrivals")
    p.add_argument("--heavy-concurrency", type=int, default=64)
    p.add_argument("--heavy-stream", action="store_true", help="the heavy tenant streams its outputs")
    p.add_argument("--scenarios", default=None, help=f"comma list of {', '.join(SCENARIOS)}")
    p.add_argument("--log-dir", default=None, help="keep the gateways' logs here (default: discarded)")
    p.add_argument("--_light", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_heavy", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._light is not None:
        asyncio.run(_light(json.loads(args._light)))
        return
    if args._heavy is not None:
        asyncio.run(_heavy(json.loads(args._heavy)))
        return
    if args.phase_s is None:
        args.phase_s = 5.0 if args.quick else 30.0
    names = args.scenarios.split(",") if args.scenarios else (QUICK if args.quick else list(SCENARIOS))
    for n in names:
        if n not in SCENARIOS:
            p.error(f"unknown scenario {n!r}")

    client_cpu, _ = _cpus()
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    (emu_port,) = _free_ports(1)
    emu_cmd = [sys.executable, "-m", "tokenplane.emulator", "--port", str(emu_port), "--speed", "1"]
    emu_cmd += ["--fixed-step-ms", f"{STEP_MS:g}", "--max-num-seqs", str(MAX_NUM_SEQS)]
    emu_cmd += ["--served-model-name", MODEL]
    emu = _spawn(emu_cmd, client_cpu, stdout=subprocess.DEVNULL)
    res: dict[str, dict[str, Any]] = {}
    try:
        _wait_http(f"http://127.0.0.1:{emu_port}/health", emu)
        with tempfile.TemporaryDirectory() as tmp:
            logs = Path(args.log_dir or tmp)
            logs.mkdir(parents=True, exist_ok=True)
            for n in names:
                res[n] = _run_scenario(n, args, emu, emu_port, logs)
                if not args.json:
                    print(f"  {n}: ratio {res[n]['ratio']:.2f}", file=sys.stderr, flush=True)
    finally:
        emu.terminate()
        try:
            emu.wait(10)
        except subprocess.TimeoutExpired:
            emu.kill()

    settings = {
        "phase_s": args.phase_s,
        "light_rps": args.light_rps,
        "heavy_concurrency": args.heavy_concurrency,
        "heavy_stream": args.heavy_stream,
        "pinned": client_cpu is not None,
    }
    if args.json:
        out: dict[str, Any] = {"settings": settings, "scenarios": res}
        for prefix, n in (("", "fair"), ("off_", "off")):
            if n in res:
                out[f"{prefix}light_ttft_p99_alone_ms"] = res[n]["alone"]["ttft_p99_ms"]
                out[f"{prefix}light_ttft_p99_flood_ms"] = res[n]["flood"]["ttft_p99_ms"]
                out[f"{prefix}light_ttft_p99_busy_ms"] = res[n]["busy"]["ttft_p99_ms"]
                out[f"{prefix}ratio"] = res[n]["ratio"]
                out[f"{prefix}ratio_vs_busy"] = res[n]["ratio_vs_busy"]
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(_table(res, settings))


if __name__ == "__main__":
    main()
