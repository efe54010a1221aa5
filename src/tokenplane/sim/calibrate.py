"""Re-fit the step-time model's constants on the public GPU profiles.

Usage::

    python -m tokenplane.sim.calibrate --traces ../shared/traces

reads ``gpu-profiles/*_mlp.csv`` (Vidur per-operator timings, ms, by batched tokens and tensor
parallelism) and ``gpu-profiles/h100_dgx_all_reduce.csv``, fits per GPU generation
``mem_efficiency``, ``compute_efficiency``, ``step_overhead_s`` and ``layer_overhead_s`` (TP
1/2/4/8, all token counts, least squares on log time ratios, knee p-norm fixed at 2) and the
all-reduce latency and bus efficiency, and prints the fitted values with the relative errors of
the catalogue's current constants. Copy the printed values into :mod:`tokenplane.sim.catalog`
and :mod:`tokenplane.sim.perf_model`.

``--engine-fit DIR [--catalog FILE]`` instead grid-fits one GPU's memory and compute efficiencies
to a real vLLM run (for a GPU with no operator profile, such as one given by datasheet figures).
The mixture-of-experts and expert-parallel terms have no shared profile to fit: the step-time
model derives them from shapes and the fitted dense and all-reduce constants (see
:mod:`tokenplane.sim.perf_model`).

Pure standard library (a small Nelder-Mead): no numpy needed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenplane.sim import perf_model
from tokenplane.sim.catalog import Catalog, GpuSpec, ModelSpec
from tokenplane.sim.perf_model import StepTimeModel

# Per-layer operators of a Vidur MLP profile and how often each runs per transformer block
# (two RMSNorms are profiled separately; the residual add runs twice per block).
LAYER_OPS: dict[str, int] = {
    "input_layernorm": 1,
    "attn_pre_proj": 1,
    "attn_rope": 1,
    "attn_post_proj": 1,
    "post_attention_layernorm": 1,
    "mlp_up_proj": 1,
    "mlp_act": 1,
    "mlp_down_proj": 1,
    "add": 2,
}
STEP_OPS: dict[str, int] = {"emb": 1}  # once per step

_FILE_RE = re.compile(r"^(?P<gpu>[a-z0-9]+)_(?P<org>[^_]+)_(?P<model>.+)_mlp\.csv$", re.IGNORECASE)


@dataclass(frozen=True)
class Profile:
    """Measured non-attention step time (seconds) by TP degree and batched tokens."""

    gpu: str
    model: ModelSpec
    source: str
    times: dict[int, dict[int, float]]  # tp -> num_tokens -> seconds


def profile_step_time_ms(row: dict[str, str], layers: int) -> float:
    """Non-attention forward time of one step from one profile row (ms): ops x layers + embedding."""
    per_layer = sum(k * float(row[f"time_stats.{op}.mean"]) for op, k in LAYER_OPS.items())
    once = sum(k * float(row[f"time_stats.{op}.mean"]) for op, k in STEP_OPS.items())
    return layers * per_layer + once


def load_profile(path: Path, catalog: Catalog | None = None) -> Profile:
    """Read one ``<gpu>_<org>_<model>_mlp.csv``; rows with the same (tp, tokens) are averaged."""
    cat = catalog or Catalog.default()
    m = _FILE_RE.match(path.name)
    if m is None:
        raise ValueError(f"not a profile file name: {path.name}")
    model = cat.model(f"{m['org']}/{m['model']}")
    acc: dict[tuple[int, int], list[float]] = defaultdict(list)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if int(row["n_embd"]) != model.hidden:
                raise ValueError(f"{path.name}: n_embd {row['n_embd']} != {model.name} hidden {model.hidden}")
            key = (int(row["num_tensor_parallel_workers"]), int(row["num_tokens"]))
            acc[key].append(profile_step_time_ms(row, model.layers) / 1e3)
    times: dict[int, dict[int, float]] = defaultdict(dict)
    for (tp, n), vals in acc.items():
        times[tp][n] = sum(vals) / len(vals)
    return Profile(gpu=m["gpu"].lower(), model=model, source=path.name, times=dict(times))


def nelder_mead(
    f: Callable[[Sequence[float]], float],
    x0: Sequence[float],
    step: Sequence[float],
    iters: int = 2000,
    tol: float = 1e-12,
) -> list[float]:
    """Minimise ``f`` from ``x0`` (standard reflection/expansion/contraction/shrink)."""
    n = len(x0)
    pts = [list(x0)]
    for i in range(n):
        p = list(x0)
        p[i] += step[i]
        pts.append(p)
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        centroid = [sum(p[i] for p in pts[:-1]) / n for i in range(n)]
        worst = pts[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                best = pts[0]
                pts = [best] + [[b + 0.5 * (p - b) for b, p in zip(best, q, strict=True)] for q in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = min(range(n + 1), key=vals.__getitem__)
    return pts[i]


def _with_params(gpu: GpuSpec, x: Sequence[float]) -> GpuSpec:
    return dataclasses.replace(
        gpu,
        mem_efficiency=x[0],
        compute_efficiency=x[1],
        step_overhead_s=x[2] * 1e-3,
        layer_overhead_s=x[3] * 1e-6,
        knee_sharpness=x[4],
    )


def _loss(gpu: GpuSpec, profiles: Sequence[Profile], tps: Sequence[int] = (1,)) -> float:
    total = 0.0
    count = 0
    for prof in profiles:
        for tp in tps:
            model = StepTimeModel(gpu, prof.model, tp, include_lm_head=False)
            for n, t in prof.times.get(tp, {}).items():
                pred = model.linear_time(n) - model.allreduce_time(n)
                total += math.log(pred / t) ** 2
                count += 1
    return total / max(count, 1)


@dataclass(frozen=True)
class GpuFit:
    gpu: str
    mem_efficiency: float
    compute_efficiency: float
    step_overhead_s: float
    layer_overhead_s: float
    knee_sharpness: float
    rms_log_error: float


ALL_TPS = (1, 2, 4, 8)
# The knee is a p-norm with p fixed at 2 (the free fit's p = 1.4 is softer than the 70B profiles).
KNEE_SHARPNESS = 2.0


def fit_gpu(
    gpu: GpuSpec,
    profiles: Sequence[Profile],
    tps: Sequence[int] = ALL_TPS,
    knee_sharpness: float | None = KNEE_SHARPNESS,
) -> GpuFit:
    """Fit the per-GPU constants to the rows of ``profiles`` with TP degree in ``tps``.

    ``knee_sharpness`` is held fixed unless ``None`` (then it is fitted too: the free fit prefers a
    softer knee, p = 1.4, that overshoots the H100 70B profile by up to 35 % around 256 tokens).
    """

    def objective(x: Sequence[float]) -> float:
        mem, comp, ovh_ms, layer_us = x[:4]
        p = x[4] if knee_sharpness is None else knee_sharpness
        ok = 0.05 < mem <= 1.0 and 0.05 < comp <= 1.0 and ovh_ms >= 0 and layer_us >= 0 and 1.0 <= p <= 20.0
        if not ok:
            return 1e9
        return _loss(_with_params(gpu, [mem, comp, ovh_ms, layer_us, p]), profiles, tps)

    x = [0.8, 0.7, 0.1, 30.0, 2.0]
    steps = [0.05, 0.05, 0.1, 5.0, 0.5]
    if knee_sharpness is not None:
        x, steps = x[:4], steps[:4]
    for _ in range(4):  # restarts help Nelder-Mead out of a collapsed simplex
        x = nelder_mead(objective, x, steps, iters=800)
    err = math.sqrt(objective(x))
    p = x[4] if knee_sharpness is None else knee_sharpness
    return GpuFit(gpu.name, x[0], x[1], x[2] * 1e-3, x[3] * 1e-6, p, err)


def load_allreduce(path: Path) -> dict[int, list[tuple[int, float]]]:
    """num_workers -> [(bytes, median seconds)] from Vidur's all-reduce profile."""
    out: dict[int, list[tuple[int, float]]] = defaultdict(list)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            out[int(row["num_workers"])].append(
                (int(row["size"]), float(row["time_stats.all_reduce.median"]) / 1e3)
            )
    return dict(out)


