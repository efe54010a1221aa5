"""The shared vLLM runs with the measured-matmul compute prior (``matmul_tflops``), before and after,
in one run.

Both shared runs (``vllm-measurements/``) are replayed with the model as a config.json and the GPUs
by datasheet figures (``examples/catalog-datasheet.yaml`` without its fitted RTX 4090 efficiencies)
and the TPOT/TTFT mean errors printed for

* ``means``: the documented H100/A100 mean efficiencies (before either prior);
* ``memory``: the memory-technology prior only (``memory_type``, :mod:`tokenplane.sim.memory_tech`);
* ``matmul``: the compute prior only (``matmul_tflops``, :mod:`tokenplane.sim.matmul_prior`);
* ``both``: both priors (after);
* ``spread``: ``both`` with each card's other published figures (the 4090's lowest and highest of
  its four runs, the PRO 6000 Workstation Edition's), the prior's sensitivity to its source;
* ``fit A -> B``: leave-one-out: memory/compute efficiencies grid-fitted to run A and run B
  predicted with them as they are (``same``) and moved by the two cards' memory-type and matmul
  ratios (``both ratios``; and the range over the grid's five best fits, near-equal optima);
* ``profiles``: on the Vidur profiles the reference was taken from (``gpu-profiles/``), each chip
  with its own fitted memory and overhead constants and its compute efficiency at its fit, at the
  documented mean and at its own matmul prior: rms log error over every row, and over the
  compute-bound ones (TP 1, 2,048 tokens and more); a consistency check of the split;
* ``memprofiles``: the same for the memory prior: each reference chip at its fitted memory
  efficiency, the documented mean and the prior its own row in the source gives it; rms log
  error over every row and over the memory-bound ones (TP 1, at most 64 tokens);
* ``needed``: at each card's compute prior, the memory efficiency (0.70..1.00 by 0.01) that brings
  its TPOT closest to 0: what the priors leave to the memory term.

Nothing here chooses a constant. Usage::

    python bench/matmul_prior.py [--traces ../shared/traces] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from tokenplane.sim.calibrate import ALL_TPS, _loss, load_profile
from tokenplane.sim.catalog import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEM_EFFICIENCY, Catalog
from tokenplane.sim.catalog_file import read_catalog_file
from tokenplane.sim.matmul_prior import (
    A100_SXM_MATMUL_TFLOPS,
    H100_SXM_MATMUL_TFLOPS,
    PUBLISHED_MATMUL_TFLOPS,
    REFERENCE_MATMUL_FRACTION,
    compute_efficiency_prior,
    matmul_ratio,
)
from tokenplane.sim.memory_tech import CARD_FRACTION, REFERENCE_READ_FRACTION, memory_type_ratio
from tokenplane.sim.perf_model import StepTimeModel
from tokenplane.sim.validation import Measurement, compare, load_measurement, measurement_folders, replay
from tokenplane.sim.workloads.traces import traces_dir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "catalog-datasheet.yaml"
MEM_GRID = (0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
COMPUTE_GRID = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
TOP_FITS = 5
NEEDED_GRID = tuple(round(0.70 + 0.01 * i, 2) for i in range(31))
# Each card's other published figures (zzc0721/torch-performance-test-data, see matmul_prior).
SPREAD = {"rtx4090": {"lowest run": 162.39, "highest run": 173.31}, "rtxpro6000": {"workstation": 417.98}}


def _errors(run: Measurement, cat: Catalog) -> dict[str, float]:
    res = compare(run, replay(run, cat))
    return {"tpot": res["tpot_mean_rel_error"], "ttft": res["ttft_mean_rel_error"]}


def _catalog(memory: bool, matmul: bool) -> Catalog:
    """The example file without the fitted efficiencies, with or without each prior's key."""
    data = read_catalog_file(EXAMPLE)
    gpus: dict[str, dict[str, Any]] = {}
    for name, entry in data["gpus"].items():
        e = {k: v for k, v in entry.items() if k not in ("mem_efficiency", "compute_efficiency")}
        if not memory:
            e.pop("memory_type", None)
        if not matmul:
            e.pop("matmul_tflops", None)
        gpus[name] = e
    return Catalog.default().with_overrides({**data, "gpus": gpus}, base_dir=EXAMPLE.parent)


def _set(cat: Catalog, gpu: str, **fields: float) -> Catalog:
    return cat.with_overrides({"gpus": {gpu: dict(fields)}})


