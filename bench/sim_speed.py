"""How fast the twin simulates: requests per wall second and speed-up over real time.

Two fixed workloads, each on one core:

* ``mooncake_16``: the full Mooncake conversation trace (12,031 requests, real prefix reuse) at its
  recorded rate on 16 x H100 serving Llama-3.1-8B, routed round-robin (and, for comparison,
  prefix-affinity);
* ``synthetic_1m_128``: 1,000,000 Poisson requests (lognormal prompts of mean 1,000 tokens and
  outputs of mean 200) at 1,000 req/s on 128 x H100, routed least-requests;
* ``synthetic_10m_1024``: a day of a 1,024 x H100 fleet: 10,000,000 Poisson requests (the same
  lengths) at 115.7 req/s (10 million over 86,400 s), routed least-requests, records streamed
  into aggregates (``simulate(aggregate=...)``), in a child process so that its peak resident
  memory (``synthetic_10m_1024_peak_rss_mb``) is its own.

Usage::

    python bench/sim_speed.py            # a table
    python bench/sim_speed.py --json     # one JSON object
    python bench/sim_speed.py --quick    # 100,000 synthetic requests instead of 1,000,000
    python bench/sim_speed.py --scale-requests 1000000   # the day's fleet at 1M requests (8,640 s)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.runner import simulate
from tokenplane.sim.scenario import EngineSettings, FleetSettings, RunSettings, SloSettings
from tokenplane.sim.workloads.factory import build_workload
from tokenplane.sim.workloads.traces import traces_dir


def _run(name: str, router: Any, instances: int, model: str, workload_cfg: dict[str, Any]) -> dict[str, Any]:
    run = RunSettings(
        name=name,
        seed=1,
        router=router,
        fleet=FleetSettings(instances=instances, gpu="H100", model=model, engine=EngineSettings()),
        workload=workload_cfg,
        sample_interval_s=60.0,
        slo=SloSettings(),
    )
    workload = build_workload(workload_cfg, traces=traces_dir(), seed=1)
    started = time.perf_counter()
    result = simulate(run, catalog=Catalog.default(), workload=workload)
    wall = time.perf_counter() - started
    done = sum(1 for r in result.records if r.ok)
    return {
        "requests": len(result.records),
        "completed": done,
        "wall_s": wall,
        "simulated_s": result.duration_s,
        "requests_per_wall_s": len(result.records) / wall,
        "speedup_over_real_time": result.duration_s / wall,
    }


DAY_RATE_RPS = 10_000_000 / 86_400


def _scale_child(n: int, instances: int, router: str) -> dict[str, Any]:
    """One streamed run of ``n`` requests at the day's rate on ``instances`` (in this process)."""
    from tokenplane.sim.report import RunAggregate, Slo, build_run_report

    cfg = {
        "type": "synthetic",
        "rate_rps": DAY_RATE_RPS,
        "num_requests": n,
        "prompt": {"kind": "lognormal", "mean": 1000, "cv": 1.0, "min": 1, "max": 16000},
        "output": {"kind": "lognormal", "mean": 200, "cv": 1.0, "min": 1, "max": 4000},
    }
    run = RunSettings(
        name="scale",
        seed=1,
        router=router,
        fleet=FleetSettings(instances=instances, gpu="H100", model="llama-3-8b", engine=EngineSettings()),
        workload=cfg,
        sample_interval_s=600.0,
        slo=SloSettings(),
    )
    slo = Slo()
    agg = RunAggregate(slo)
    cpu0 = time.process_time()
    started = time.perf_counter()
    result = simulate(
        run, catalog=Catalog.default(), workload=build_workload(cfg, traces=None, seed=1), aggregate=agg
    )
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    report = build_run_report(
        [],
        result.instances,
        result.tbt,
        duration_s=result.duration_s,
        wall_seconds=wall,
        slo=slo,
        aggregate=agg,
    )
    return {
        "router": router,
        "requests": report["requests_total"],
        "completed": report["requests_completed"],
        "ttft_p99_s": report["ttft_p99_s"],
        "wall_s": wall,
        "cpu_s": cpu,  # the figure to trust on a shared machine: wall time counts others' turns
        "simulated_s": result.duration_s,
        "requests_per_wall_s": report["requests_total"] / wall,
        "speedup_over_real_time": result.duration_s / wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _scale(n: int, instances: int, router: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--scale-child",
            str(n),
            "--instances",
            str(instances),
            "--scale-router",
            router,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout))


def _label(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else str(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="100,000 synthetic requests instead of 1,000,000")
    ap.add_argument("--scale-requests", type=int, default=10_000_000, help="requests of the day's fleet")
    ap.add_argument("--instances", type=int, default=1024, help="instances of the day's fleet")
    ap.add_argument("--scale-router", default="power-of-two", help="router of the day's fleet")
    ap.add_argument("--no-scale", action="store_true", help="skip the day's fleet")
    ap.add_argument("--only-scale", action="store_true", help="only the day's fleet")
    ap.add_argument("--scale-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.scale_child is not None:
        print(json.dumps(_scale_child(args.scale_child, args.instances, args.scale_router)))
        return 0
    n_synth = 100_000 if args.quick else 1_000_000
    out: dict[str, Any] = {}
    if not args.no_scale:
        key = f"synthetic_{_label(args.scale_requests)}_{args.instances}"
        out[key] = _scale(args.scale_requests, args.instances, args.scale_router)
        out[f"{key}_wall_s"] = out[key]["wall_s"]
        out[f"{key}_peak_rss_mb"] = out[key]["peak_rss_mb"]
    if args.only_scale:
        pass
    elif traces_dir() is not None:
        mc = {"type": "mooncake", "path": "mooncake/conversation_trace.jsonl"}
        out["mooncake_16"] = _run("mooncake_16", "round-robin", 16, "llama-3.1-8b", mc)
        out["mooncake_16_prefix_affinity"] = _run("mooncake_16_pa", "prefix-affinity", 16, "llama-3.1-8b", mc)
        out["mooncake_16_wall_s"] = out["mooncake_16"]["wall_s"]
    else:
        print("traces folder not found: skipping the Mooncake figure", file=sys.stderr)
    if not args.only_scale:
        synth = {
            "type": "synthetic",
            "rate_rps": 1000.0,
            "num_requests": n_synth,
            "prompt": {"kind": "lognormal", "mean": 1000, "cv": 1.0, "min": 1, "max": 16000},
            "output": {"kind": "lognormal", "mean": 200, "cv": 1.0, "min": 1, "max": 4000},
        }
        key = "synthetic_1m_128" if n_synth == 1_000_000 else f"synthetic_{n_synth}_128"
        out[key] = _run(key, "least-requests", 128, "llama-3-8b", synth)
        out[f"{key}_wall_s"] = out[key]["wall_s"]
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    for name, fig in out.items():
        if isinstance(fig, dict):
            rate, speedup = fig["requests_per_wall_s"], fig["speedup_over_real_time"]
            print(
                f"{name:32s} {fig['requests']:>9,d} requests  {fig['wall_s']:7.2f} s wall  "
                f"{rate:>10,.0f} req/s  {speedup:>8,.0f}x real time"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
