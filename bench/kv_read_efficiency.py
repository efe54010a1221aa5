"""The shared vLLM runs against a decode KV-read efficiency, side by side in one run.

For each ``kv_read_efficiency`` (GpuSpec; 1 is the model without the term) it replays both shared
runs (``vllm-measurements/``) with the model given as a config.json and the GPUs by datasheet
figures (``examples/catalog-datasheet.yaml``) and prints the TPOT/TTFT mean errors of

* ``means``: both GPUs at the documented H100/A100 mean efficiencies (the prediction case);
* ``example``: the catalogue file as shipped (the RTX 4090 at efficiencies fitted to its run);
* ``fit A -> B``: leave-one-out, memory/compute efficiencies grid-fitted to run A (as
  ``python -m tokenplane.sim.calibrate --engine-fit`` does, grid widened to 1.0) and B predicted.

The KV-read efficiency is held fixed, never fitted to the runs: this shows what a value taken
from elsewhere would do. Usage::

    python bench/kv_read_efficiency.py [--traces ../shared/traces] [--kv 1.0 0.9 0.8 0.7] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tokenplane.sim.catalog import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEM_EFFICIENCY, Catalog
from tokenplane.sim.validation import Measurement, compare, load_measurement, measurement_folders, replay

ROOT = Path(__file__).resolve().parents[1]
MEM_GRID = (0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
COMPUTE_GRID = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)


def _errors(run: Measurement, cat: Catalog) -> dict[str, float]:
    res = compare(run, replay(run, cat))
    return {"tpot": res["tpot_mean_rel_error"], "ttft": res["ttft_mean_rel_error"]}


def _set(cat: Catalog, gpus: list[str], **fields: float) -> Catalog:
    return cat.with_overrides({"gpus": {g: dict(fields) for g in gpus}})


def table(runs: dict[str, Measurement], kvs: list[float]) -> dict[str, Any]:
    example = Catalog.from_yaml(ROOT / "examples" / "catalog-datasheet.yaml")
    gpus = [example.gpu(r.gpu).name for r in runs.values()]
    # The documented means: the shipped file without the fitted RTX 4090 efficiencies.
    means = _set(
        example, gpus, mem_efficiency=DEFAULT_MEM_EFFICIENCY, compute_efficiency=DEFAULT_COMPUTE_EFFICIENCY
    )
    out: dict[str, Any] = {}
    for kv in kvs:
        row: dict[str, Any] = {}
        m_cat, e_cat = _set(means, gpus, kv_read_efficiency=kv), _set(example, gpus, kv_read_efficiency=kv)
        for name, run in runs.items():
            row[f"means {name}"] = _errors(run, m_cat)
            row[f"example {name}"] = _errors(run, e_cat)
        for src, dst in ((a, b) for a in runs for b in runs if a != b):
            g = m_cat.gpu(runs[src].gpu).name
            best = min(
                (abs(e["tpot"]) + abs(e["ttft"]) / 3, me, ce)
                for me in MEM_GRID
                for ce in COMPUTE_GRID
                for e in [_errors(runs[src], _set(m_cat, [g], mem_efficiency=me, compute_efficiency=ce))]
            )
            _, me, ce = best
            gd = m_cat.gpu(runs[dst].gpu).name
            row[f"fit {src} -> {dst}"] = {
                "mem_efficiency": me,
                "compute_efficiency": ce,
                **_errors(runs[dst], _set(m_cat, [gd], mem_efficiency=me, compute_efficiency=ce)),
            }
        out[str(kv)] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--traces", type=Path, default=None)
    ap.add_argument("--kv", type=float, nargs="+", default=[1.0, 0.9, 0.8, 0.7])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = {p.name.split("_")[0]: load_measurement(p) for p in measurement_folders(args.traces)}
    result = table(runs, args.kv)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for kv, row in result.items():
        print(f"kv_read_efficiency {kv}")
        for case, e in row.items():
            fit = ""
            if "mem_efficiency" in e:
                fit = f"  (mem {e['mem_efficiency']}, compute {e['compute_efficiency']})"
            print(f"  {case:28s} TPOT {e['tpot']:+6.1%}  TTFT {e['ttft']:+6.1%}{fit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