def table(runs: dict[str, Measurement]) -> dict[str, Any]:
    cats = {
        "means": _catalog(False, False),
        "memory": _catalog(True, False),
        "matmul": _catalog(False, True),
        "both": _catalog(True, True),
    }
    both = cats["both"]
    gpu = {name: both.gpu(run.gpu) for name, run in runs.items()}
    out: dict[str, Any] = {
        "reference_matmul_fraction": REFERENCE_MATMUL_FRACTION,
        "prior": {
            g.name: {
                "matmul_tflops": g.matmul_tflops,
                "matmul_ratio": matmul_ratio(g.matmul_tflops, g.bf16_tflops) if g.matmul_tflops else None,
                "compute_efficiency": g.compute_efficiency,
                "mem_efficiency": g.mem_efficiency,
            }
            for g in gpu.values()
        },
    }
    for case, cat in cats.items():
        for name, run in runs.items():
            out[f"{case} {name}"] = _errors(run, cat)
    for name, run in runs.items():
        g = gpu[name]
        for label, tflops in SPREAD.get(g.name, {}).items():
            ce = compute_efficiency_prior(tflops, g.bf16_tflops)
            out[f"spread {name} {label}"] = {
                "matmul_tflops": tflops,
                "compute_efficiency": ce,
                **_errors(run, _set(both, g.name, compute_efficiency=ce)),
            }
    means = cats["means"]
    for src, dst in ((a, b) for a in runs for b in runs if a != b):
        gs, gd = gpu[src], gpu[dst]
        fits = sorted(
            (abs(e["tpot"]) + abs(e["ttft"]) / 3, me, ce)
            for me in MEM_GRID
            for ce in COMPUTE_GRID
            for e in [_errors(runs[src], _set(means, gs.name, mem_efficiency=me, compute_efficiency=ce))]
        )
        mem_ratio = memory_type_ratio(gd.memory_type) / memory_type_ratio(gs.memory_type)
        ratio = PUBLISHED_MATMUL_TFLOPS[gd.name][0] / gd.bf16_tflops
        ratio /= PUBLISHED_MATMUL_TFLOPS[gs.name][0] / gs.bf16_tflops
        # The grid's near-equal optima (the TOP_FITS best) moved the same way: the spread of B's errors.
        moved_top = [
            _errors(
                runs[dst],
                _set(
                    means,
                    gd.name,
                    mem_efficiency=min(1.0, m * mem_ratio),
                    compute_efficiency=min(1.0, c * ratio),
                ),
            )
            for _, m, c in fits[:TOP_FITS]
        ]
        _, me, ce = fits[0]
        mem, comp = min(1.0, me * mem_ratio), min(1.0, ce * ratio)
        out[f"fit {src} -> {dst}"] = {
            "fit": {"mem_efficiency": me, "compute_efficiency": ce},
            "moved": {"mem_efficiency": mem, "compute_efficiency": comp},
            "same": _errors(runs[dst], _set(means, gd.name, mem_efficiency=me, compute_efficiency=ce)),
            "both ratios": _errors(
                runs[dst], _set(means, gd.name, mem_efficiency=mem, compute_efficiency=comp)
            ),
            f"top {TOP_FITS} fits": {
                k: (min(e[k] for e in moved_top), max(e[k] for e in moved_top)) for k in ("tpot", "ttft")
            },
        }
    for name, run in runs.items():
        g = gpu[name]

        def tpot(me: float, g_name: str = g.name, run: Measurement = run) -> float:
            return _errors(run, _set(both, g_name, mem_efficiency=me))["tpot"]

        need = min(NEEDED_GRID, key=lambda me: abs(tpot(me)))
        out[f"needed {name}"] = {"mem_efficiency": need, "tpot": tpot(need), "prior": g.mem_efficiency}
    return out


def profiles(traces: Path | None) -> dict[str, Any]:
    """The compute prior on the reference chips' own Vidur profiles (see the module docstring)."""
    folder = traces_dir(traces)
    out: dict[str, Any] = {}
    if folder is None or not (folder / "gpu-profiles").is_dir():
        return out
    cat = Catalog.default()
    for chip, tflops in (("h100", H100_SXM_MATMUL_TFLOPS), ("a100", A100_SXM_MATMUL_TFLOPS)):
        profs = [load_profile(p) for p in sorted((folder / "gpu-profiles").glob(f"{chip}_*_mlp.csv"))]
        fit = cat.gpu(chip)
        for label, ce in (
            ("fit", fit.compute_efficiency),
            ("mean", DEFAULT_COMPUTE_EFFICIENCY),
            ("matmul prior", compute_efficiency_prior(tflops, fit.bf16_tflops)),
        ):
            g = dataclasses.replace(fit, compute_efficiency=ce)
            big = [
                math.log((m.linear_time(n) - m.allreduce_time(n)) / t) ** 2
                for prof in profs
                for m in [StepTimeModel(g, prof.model, 1, include_lm_head=False)]
                for n, t in prof.times.get(1, {}).items()
                if n >= 2048
            ]
            out[f"profiles {chip} {label}"] = {
                "compute_efficiency": ce,
                "rms_log_error": math.sqrt(_loss(g, profs, ALL_TPS)),
                "rms_log_error_compute_bound": math.sqrt(sum(big) / len(big)) if big else None,
            }
    return out


