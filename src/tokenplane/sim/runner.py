"""Run a scenario: build each run's fleet, router and workload, simulate, and report."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tokenplane.core.economics import TokenCosts
from tokenplane.core.routing import build_router
from tokenplane.sim.autoscaling import (
    AutoscalingShell,
    autoscale_report,
    build_scaler_and_pool,
    group_price,
    group_timings,
    initial_states,
)
from tokenplane.sim.catalog import Catalog, kv_capacity_tokens
from tokenplane.sim.economics_report import build_economics, engine_token_costs
from tokenplane.sim.engine import ContinuousEngine, EngineConfig
from tokenplane.sim.fleet import Engine, Fleet, FleetContext, FleetResult
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.lifecycle import Lifecycle, Timings
from tokenplane.sim.perf_model import StepTimeModel
from tokenplane.sim.records import InstanceRecord, RecordStream, TbtHistogram
from tokenplane.sim.report import RunAggregate, Slo, build_run_report
from tokenplane.sim.resilience import ResilientDispatch
from tokenplane.sim.scenario import FleetGroup, FleetSettings, RunSettings, Scenario
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


def engine_config(fleet: FleetSettings | FleetGroup, catalog: Catalog) -> EngineConfig:
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
        reserve_full_prompt=e.reserve_full_prompt,
        max_model_len=e.max_model_len,
        static_batch_size=e.static_batch_size,
        max_adapters=e.lora.max_adapters if e.lora is not None else 0,
        adapter_load_s=e.lora.load_s if e.lora is not None else 0.0,
    )


def simulate(
    run: RunSettings,
    *,
    catalog: Catalog,
    workload: Workload,
    progress: ProgressFn | None = None,
    aggregate: RunAggregate | None = None,
    records_out: IO[bytes] | None = None,
) -> FleetResult:
    """Simulate one run of a fleet on ``workload``; deterministic for a given seed.

    With ``aggregate`` the run streams its request records (memory bounded by the requests in
    flight, for runs of millions): each done record goes into ``aggregate`` and, with
    ``records_out``, to that file as a JSON line, and the result keeps none (``records`` is
    empty). What needs every record at the end is then left out: the per-request cost attribution
    (``economics``) and per-request budgets; the autoscaler, which reads records as it goes, is
    refused.
    """
    fleet_cfg = run.fleet
    groups = fleet_cfg.resolved_groups()
    loop = EventLoop()
    tbt = TbtHistogram()
    engines: list[Engine] = []
    timings: list[Timings] = []
    prices: dict[str, TokenCosts] = {}
    roles: dict[str, str] = {}  # instance id -> prefill, decode or mixed (disaggregation)
    kv_bytes: dict[str, float] = {}
    block_size = 16
    for group in groups:
        gpu = catalog.gpu(group.gpu)
        model = catalog.model(group.model)
        steps = StepTimeModel(gpu, model, group.tp, expert_parallel=group.expert_parallel)
        cfg = engine_config(group, catalog)
        block_size = cfg.block_size
        price = group_price(group, catalog)
        engine_cls = StaticEngine if group.engine.kind == "static" else ContinuousEngine
        # The single form keeps its historical ids (``h100-0``); groups are ``<name>-<i>``.
        prefix = group.name if fleet_cfg.grouped else gpu.name.lower()
        timing = group_timings(group, catalog)
        costs = engine_token_costs(
            steps, price, max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs
        )
        for i in range(group.instances):
            iid = f"{prefix}-{i}"
            prices[iid] = costs
            roles[iid] = group.role
            kv_bytes[iid] = model.kv_bytes_per_token
            engines.append(
                engine_cls(
                    iid,
                    cfg,
                    steps,
                    schedule=loop.schedule,
                    schedule_late=loop.schedule_late,
                    record=InstanceRecord(iid, gpu.name, model.name, price),
                    tbt=tbt,
                    kv_bytes_per_token=int(model.kv_bytes_per_token),
                )
            )
            timings.append(timing)
    if len({e.id for e in engines}) != len(engines):
        raise ValueError("instance ids must be unique across groups")
    ctx = FleetContext(
        loop=loop,
        engines=engines,
        router=build_router(run.router, random.Random(run.seed)),
        workload=workload,
        model=catalog.model(groups[0].model).name,
        block_size=block_size,
        tbt=tbt,
        sample_interval_s=run.sample_interval_s,
        precise_kv=run.routing.precise_kv,
        request_path_s=run.request_path.first_chunk_s,
    )
    fleet = build_fleet(run, ctx, prices, roles=roles, kv_bytes=kv_bytes)
    stream: RecordStream | None = None
    if aggregate is not None:
        if run.autoscaler is not None:
            raise ValueError("a run that streams its records cannot have an autoscaler")
        stream = RecordStream(aggregate.add_all, file=records_out)
        fleet.records = stream  # type: ignore[assignment]  # the fleet only appends to it

    lifecycle: Lifecycle | None = None
    shell: AutoscalingShell | None = None
    if run.autoscaler is not None or any(g.state == "cold" for g in groups):
        continuous = [e for e in engines if isinstance(e, ContinuousEngine)]
        if len(continuous) != len(engines):
            raise ValueError("autoscaling and cold instances need the continuous engine")
        if run.autoscaler is None:
            lifecycle = Lifecycle(loop, continuous, timings, initial_states(run, None), land_to_warm=False)
        else:
            scaler, spec = build_scaler_and_pool(run, catalog)
            lifecycle = Lifecycle(loop, continuous, timings, initial_states(run, spec), land_to_warm=True)
            shell = AutoscalingShell(
                loop=loop,
                engines=continuous,
                records=fleet.records,
                lifecycle=lifecycle,
                scaler=scaler,
                spec=spec,
                settings=run.autoscaler,
                ttft_slo_s=run.slo.ttft_s,
                tbt_slo_s=run.slo.tbt_s,
                active=lambda: fleet.has_work,
            )
            lifecycle.on_landed = shell.on_landed
            fleet.after_finish = shell.on_finish
            shell.start()
        lifecycle.on_stopped = ctx.router.forget  # a stopped instance left the fleet
        # the views were built before the lifecycle set each instance's state
        fleet.views = [e.view() for e in engines]

    result = fleet.run(until=run.duration_s, on_progress=progress)
    if stream is not None:
        stream.close()
        result.records = []
    if lifecycle is not None:
        for i, e in enumerate(engines):
            e.record.alive_s = lifecycle.held_s(i, result.duration_s)
    result.extra = fleet.report_extra()
    if shell is not None:
        result.extra = {**result.extra, **shell.report_extra()}
    if stream is not None:
        result.extra = {**result.extra, "records": "streamed"}
    else:
        if fleet.budgets:
            result.extra = {**result.extra, **budget_goodput(result, fleet.budgets, run)}
        result.extra = {
            **result.extra,
            **build_economics(
                result.records, result.instances, prices=prices, workflows=fleet.workflows, usage=fleet.usage
            ),
        }
    if lifecycle is not None:
        result.lifecycle = lifecycle
    return result


def build_fleet(
    run: RunSettings,
    ctx: FleetContext,
    prices: dict[str, TokenCosts],
    *,
    roles: dict[str, str] | None = None,
    kv_bytes: dict[str, float] | None = None,
) -> Fleet:
    """The fleet with the request path a run's settings ask for: the bare path, the disaggregated
    one (prefill and decode pools, ``disaggregation``), or clients, faults and the control plane
    (with an admission gate when the run has ``admission``)."""
    if run.disaggregation is not None:
        if run.admission is not None or run.clients is not None or run.controls is not None:
            raise ValueError("disaggregation does not combine with admission, clients or controls yet")
        from tokenplane.sim.disagg_dispatch import DisaggDispatch

        return Fleet(ctx, DisaggDispatch(run.disaggregation, roles or {}, kv_bytes or {}, run.faults))
    if run.admission is None and not run.resilient:
        return Fleet(ctx)
    gate = None
    if run.admission is not None:
        from tokenplane.sim.admission_shell import AdmissionGate

        gate = AdmissionGate(run.admission, prices)
    path = ResilientDispatch(
        clients=run.clients, controls=run.controls, faults=run.faults, seed=run.seed, gate=gate
    )
    return Fleet(ctx, path)


def budget_goodput(result: FleetResult, budgets: dict[int, float], run: RunSettings) -> dict[str, Any]:
    """Goodput against each request's own TTFT budget (the run's SLO TTFT for those without one)."""
    met = 0
    by_budget: dict[str, list[int]] = {}
    for r in result.records:
        budget = budgets.get(r.request_id, run.slo.ttft_s)
        ok = r.ok and r.first_token_s is not None and r.first_token_s - r.arrival_s <= budget
        if ok:
            tpot = r.tpot_s
            ok = tpot is None or tpot <= run.slo.tbt_s
        met += ok
        acc = by_budget.setdefault(f"{budget:g}", [0, 0])
        acc[0] += ok
        acc[1] += 1
    d = result.duration_s
    return {
        "budget_goodput_rps": met / d if d > 0 else None,
        "budget_attainment": met / len(result.records) if result.records else None,
        "budget_attainment_by_budget_s": {k: v[0] / v[1] for k, v in sorted(by_budget.items())},
    }


def run_scenario(
    scenario: Scenario,
    *,
    traces: str | Path | None = None,
    progress: Callable[[str], ProgressFn | None] | None = None,
    catalog: Catalog | None = None,
    stream_records: bool = False,
    records_file: Callable[[str], Path] | None = None,
) -> dict[str, RunOutcome]:
    """Simulate each run and build its report. ``catalog`` (default: the built-in one) is the base
    that the scenario's own ``catalog:`` section is merged into; ``stream_records`` streams the
    records (see :func:`simulate`), each run's to the file ``records_file(run_name)`` when given."""
    catalog = catalog or Catalog.default()
    if scenario.catalog:
        catalog = catalog.with_overrides(scenario.catalog)
    folder = traces_dir(traces or scenario.traces)
    outcomes: dict[str, RunOutcome] = {}
    for run in scenario.runs:
        workload = build_workload(run.workload, traces=folder, seed=run.seed)
        slo = Slo(ttft_s=run.slo.ttft_s, tbt_s=run.slo.tbt_s)
        agg = RunAggregate(slo)
        started = time.perf_counter()
        if stream_records:
            with contextlib.ExitStack() as files:
                out = None if records_file is None else files.enter_context(records_file(run.name).open("wb"))
                result = simulate(
                    run,
                    catalog=catalog,
                    workload=workload,
                    progress=progress(run.name) if progress else None,
                    aggregate=agg,
                    records_out=out,
                )
        else:
            result = simulate(
                run, catalog=catalog, workload=workload, progress=progress(run.name) if progress else None
            )
        wall = time.perf_counter() - started
        if not stream_records:
            agg.add_all(result.records)
        bucket = max(1.0, result.duration_s / 100)
        extra: dict[str, Any] = {
            "router": run.router,
            "instances": run.fleet.instances,
            "gpu": run.fleet.gpu,
            "model": run.fleet.model,
            "engine": run.fleet.engine.kind,
            "seed": run.seed,
            "goodput_timeline": [list(p) for p in agg.goodput_timeline(bucket_s=bucket)],
        }
        if run.fleet.groups is not None:
            groups = run.fleet.groups
            extra["gpu"] = "+".join(dict.fromkeys(g.gpu for g in groups))
            extra["model"] = "+".join(dict.fromkeys(g.model for g in groups))
            extra["groups"] = [
                {
                    "name": g.name,
                    "instances": g.instances,
                    "gpu": g.gpu,
                    "model": g.model,
                    "tp": g.tp,
                    "state": g.state,
                    "price_per_hour": group_price(g, catalog),
                    "cold_start_s": group_timings(g, catalog).cold_start_s,
                }
                for g in groups
            ]
        report = build_run_report(
            result.records,
            result.instances,
            result.tbt,
            duration_s=result.duration_s,
            wall_seconds=wall,
            slo=slo,
            extra={**extra, **result.extra},
            aggregate=agg,
        )
        if run.autoscaler is not None:
            report.update(autoscale_report(result, report, slo, bucket_s=bucket))
        outcomes[run.name] = RunOutcome(run, result, report)
    return outcomes
