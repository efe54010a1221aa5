"""Sweeps: a grid of scenario variants, run in parallel on local processes or on a Ray cluster.

A sweep file names a base scenario file and axes, each a dotted path into that scenario with a
list of values; the grid is every combination of the axes' values, and each grid point runs each
of the scenario's runs (or the ``runs`` listed), one **variant** per (point, run):

.. code-block:: yaml

    name: fleet-size
    scenario: ../examples/cascade.yaml   # relative to this file
    runs: [naive, controlled]            # default: every run of the scenario
    reference: no-fault                  # optional: each variant also gets ratios to this run
    set: {duration_s: 300}               # optional: fixed values for every variant (dotted paths too)
    axes:
      fleet.instances: [4, 8]
      workload.rate_rps: [60, 100, 140]
      faults.0.factor: [2, 5]            # list items by index
      runs.controlled.router: [least-requests, power-of-two]   # a run's own key, by run name
    heatmaps:
      - {x: workload.rate_rps, y: faults.0.factor, value: tail_goodput_vs_reference}

A path (in ``set`` and ``axes``) sets a key of the scenario file as written, before the runs'
overrides are merged: a run that overrides the same key (``faults: []`` in a fault-free
reference) keeps its own value.

Variants run with :func:`run_variant`, a plain function of plain data, in ``workers`` local
processes (:class:`concurrent.futures.ProcessPoolExecutor`) or as Ray tasks (``ray_address``;
``"local"`` starts a single-machine Ray). Each returns one row of headline figures (no records),
so what crosses processes is small. The rows, in grid order, make one table (``sweep.csv``,
``sweep.json``); :mod:`tokenplane.sim.sweep_plots` draws the Pareto front of cost against SLO
attainment and the heat maps.
"""

from __future__ import annotations

import copy
import csv
import itertools
import json
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenplane.sim.scenario import ScenarioError, parse_scenario