def fit_allreduce(data: dict[int, list[tuple[int, float]]], link_gbps: float) -> tuple[float, float, float]:
    """Fit (latency_s, bus efficiency) of ``t = a + 2(k-1)/k * bytes / (eff * link/2)``; + rms log error."""
    pts = [(k, b, t) for k, rows in data.items() for b, t in rows if t > 0]

    def model(x: Sequence[float], k: int, b: float) -> float:
        return x[0] * 1e-6 + 2 * (k - 1) / k * b / (x[1] * link_gbps / 2 * 1e9)

    def objective(x: Sequence[float]) -> float:
        if x[0] <= 0 or not 0.01 < x[1] <= 1.5:
            return 1e9
        return sum(math.log(model(x, k, b) / t) ** 2 for k, b, t in pts) / len(pts)

    x = [20.0, 0.7]
    for _ in range(3):
        x = nelder_mead(objective, x, [5.0, 0.1], iters=400)
    return x[0] * 1e-6, x[1], math.sqrt(objective(x))


def _rel(pred: float, actual: float) -> str:
    return f"{(pred - actual) / actual * 100:+6.1f}%"


REPORT_TOKENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def report(traces: Path, catalog: Catalog | None = None, scan_elementwise: bool = False) -> str:
    """Fit everything under ``traces/gpu-profiles`` and return a printable report."""
    cat = catalog or Catalog.default()
    prof_dir = traces / "gpu-profiles"
    lines: list[str] = []
    profiles: dict[str, list[Profile]] = defaultdict(list)
    for path in sorted(prof_dir.glob("*_mlp.csv")):
        prof = load_profile(path, cat)
        profiles[prof.gpu].append(prof)
    if scan_elementwise:
        lines.append("== ELEMENTWISE_TRAFFIC_FACTOR scan (summed rms log error of the per-GPU fits)")
        saved = perf_model.ELEMENTWISE_TRAFFIC_FACTOR
        try:
            for factor in (1.0, 1.2, 1.4, 1.6, 1.8, 2.0):
                perf_model.ELEMENTWISE_TRAFFIC_FACTOR = factor
                errs = [fit_gpu(cat.gpu(g), ps).rms_log_error for g, ps in sorted(profiles.items())]
                lines.append(f"  factor {factor:.1f}: " + " ".join(f"{e:.4f}" for e in errs))
        finally:
            perf_model.ELEMENTWISE_TRAFFIC_FACTOR = saved
        lines.append("")
    lines.append(
        f"== per-GPU fit (ELEMENTWISE_TRAFFIC_FACTOR={perf_model.ELEMENTWISE_TRAFFIC_FACTOR}; TP 1/2/4/8, "
        "all profiled token counts, least squares on log(pred/actual); all-reduce not in the profiles; "
        "knee p fixed at 2)"
    )
    for gname, profs in sorted(profiles.items()):
        fit = fit_gpu(cat.gpu(gname), profs)
        free = fit_gpu(cat.gpu(gname), profs, knee_sharpness=None)
        lines.append(
            f"{gname}: mem_efficiency={fit.mem_efficiency:.3f} "
            f"compute_efficiency={fit.compute_efficiency:.3f} "
            f"step_overhead_s={fit.step_overhead_s:.6f} layer_overhead_s={fit.layer_overhead_s:.3g} "
            f"knee_sharpness={fit.knee_sharpness:.2f} "
            f"rms_log_err={fit.rms_log_error:.3f}  [{', '.join(p.source for p in profs)}]"
        )
        lines.append(
            f"  (free knee: p={free.knee_sharpness:.2f} mem={free.mem_efficiency:.3f} "
            f"compute={free.compute_efficiency:.3f} rms_log_err={free.rms_log_error:.3f})"
        )
    lines.append("")
    lines.append(
        "== errors of the catalogue's constants: linear_time (LM head and all-reduce excluded) vs profile"
    )
    for gname, profs in sorted(profiles.items()):
        gpu = cat.gpu(gname)
        for prof in profs:
            for tp in sorted(prof.times):
                model = StepTimeModel(gpu, prof.model, tp, include_lm_head=False)
                cells = []
                worst = 0.0
                for n, t in sorted(prof.times[tp].items()):
                    pred = model.linear_time(n) - model.allreduce_time(n)
                    worst = max(worst, abs(pred / t - 1))
                    if n in REPORT_TOKENS:
                        cells.append(f"{n}:{t * 1e3:.2f}ms {_rel(pred, t)}")
                lines.append(
                    f"{gname} {prof.model.name} TP{tp} max|err|={worst * 100:.1f}%  " + "  ".join(cells)
                )
    ar_path = prof_dir / "h100_dgx_all_reduce.csv"
    if ar_path.exists():
        data = load_allreduce(ar_path)
        link = cat.gpu("h100").interconnect_gbps or 900.0
        lat, eff, err = fit_allreduce(data, link)
        lines.append("")
        lines.append(
            f"== all-reduce fit ({ar_path.name}, H100 NVLink {link:.0f} GB/s): latency={lat * 1e6:.1f}us "
            f"bus_efficiency={eff:.3f} (bus bw {eff * link / 2:.0f} GB/s) rms_log_err={err:.3f}"
        )
        for k, rows in sorted(data.items()):
            cells = []
            ordered = sorted(rows)
            for i in range(0, len(ordered), max(1, len(ordered) // 8)):
                b, t = ordered[i]
                pred = perf_model.allreduce_time_s(b, k, link)
                cells.append(f"{b / 2**20:.2f}MiB:{t * 1e6:.0f}us {_rel(pred, t)}")
            lines.append(f"  k={k}: " + "  ".join(cells))
    return "\n".join(lines)


def fit_engine(measurement_dir: Path, catalog: Catalog | None = None) -> str:
    """Grid-fit a GPU's memory and compute efficiency to a real vLLM run (for GPUs with no profile).

    Minimises |TPOT mean error| + |TTFT mean error| / 3 over a coarse grid; TPOT is weighted more
    because it reflects the step time directly, while TTFT also compounds queueing.
    """
    from tokenplane.sim.validation import compare, load_measurement, replay

    base = catalog or Catalog.default()
    m = load_measurement(measurement_dir)
    gpu = base.gpu(m.gpu)
    rows = []
    for me in (0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
        for ce in (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
            cat = base.with_overrides({"gpus": {gpu.name: {"mem_efficiency": me, "compute_efficiency": ce}}})
            res = compare(m, replay(m, cat))
            tpot, ttft = res["tpot_mean_rel_error"], res["ttft_mean_rel_error"]
            rows.append((abs(tpot) + abs(ttft) / 3, me, ce, tpot, ttft))
    rows.sort()
    lines = [f"{m.name}: best (mem_efficiency, compute_efficiency) for {gpu.name}"]
    for score, me, ce, tpot, ttft in rows[:5]:
        lines.append(
            f"  mem={me:.2f} compute={ce:.2f}  TPOT {tpot:+.1%}  TTFT {ttft:+.1%}  score {score:.3f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--traces", type=Path, required=True, help="the public traces folder (has gpu-profiles/)")
    ap.add_argument(
        "--scan-elementwise", action="store_true", help="also scan ELEMENTWISE_TRAFFIC_FACTOR (slower)"
    )
    ap.add_argument(
        "--engine-fit",
        type=Path,
        action="append",
        default=[],
        help="a vLLM measurement folder: grid-fit its GPU's efficiencies to it (repeatable)",
    )
    ap.add_argument(
        "--catalog",
        type=Path,
        help="catalogue YAML (a GPU by datasheet figures, a model by config.json) for --engine-fit",
    )
    args = ap.parse_args(argv)
    base = Catalog.from_yaml(args.catalog) if args.catalog else None
    for folder in args.engine_fit:
        print(fit_engine(folder, base))
    if args.engine_fit:
        return 0
    if not (args.traces / "gpu-profiles").is_dir():
        ap.error(f"{args.traces}/gpu-profiles not found")
    print(report(args.traces, scan_elementwise=args.scan_elementwise))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
