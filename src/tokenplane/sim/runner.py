"""Run a scenario: build each run's fleet, router and workload, simulate, and report."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenplane.core.routing import build_router
from tokenplane.sim.catalog import Catalog, kv_capacity_tokens
from tokenplane.sim.engine import ContinuousEngine, EngineConfig, Seq
from tokenplane.sim.fleet import Engine, Fleet, FleetResult
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.perf_model import StepTimeModel
from tokenplane.sim.records import InstanceRecord, TbtHistogram
from tokenplane.sim.report import Slo, build_run_report, goodput_timeline
from tokenplane.sim.resilience import CoreControls, ResilientFleet
from tokenplane.sim.scenario import FleetSettings, RunSettings, Scenario
from tokenplane.sim.static_engine import StaticEngine
from tokenplane.sim.workloads.base import Workload
from tokenplane.sim.workloads.factory import build_workload
from tokenplane.sim.workloads.traces import traces_dir

ProgressFn = Callable[[float], None]


@dataclass(slots=True)
class RunOutcome:
    settings: RunSettings
    result: FleetResult
    report: dict[str, Any]


def engine_config(fleet: FleetSettings, catalog: Catalog) -> EngineConfig:
    e = fleet.engine
    kv_tokens = e.kv_capacity_tokens
    if kv_tokens is None:
        kv_tokens = kv_capacity_tokens(
            catalog.gpu(fleet.gpu), catalog.model(fleet.model), fleet.tp, e.gpu_memory_utilization
        )
        if kv_tokens <= 0:
            raise ValueError(f"{fleet.model} does not fit on {fleet.tp} x {fleet.gpu}")
    return EngineConfig(
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        block_size=e.block_size,
        kv_capacity_tokens=kv_tokens,
        enable_prefix_caching=e.enable_prefix_caching,
        max_model_len=e.max_model_len,
        static_batch_size=e.static_batch_size,
    )


def simulate(
    run: RunSettings,
    *,
    catalog: Catalog,
    workload: Workload,
    progress: ProgressFn | None = None,
) -> FleetResult:
    """Simulate one run of a fleet on ``workload``; deterministic for a given seed."""
    fleet_cfg = run.fleet
    gpu = catalog.gpu(fleet_cfg.gpu)
    model = catalog.model(fleet_cfg.model)
    steps = StepTimeModel(gpu, model, fleet_cfg.tp)
    cfg = engine_config(fleet_cfg, catalog)
    price = fleet_cfg.price_per_hour if fleet_cfg.price_per_hour is not None else gpu.price_per_hour
    price *= fleet_cfg.tp
    loop = EventLoop()
    tbt = TbtHistogram()
    holder: list[Fleet] = []

    def on_finish(seq: Seq, now: float) -> None:
        holder[0].on_finish(seq, now)

    engine_cls = StaticEngine if fleet_cfg.engine.kind == "static" else ContinuousEngine
    engines: list[Engine] = [
        engine_cls(
            f"{gpu.name.lower()}-{i}",
            cfg,
            steps,
            schedule=loop.schedule,
            schedule_late=loop.schedule_late,
            on_finish=on_finish,
            record=InstanceRecord(f"{gpu.name.lower()}-{i}", gpu.name, model.name, price),
            tbt=tbt,
        )
        for i in range(fleet_cfg.instances)
    ]
    router = build_router(run.router, random.Random(run.seed))
    common: dict[str, Any] = {
        "loop": loop,
        "engines": engines,
        "router": router,
        "workload": workload,
        "model": model.name,
        "block_size": cfg.block_size,
        "tbt": tbt,
        "sample_interval_s": run.sample_interval_s,
    }
    fleet: Fleet
    if run.resilient:
        fleet = ResilientFleet(
            **common, clients=run.clients, controls=run.controls, faults=run.faults, seed=run.seed
        )
    else:
        fleet = Fleet(**common)
    holder.append(fleet)
    result = fleet.run(until=run.duration_s, on_progress=progress)
    if isinstance(fleet, ResilientFleet):
        events = fleet.hooks.events if isinstance(fleet.hooks, CoreControls) else {}
        result.extra = {
            **fleet.counters,
            **events,
            "resume_gap_p50_s": _median(fleet.resume_gaps),
            "resume_gap_max_s": max(fleet.resume_gaps) if fleet.resume_gaps else None,
        }
    return result


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[len(s) // 2]


def run_scenario(
    scenario: Scenario,
    *,
    traces: str | Path | None = None,
    progress: Callable[[str], ProgressFn | None] | None = None,
) -> dict[str, RunOutcome]:
    catalog = Catalog.default()
    if scenario.catalog:
        catalog = catalog.with_overrides(scenario.catalog)
    folder = traces_dir(traces or scenario.traces)
    outcomes: dict[str, RunOutcome] = {}
    for run in scenario.runs:
        workload = build_workload(run.workload, traces=folder, seed=run.seed)
        started = time.perf_counter()
        result = simulate(
            run, catalog=catalog, workload=workload, progress=progress(run.name) if progress else None
        )
        wall = time.perf_counter() - started
        slo = Slo(ttft_s=run.slo.ttft_s, tbt_s=run.slo.tbt_s)
        bucket = max(1.0, result.duration_s / 100)
        report = build_run_report(
            result.records,
            result.instances,
            result.tbt,
            duration_s=result.duration_s,
            wall_seconds=wall,
            slo=slo,
            extra={
                "router": run.router,
                "instances": run.fleet.instances,
                "gpu": run.fleet.gpu,
                "model": run.fleet.model,
                "engine": run.fleet.engine.kind,
                "seed": run.seed,
                "goodput_timeline": [list(p) for p in goodput_timeline(result.records, slo, bucket_s=bucket)],
                **result.extra,
            },
        )
        outcomes[run.name] = RunOutcome(run, result, report)
    return outcomes
