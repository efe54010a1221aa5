"""Sweeps: a grid of scenario variants, run in parallel on local processes or on a Ray cluster.

The sweep file, its grid and its variants are :mod:`tokenplane.sim.sweep_spec`'s (its docstring
shows a file). Variants run with :func:`run_variant`, a plain function of plain data, in
``workers`` local processes (:class:`concurrent.futures.ProcessPoolExecutor`) or as Ray tasks
(``ray_address``; ``"local"`` starts a single-machine Ray). Each returns one row of headline
figures (no records), so what crosses processes is small. The rows, in grid order, make one table
(``sweep.csv``, ``sweep.json``: :mod:`tokenplane.sim.sweep_table`);
:mod:`tokenplane.sim.sweep_plots` draws the Pareto front of cost against SLO attainment and the
heat maps.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenplane.sim.scenario import parse_scenario
from tokenplane.sim.sweep_spec import (
    HeatmapSpec,
    SweepError,
    SweepSpec,
    Variant,
    apply_point,
    check_sweep,
    expand,
    grid,
    load_sweep,
    set_path,
)
from tokenplane.sim.sweep_table import columns, sweep_table, write_table

__all__ = [
    "HeatmapSpec",
    "SweepError",
    "SweepResult",
    "SweepSpec",
    "Variant",
    "apply_point",
    "check_sweep",
    "columns",
    "expand",
    "grid",
    "load_sweep",
    "run_sweep",
    "run_variant",
    "set_path",
    "sweep_table",
    "write_table",
]

#: Figures each variant's row carries, from the run's report (``None`` where the report has none).
REPORT_FIELDS: tuple[str, ...] = (
    "requests_total",
    "requests_completed",
    "throughput_rps",
    "goodput_rps",
    "slo_attainment",
    "ttft_p50_s",
    "ttft_p99_s",
    "tbt_p50_s",
    "tbt_p99_s",
    "gpu_cost_usd",
    "cost_per_million_tokens",
    "instances",
    "retries",
    "timeouts",
    "zombie_completions",
    "wall_seconds",
)
#: Figures a variant gets relative to the reference run of its grid point.
RELATIVE_FIELDS: tuple[str, ...] = ("goodput_rps", "tail_goodput_rps")


@dataclass(slots=True)
class SweepResult:
    spec: SweepSpec
    rows: list[dict[str, Any]]
    wall_s: float
    workers: int
    engine: str
    files: list[Path] = field(default_factory=list)


# -- one variant ------------------------------------------------------------------------------------


def tail_goodput(report: Mapping[str, Any], fraction: float) -> float | None:
    """SLO-meeting completions per second over the last ``fraction`` of the run (from the report's
    ``goodput_timeline``; buckets after the timeline's last one had none)."""
    timeline = report.get("goodput_timeline") or []
    duration = report.get("duration_s") or 0.0
    if duration <= 0:
        return None
    bucket = timeline[1][0] - timeline[0][0] if len(timeline) > 1 else max(1.0, duration / 100)
    start = duration * (1.0 - fraction)
    met = math.fsum(g * bucket for t, g in timeline if t >= start - 1e-9)
    return met / (duration - start)


def run_variant(variant: Variant) -> dict[str, Any]:
    """Simulate one variant and return its row (grid values, run name, headline figures)."""
    from tokenplane.sim.runner import run_scenario

    scenario = parse_scenario(variant.scenario, source=variant.source)
    only = scenario.model_copy(update={"runs": [r for r in scenario.runs if r.name == variant.run]})
    started = time.perf_counter()
    cpu = time.process_time()
    outcome = run_scenario(only, traces=variant.traces)[variant.run]
    report = outcome.report
    row: dict[str, Any] = {"variant": variant.index, **dict(variant.point), "run": variant.run}
    for key in REPORT_FIELDS:
        row[key] = report.get(key)
    row["tail_goodput_rps"] = tail_goodput(report, variant.tail_fraction)
    row["router"] = (
        report.get("router") if isinstance(report.get("router"), str) else str(report.get("router"))
    )
    row["worker_wall_s"] = time.perf_counter() - started
    row["worker_cpu_s"] = time.process_time() - cpu
    row["worker_pid"] = os.getpid()
    return row


# -- running them -----------------------------------------------------------------------------------

DoneFn = Callable[[int, int], None]


def _run_local(variants: Sequence[Variant], workers: int, done: DoneFn | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if workers <= 1:
        for v in variants:
            rows.append(run_variant(v))
            if done:
                done(len(rows), len(variants))
        return rows
    # fork (cheap: the twin is already imported) unless this process runs other threads, whose locks
    # a fork could copy mid-hold; then spawn
    method = "fork" if threading.active_count() == 1 and os.name == "posix" else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        # map keeps the grid order; chunks of one so a slow variant never holds others back
        for row in pool.map(run_variant, variants, chunksize=1):
            rows.append(row)
            if done:
                done(len(rows), len(variants))
    return rows


def _run_ray(
    variants: Sequence[Variant], address: str, workers: int | None, done: DoneFn | None
) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is a dev dependency and an extra
        raise SweepError("--ray needs Ray: pip install 'tokenplane[ray]'") from exc
    started_here = not ray.is_initialized()
    if started_here:
        if address == "local":
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1)(run_variant)
        refs = [task.remote(v) for v in variants]
        index = {ref: i for i, ref in enumerate(refs)}
        rows: list[dict[str, Any] | None] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                rows[index[ref]] = ray.get(ref)
            if done:
                done(len(refs) - len(pending), len(refs))
        return [r for r in rows if r is not None]
    finally:
        if started_here:
            ray.shutdown()


def add_relative(rows: list[dict[str, Any]], spec: SweepSpec) -> None:
    """Each row's figures relative to the reference run of its grid point (``*_vs_reference``)."""
    if spec.reference is None:
        return
    axes = list(spec.axes)
    refs = {tuple(r[a] for a in axes): r for r in rows if r["run"] == spec.reference}
    for r in rows:
        ref = refs.get(tuple(r[a] for a in axes))
        for key in RELATIVE_FIELDS:
            num, den = r.get(key), None if ref is None else ref.get(key)
            r[f"{key.removesuffix('_rps')}_vs_reference"] = num / den if num is not None and den else None


def mark_pareto(rows: list[dict[str, Any]], x: str, y: str) -> None:
    """``pareto``: no other variant costs at most as much (``x``) and attains at least as much
    (``y``), strictly better in one."""
    pts = [(r.get(x), r.get(y)) for r in rows]
    for r, (cx, cy) in zip(rows, pts, strict=True):
        if cx is None or cy is None:
            r["pareto"] = False
            continue
        r["pareto"] = not any(
            ox is not None and oy is not None and ox <= cx and oy >= cy and (ox < cx or oy > cy)
            for ox, oy in pts
        )


def run_sweep(
    spec: SweepSpec,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    traces: str | Path | None = None,
    done: DoneFn | None = None,
) -> SweepResult:
    """Run every variant; rows come back in grid order whatever order they finished in."""
    variants = expand(spec, traces=traces)
    started = time.perf_counter()
    if ray_address is not None:
        rows = _run_ray(variants, ray_address, workers, done)
        engine, n = f"ray:{ray_address}", workers or 0
    else:
        n = workers or os.cpu_count() or 1
        rows = _run_local(variants, n, done)
        engine = "local"
    wall = time.perf_counter() - started
    add_relative(rows, spec)
    mark_pareto(rows, spec.pareto.get("x", "gpu_cost_usd"), spec.pareto.get("y", "slo_attainment"))
    return SweepResult(spec, rows, wall, n, engine)