__all__ = [
    "HeatmapSpec",
    "SweepError",
    "SweepResult",
    "SweepSpec",
    "Variant",
    "expand",
    "load_sweep",
    "run_sweep",
    "run_variant",
    "set_path",
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


class SweepError(ScenarioError):
    """A sweep file cannot be read, does not validate, or one of its variants is not a valid scenario."""


class HeatmapSpec(BaseModel):
    """One heat map: ``value`` over the grid of two axes, one panel per run and other-axes point."""

    model_config = ConfigDict(extra="forbid")

    x: str
    y: str
    value: str = "tail_goodput_vs_reference"


class SweepSpec(BaseModel):
    """A sweep file, validated (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "sweep"
    description: str = ""
    scenario: str
    runs: list[str] | None = None
    reference: str | None = None
    set: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(min_length=1)
    tail_fraction: float = Field(0.2, gt=0, le=1)
    pareto: dict[str, str] = Field(default_factory=lambda: {"x": "gpu_cost_usd", "y": "slo_attainment"})
    heatmaps: list[HeatmapSpec] = Field(default_factory=list)
    base: dict[str, Any] = Field(default_factory=dict, exclude=True)  # the scenario file, as read
    source: str | None = None

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for path, values in axes.items():
            if not values:
                raise ValueError(f"axis {path!r} has no values")
        return axes


@dataclass(frozen=True, slots=True)
class Variant:
    """One grid point and one run of it: what a worker needs, as plain data (it is pickled)."""

    index: int
    point: tuple[tuple[str, Any], ...]
    run: str
    scenario: dict[str, Any]
    source: str
    traces: str | None = None
    tail_fraction: float = 0.2


@dataclass(slots=True)
class SweepResult:
    spec: SweepSpec
    rows: list[dict[str, Any]]
    wall_s: float
    workers: int
    engine: str
    files: list[Path] = field(default_factory=list)


# -- the file ---------------------------------------------------------------------------------------


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file and its base scenario; every variant is checked here, so a bad
    value fails before anything runs (with the variant's axis values in the message)."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SweepError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise SweepError(f"{p}: invalid YAML: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise SweepError(f"{p}: expected a mapping at the top level")
    try:
        spec = SweepSpec.model_validate({**raw, "source": str(p)})
    except ValidationError as exc:
        parts = [f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()]
        raise SweepError(f"{p}: {'; '.join(parts)}") from exc
    base_path = (p.parent / spec.scenario).resolve()
    try:
        base = yaml.safe_load(base_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SweepError(f"{p}: scenario: cannot read {base_path}: {exc}") from exc
    if not isinstance(base, Mapping):
        raise SweepError(f"{p}: scenario: {base_path} is not a mapping")
    spec.base = dict(base)
    spec.scenario = str(base_path)
    check_sweep(spec)
    return spec


def check_sweep(spec: SweepSpec) -> None:
    """Validate every variant's scenario, the run names, and the plots' axes and values."""
    where = spec.source or "sweep"
    names: list[str] | None = None
    for point in grid(spec):
        try:
            scenario = parse_scenario(apply_point(spec.base, point, spec.set), source=spec.scenario)
        except (ScenarioError, SweepError) as exc:
            raise SweepError(f"{where}: variant {_label(point)}: {exc}") from exc
        names = [r.name for r in scenario.runs]
    assert names is not None
    for run in [*(spec.runs or []), *([spec.reference] if spec.reference else [])]:
        if run not in names:
            raise SweepError(f"{where}: run {run!r} is not in the scenario (it has {names})")
    for i, hm in enumerate(spec.heatmaps):
        for axis in (hm.x, hm.y):
            if axis not in spec.axes:
                raise SweepError(f"{where}: heatmaps[{i}]: {axis!r} is not an axis ({list(spec.axes)})")
        if hm.value.endswith("_vs_reference") and spec.reference is None:
            raise SweepError(f"{where}: heatmaps[{i}]: {hm.value} needs a reference run")


def grid(spec: SweepSpec) -> Iterator[tuple[tuple[str, Any], ...]]:
    """Every combination of the axes' values, the last axis fastest."""
    paths = list(spec.axes)
    for values in itertools.product(*(spec.axes[p] for p in paths)):
        yield tuple(zip(paths, values, strict=True))


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` (dotted; integers index lists; ``runs.NAME`` is the run named NAME) in ``doc``.

    Missing mapping keys on the way are created; a missing list item or run is an error.
    """
    parts = path.split(".")
    node: Any = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if i > 0 and parts[i - 1] == "runs" and not part.isdigit():
                match = [r for r in node if isinstance(r, dict) and r.get("name") == part]
                if not match:
                    raise SweepError(f"axis {path!r}: no run named {part!r}")
                idx = node.index(match[0])
            elif part.isdigit() and int(part) < len(node):
                idx = int(part)
            else:
                raise SweepError(f"axis {path!r}: {part!r} is not an item of a {len(node)}-item list")
            if last:
                node[idx] = copy.deepcopy(value)
                return
            node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[part] = copy.deepcopy(value)
                return
            if not isinstance(node.get(part), (dict, list)):
                node[part] = {}
            node = node[part]
        else:
            raise SweepError(f"axis {path!r}: cannot go into {type(node).__name__} at {part!r}")


def apply_point(
    base: Mapping[str, Any], point: Sequence[tuple[str, Any]], fixed: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The scenario file of one grid point: ``fixed`` (the sweep's ``set``), then the point's values."""
    doc = copy.deepcopy(dict(base))
    for path, value in [*(fixed or {}).items(), *point]:
        set_path(doc, path, value)
    return doc


def expand(spec: SweepSpec, *, traces: str | Path | None = None) -> list[Variant]:
    """The sweep's variants in grid order (each point's runs in the scenario's order)."""
    out: list[Variant] = []
    for point in grid(spec):
        doc = apply_point(spec.base, point, spec.set)
        names = [r.name for r in parse_scenario(doc, source=spec.scenario).runs]
        wanted = names if spec.runs is None else [n for n in names if n in spec.runs or n == spec.reference]
        for run in wanted:
            out.append(
                Variant(
                    index=len(out),
                    point=point,
                    run=run,
                    scenario=doc,
                    source=spec.scenario,
                    traces=None if traces is None else str(traces),
                    tail_fraction=spec.tail_fraction,
                )
            )
    return out


def _label(point: Sequence[tuple[str, Any]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point)


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


# -- the table --------------------------------------------------------------------------------------


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def write_table(out_dir: Path, result: SweepResult) -> list[Path]:
    """``sweep.csv`` (one row per variant) and ``sweep.json`` (the same rows with the sweep's settings)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = columns(result.rows)
    csv_path = out_dir / "sweep.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=cols)
        writer.writeheader()
        for r in result.rows:
            writer.writerow({k: "" if r.get(k) is None else r.get(k) for k in cols})
    json_path = out_dir / "sweep.json"
    doc = {
        "name": result.spec.name,
        "scenario": result.spec.scenario,
        "axes": result.spec.axes,
        "reference": result.spec.reference,
        "engine": result.engine,
        "workers": result.workers,
        "wall_s": result.wall_s,
        "rows": result.rows,
    }
    json_path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return [csv_path, json_path]


def sweep_table(result: SweepResult) -> Any:
    """A rich table, one row per variant: the axes, the run and the headline figures."""
    from rich.table import Table

    spec = result.spec
    table = Table(
        title=f"sweep {spec.name}: {len(result.rows)} variants, {result.wall_s:.1f} s ({result.engine})"
    )
    heads = [*spec.axes, "run", "goodput rps", "tail goodput", "SLO att.", "TTFT p99 ms", "cost $", "pareto"]
    if spec.reference:
        heads.insert(-1, "tail vs ref")
    for h in heads:
        table.add_column(h, justify="left" if h in spec.axes or h == "run" else "right")

    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in result.rows:
        cells = [str(r.get(a)) for a in spec.axes] + [
            str(r["run"]),
            num(r.get("goodput_rps"), ".2f"),
            num(r.get("tail_goodput_rps"), ".2f"),
            num(None if r.get("slo_attainment") is None else r["slo_attainment"] * 100, ".1f") + "%",
            num(None if r.get("ttft_p99_s") is None else r["ttft_p99_s"] * 1000, ".0f"),
            num(r.get("gpu_cost_usd"), ".2f"),
        ]
        if spec.reference:
            v = r.get("tail_goodput_vs_reference")
            cells.append("-" if v is None else f"{v * 100:.0f}%")
        cells.append("*" if r.get("pareto") else "")
        table.add_row(*cells)
    return table