# The reference chips' own rows in the memory prior's source (sim/memory_tech.py).
OWN_ROW = {"h100": "H100 SXM5 80GB HBM3", "a100": "A100 SXM4 80GB"}
MEMORY_BOUND_TOKENS = 64


def memory_profiles(traces: Path | None) -> dict[str, Any]:
    """The memory prior's split on the reference chips' own Vidur profiles: each chip at its fitted
    memory efficiency, at the documented mean, and at the prior its own row in the source gives it
    (as if it had no fit); rms log error over every row and over the memory-bound ones (TP 1, at
    most 64 tokens). A consistency check of the split, like ``profiles`` for compute."""
    folder = traces_dir(traces)
    out: dict[str, Any] = {}
    if folder is None or not (folder / "gpu-profiles").is_dir():
        return out
    cat = Catalog.default()
    for chip, row in OWN_ROW.items():
        profs = [load_profile(p) for p in sorted((folder / "gpu-profiles").glob(f"{chip}_*_mlp.csv"))]
        fit = cat.gpu(chip)
        own = DEFAULT_MEM_EFFICIENCY * CARD_FRACTION[row] / REFERENCE_READ_FRACTION
        for label, me in (("fit", fit.mem_efficiency), ("mean", DEFAULT_MEM_EFFICIENCY), ("own row", own)):
            g = dataclasses.replace(fit, mem_efficiency=me)
            small = [
                math.log((m.linear_time(n) - m.allreduce_time(n)) / t) ** 2
                for prof in profs
                for m in [StepTimeModel(g, prof.model, 1, include_lm_head=False)]
                for n, t in prof.times.get(1, {}).items()
                if n <= MEMORY_BOUND_TOKENS
            ]
            out[f"memprofiles {chip} {label}"] = {
                "mem_efficiency": me,
                "rms_log_error": math.sqrt(_loss(g, profs, ALL_TPS)),
                "rms_log_error_memory_bound": math.sqrt(sum(small) / len(small)) if small else None,
            }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--traces", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = {p.name.split("_")[0]: load_measurement(p) for p in measurement_folders(args.traces)}
    result = {**table(runs), **profiles(args.traces), **memory_profiles(args.traces)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"reference matmul fraction (A100 SXM, H100 SXM): {result['reference_matmul_fraction']:.3f}")
    for g, p in result["prior"].items():
        print(
            f"  {g:12s} matmul {p['matmul_tflops']} TFLOP/s, ratio {p['matmul_ratio']:.3f}: compute "
            f"{p['compute_efficiency']:.3f}; memory {p['mem_efficiency']:.3f}"
        )
    for case, e in result.items():
        if case.startswith(("means ", "memory ", "matmul ", "both ")):
            print(f"  {case:28s} TPOT {e['tpot']:+6.1%}  TTFT {e['ttft']:+6.1%}")
        elif case.startswith("spread"):
            what = f"({e['matmul_tflops']} TFLOP/s, compute {e['compute_efficiency']:.3f})"
            print(f"  {case:28s} TPOT {e['tpot']:+6.1%}  TTFT {e['ttft']:+6.1%}  {what}")
        elif case.startswith("fit"):
            f, m = e["fit"], e["moved"]
            print(f"  {case:28s} fit mem {f['mem_efficiency']} compute {f['compute_efficiency']}")
            moved = f"  (mem {m['mem_efficiency']:.3f}, compute {m['compute_efficiency']:.3f})"
            for k in ("same", "both ratios"):
                extra = moved if k != "same" else ""
                print(f"    {k:26s} TPOT {e[k]['tpot']:+6.1%}  TTFT {e[k]['ttft']:+6.1%}{extra}")
            top = e[f"top {TOP_FITS} fits"]
            tp, tt = top["tpot"], top["ttft"]
            spread = f"TPOT {tp[0]:+.1%}..{tp[1]:+.1%}  TTFT {tt[0]:+.1%}..{tt[1]:+.1%}"
            print(f"    {f'top {TOP_FITS} fits, both ratios':26s} {spread}")
        elif case.startswith("profiles"):
            print(
                f"  {case:28s} compute {e['compute_efficiency']:.3f}: rms log error "
                f"{e['rms_log_error']:.1%}, compute-bound rows {e['rms_log_error_compute_bound']:.1%}"
            )
        elif case.startswith("memprofiles"):
            print(
                f"  {case:28s} memory {e['mem_efficiency']:.3f}: rms log error "
                f"{e['rms_log_error']:.1%}, memory-bound rows {e['rms_log_error_memory_bound']:.1%}"
            )
        elif case.startswith("needed"):
            print(
                f"  {case:28s} mem {e['mem_efficiency']:.2f} (prior {e['prior']:.3f}) at the compute "
                f"prior: TPOT {e['tpot']:+.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
