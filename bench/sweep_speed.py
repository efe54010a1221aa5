"""How much faster a sweep runs on two local worker processes than on one, side by side.

Runs the same sweep (default ``examples/sweeps/fleet-size.yaml``, 48 variants) with ``--workers 1`` and
``--workers 2`` in one process, one after the other (``--repeat`` alternates them), and prints the
ratio of wall times (two workers over one: 0.5 is perfect scaling). Run it under ``nice`` on a
shared machine; the ratio, not the absolute times, is the figure.

Usage::

    python bench/sweep_speed.py [SWEEP.yaml] [--repeat N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from tokenplane.sim.sweep import load_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", nargs="?", default=str(ROOT / "examples" / "sweeps" / "fleet-size.yaml"))
    ap.add_argument("--repeat", type=int, default=1, help="alternate 1 and 2 workers this many times")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    spec = load_sweep(args.sweep)
    walls: dict[int, list[float]] = {1: [], 2: []}
    cpus: dict[int, list[float]] = {1: [], 2: []}
    variants = 0
    same = True
    for _ in range(args.repeat):
        rows: dict[int, list[Any]] = {}
        for workers in (1, 2):
            result = run_sweep(spec, workers=workers)
            walls[workers].append(result.wall_s)
            cpus[workers].append(sum(r["worker_cpu_s"] for r in result.rows))
            variants = len(result.rows)
            rows[workers] = [(r["run"], r["goodput_rps"], r["requests_total"]) for r in result.rows]
        same = same and rows[1] == rows[2]
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    out = {
        "variants": variants,
        "wall_s_1_worker": one,
        "wall_s_2_workers": two,
        "ratio_2_over_1": two / one,
        "same_rows": same,
        # CPU seconds the variants took (summed over workers): equal for 1 and 2 workers when the
        # second worker got a core of its own; higher with 2 when the machine's cores were busy
        "variants_cpu_s_1_worker": statistics.median(cpus[1]),
        "variants_cpu_s_2_workers": statistics.median(cpus[2]),
        "walls_s": walls,
    }
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(
            f"{variants} variants: 1 worker {one:.1f} s, 2 workers {two:.1f} s, ratio {two / one:.2f} "
            f"(rows identical: {same})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
