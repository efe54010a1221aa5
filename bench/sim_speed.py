"""How fast the twin simulates: requests per wall second and speed-up over real time.

Two fixed workloads, each on one core:

* ``mooncake_16``: the full Mooncake conversation trace (12,031 requests, real prefix reuse) at its
  recorded rate on 16 x H100 serving Llama-3.1-8B, routed round-robin (and, for comparison,
  prefix-affinity);
* ``synthetic_1m_128``: 1,000,000 Poisson requests (lognormal prompts of mean 1,000 tokens and
  outputs of mean 200) at 1,000 req/s on 128 x H100, routed least-requests.

Usage::

    python bench/sim_speed.py            # a table
    python bench/sim_speed.py --json     # one JSON object
    python bench/sim_speed.py --quick    # 100,000 synthetic requests instead of 1,000,000
"""

from __future__ import annotations

import argparse
import json
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="100,000 synthetic requests instead of 1,000,000")
    args = ap.parse_args(argv)
    n_synth = 100_000 if args.quick else 1_000_000
    out: dict[str, Any] = {}
    if traces_dir() is not None:
        mc = {"type": "mooncake", "path": "mooncake/conversation_trace.jsonl"}
        out["mooncake_16"] = _run("mooncake_16", "round-robin", 16, "llama-3.1-8b", mc)
        out["mooncake_16_prefix_affinity"] = _run("mooncake_16_pa", "prefix-affinity", 16, "llama-3.1-8b", mc)
        out["mooncake_16_wall_s"] = out["mooncake_16"]["wall_s"]
    else:
        print("traces folder not found: skipping the Mooncake figure", file=sys.stderr)
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
