"""The shared vLLM runs with the memory-technology prior (``memory_type``), before and after, in one run.

Both shared runs (``vllm-measurements/``) are replayed with the model as a config.json and the GPUs
by datasheet figures (``examples/catalog-datasheet.yaml``, without its fitted RTX 4090
efficiencies) and the TPOT/TTFT mean errors printed for

* ``means``: every GPU at the documented H100/A100 mean efficiencies (before);
* ``prior``: each GPU's ``mem_efficiency`` from its ``memory_type`` (:mod:`tokenplane.sim.memory_tech`,
  FluidX3D bandwidth fractions; compute at the mean) (after);
* ``fit A -> B``: leave-one-out, memory/compute efficiencies grid-fitted to run A (as
  ``bench/kv_read_efficiency.py`` does) and B predicted with them as they are (``same``) and with
  the memory efficiency moved by the two memory types' ratio (``memory_type``);
* ``needed``: the memory efficiency (0.70..1.00 by 0.01) that brings each run's TPOT closest to 0
  at the mean compute efficiency, and the compute efficiency that does so at the memory prior:
  what the prior leaves to another term.

Nothing is fitted to choose the prior. Usage::

    python bench/memory_type_prior.py [--traces ../shared/traces] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tokenplane.sim.catalog import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEM_EFFICIENCY, Catalog
from tokenplane.sim.catalog_file import read_catalog_file
from tokenplane.sim.memory_tech import READ_FRACTION, mem_efficiency_prior, memory_type_ratio
from tokenplane.sim.validation import Measurement, compare, load_measurement, measurement_folders, replay

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "catalog-datasheet.yaml"
MEM_GRID = (0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
COMPUTE_GRID = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
NEEDED_GRID = tuple(round(0.70 + 0.01 * i, 2) for i in range(31))


def _errors(run: Measurement, cat: Catalog) -> dict[str, float]:
    res = compare(run, replay(run, cat))
    return {"tpot": res["tpot_mean_rel_error"], "ttft": res["ttft_mean_rel_error"]}


def _catalogs() -> tuple[Catalog, Catalog, dict[str, str | None]]:
    """(means, prior) catalogues from the example file, and each GPU entry's memory type."""
    data = read_catalog_file(EXAMPLE)
    gpus = {name: dict(e) for name, e in data["gpus"].items()}
    for e in gpus.values():  # the fitted RTX 4090 efficiencies are what a prediction lacks
        e.pop("mem_efficiency", None)
        e.pop("compute_efficiency", None)
        e.pop("matmul_tflops", None)  # the memory prior alone: compute at the mean (bench/matmul_prior.py)
    prior = Catalog.default().with_overrides({**data, "gpus": gpus}, base_dir=EXAMPLE.parent)
    bare = {n: {k: v for k, v in e.items() if k != "memory_type"} for n, e in gpus.items()}
    means = Catalog.default().with_overrides({**data, "gpus": bare}, base_dir=EXAMPLE.parent)
    return means, prior, {prior.gpu(n).name: e.get("memory_type") for n, e in gpus.items()}


def _set(cat: Catalog, gpu: str, **fields: float) -> Catalog:
    return cat.with_overrides({"gpus": {gpu: dict(fields)}})


def table(runs: dict[str, Measurement]) -> dict[str, Any]:
    means, prior, mtype = _catalogs()
    out: dict[str, Any] = {
        "source_read_fraction": READ_FRACTION,
        "prior": {g: {"memory_type": t, "mem_efficiency": mem_efficiency_prior(t)} for g, t in mtype.items()},
    }
    for name, run in runs.items():
        out[f"means {name}"] = _errors(run, means)
        out[f"prior {name}"] = _errors(run, prior)
    for src, dst in ((a, b) for a in runs for b in runs if a != b):
        gs, gd = means.gpu(runs[src].gpu).name, means.gpu(runs[dst].gpu).name
        _, me, ce = min(
            (abs(e["tpot"]) + abs(e["ttft"]) / 3, me, ce)
            for me in MEM_GRID
            for ce in COMPUTE_GRID
            for e in [_errors(runs[src], _set(means, gs, mem_efficiency=me, compute_efficiency=ce))]
        )
        moved = min(1.0, me * memory_type_ratio(mtype[gd]) / memory_type_ratio(mtype[gs]))
        out[f"fit {src} -> {dst}"] = {
            "fit": {"mem_efficiency": me, "compute_efficiency": ce},
            "same": _errors(runs[dst], _set(means, gd, mem_efficiency=me, compute_efficiency=ce)),
            "memory_type": {
                "mem_efficiency": moved,
                **_errors(runs[dst], _set(means, gd, mem_efficiency=moved, compute_efficiency=ce)),
            },
        }
    for name, run in runs.items():
        g = means.gpu(run.gpu).name
        p = mem_efficiency_prior(mtype[g])
        mem = min(NEEDED_GRID, key=lambda me: abs(_errors(run, _set(means, g, mem_efficiency=me))["tpot"]))

        def at_prior(c: float, g: str = g, p: float = p, run: Measurement = run) -> float:
            return _errors(run, _set(prior, g, mem_efficiency=p, compute_efficiency=c))["tpot"]

        ce = min(NEEDED_GRID, key=lambda c: abs(at_prior(c)))
        out[f"needed {name}"] = {
            "mem_efficiency_at_mean_compute": mem,
            "tpot": _errors(run, _set(means, g, mem_efficiency=mem))["tpot"],
            "compute_efficiency_at_prior_mem": ce,
            "tpot_at_prior_mem": at_prior(ce),
            "prior": p,
            "mean_mem": DEFAULT_MEM_EFFICIENCY,
            "mean_compute": DEFAULT_COMPUTE_EFFICIENCY,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--traces", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = {p.name.split("_")[0]: load_measurement(p) for p in measurement_folders(args.traces)}
    result = table(runs)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    fractions = {k: round(v, 3) for k, v in result["source_read_fraction"].items()}
    print("FluidX3D bandwidth fractions (median by type):", fractions)
    for g, p in result["prior"].items():
        print(f"  {g:12s} memory_type {p['memory_type']!s:7s} mem_efficiency prior {p['mem_efficiency']:.3f}")
    for case, e in result.items():
        if case.startswith(("means", "prior ")):
            print(f"  {case:24s} TPOT {e['tpot']:+6.1%}  TTFT {e['ttft']:+6.1%}")
        elif case.startswith("fit"):
            f, s, m = e["fit"], e["same"], e["memory_type"]
            print(f"  {case:24s} fit mem {f['mem_efficiency']} compute {f['compute_efficiency']}")
            print(f"    {'same':22s} TPOT {s['tpot']:+6.1%}  TTFT {s['ttft']:+6.1%}")
            moved = f"TPOT {m['tpot']:+6.1%}  TTFT {m['ttft']:+6.1%}  (mem {m['mem_efficiency']:.3f})"
            print(f"    {'memory_type':22s} {moved}")
        elif case.startswith("needed"):
            print(
                f"  {case:24s} mem {e['mem_efficiency_at_mean_compute']:.2f} at compute "
                f"{e['mean_compute']:.3f} (TPOT {e['tpot']:+.1%}); compute "
                f"{e['compute_efficiency_at_prior_mem']:.2f} at the prior mem {e['prior']:.3f} "
                f"(TPOT {e['tpot_at_prior_mem']:+.1%})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
