"""The search (:func:`plan`): per GPU type, one instance's capacity by doubling and bisecting the
rate, the closed-form fleet size, then fleets around it verified with the twin; the cheapest wins.
The steps, the outputs and the limits are in :mod:`tokenplane.planning`'s docstring."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from tokenplane.core.economics import cost_per_million_tokens, cost_per_successful_task
from tokenplane.planning.result import FleetPoint, GpuPlan, PlanResult, plot_costs
from tokenplane.planning.spec import GpuOption, PlanError, PlanSpec, required_token_throughput
from tokenplane.sim.catalog import Catalog, UnknownHardware, kv_capacity_tokens
from tokenplane.sim.report import Slo
from tokenplane.sim.runner import simulate
from tokenplane.sim.scenario import FleetSettings, RunSettings, SloSettings
from tokenplane.sim.workloads.synthetic import SyntheticWorkload

PLOT_FILE = "plan.png"
RESULT_FILE = "plan.json"
START_RATE_RPS = 0.25
MIN_RATE_RPS = 1 / 256
MAX_RATE_RPS = 10_000.0
HEADROOM_SEARCH_MAX = 4.0
"""Headroom is searched up to this multiple of the demand (reported as at least 300 %)."""


# -- the twin runs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Probe:
    attainment: float
    all_completed: bool

    def meets(self, target: float) -> bool:
        return self.all_completed and self.attainment >= target


def _run(
    spec: PlanSpec,
    opt: GpuOption,
    *,
    instances: int,
    rate: float,
    duration: float,
    seed: int,
    catalog: Catalog,
) -> _Probe:
    workload = SyntheticWorkload(
        rate_rps=rate,
        duration_s=duration,
        prompt=spec.prompt_dist(),
        output=spec.output_dist(),
        seed=seed,
        model=spec.model,
    )
    run = RunSettings(
        name="plan",
        seed=seed,
        router=spec.router,
        fleet=FleetSettings(
            instances=instances, gpu=opt.gpu, model=spec.model, tp=spec.tp, price_per_hour=opt.price_per_hour
        ),
        workload={},
        slo=SloSettings(ttft_s=spec.slo.ttft_s, tbt_s=spec.slo.tbt_s),
    )
    result = simulate(run, catalog=catalog, workload=workload)
    records = result.records
    if not records:
        return _Probe(1.0, True)
    slo = Slo(ttft_s=spec.slo.ttft_s, tbt_s=spec.slo.tbt_s)
    met = sum(1 for r in records if slo.met(r))
    return _Probe(met / len(records), all(r.ok for r in records))


def _capacity(spec: PlanSpec, opt: GpuOption, catalog: Catalog) -> float | None:
    """Highest rate one instance serves within the SLOs, or ``None`` if not even a trickle."""
    s = spec.search
    target = spec.slo.attainment

    def ok(rate: float) -> bool:
        duration = max(s.probe_duration_s, s.min_probe_requests / rate)
        return _run(spec, opt, instances=1, rate=rate, duration=duration, seed=s.seed, catalog=catalog).meets(
            target
        )

    lo, hi = 0.0, START_RATE_RPS
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_RATE_RPS:
            return lo
    if lo == 0.0:
        # Even the start rate fails: look lower before giving up.
        rate = hi / 2
        while rate >= MIN_RATE_RPS and not ok(rate):
            rate /= 2
        if rate < MIN_RATE_RPS:
            return None
        lo, hi = rate, rate * 2
    for _ in range(s.bisect_steps):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _plan_gpu(spec: PlanSpec, opt: GpuOption, catalog: Catalog) -> GpuPlan:
    try:
        gpu = catalog.gpu(opt.gpu)
        model = catalog.model(spec.model)
    except UnknownHardware as exc:
        raise PlanError(str(exc)) from exc
    price = (opt.price_per_hour if opt.price_per_hour is not None else gpu.price_per_hour) * spec.tp
    out = GpuPlan(gpu=gpu.name, price_per_hour=price)
    if kv_capacity_tokens(gpu, model, spec.tp) <= 0:
        out.note = f"{model.name} does not fit on {spec.tp} x {gpu.name}"
        return out
    capacity = _capacity(spec, opt, catalog)
    if capacity is None:
        out.note = "one instance misses the SLOs even at a trickle of requests"
        return out
    out.capacity_rps = capacity
    out.capacity_tokens_per_s = capacity * spec.mean_tokens_per_call
    demand = spec.request_rate_rps
    n0 = max(1, math.ceil(demand / capacity))
    out.closed_form_instances = n0
    s = spec.search
    duration = max(s.verify_duration_s, s.min_verify_requests / demand)
    for n in range(max(1, n0 - 2), n0 + s.max_extra_instances + 1):
        probe = _run(spec, opt, instances=n, rate=demand, duration=duration, seed=s.seed + 1, catalog=catalog)
        meets = probe.meets(spec.slo.attainment)
        point = FleetPoint(n, n * price, probe.attainment, probe.all_completed, meets)
        out.points.append(point)
        if out.chosen is not None:
            break  # one size above the answer shows where the curve goes
        if meets:
            out.chosen = point
    if out.chosen is None:
        out.note = f"no fleet of up to {n0 + s.max_extra_instances} instances met the SLOs"
    return out


def _fleet_headroom(spec: PlanSpec, gpu: str, instances: int, catalog: Catalog) -> float:
    """How much more demand the chosen fleet meets its SLOs at: bisect the rate over [1, 4] x demand."""
    s = spec.search
    demand = spec.request_rate_rps
    opt = next(o for o in spec.gpus if catalog.gpu(o.gpu).name == gpu)

    def ok(factor: float) -> bool:
        rate = demand * factor
        duration = max(s.verify_duration_s, s.min_verify_requests / rate)
        probe = _run(
            spec,
            opt,
            instances=instances,
            rate=rate,
            duration=duration,
            seed=s.seed + 1,
            catalog=catalog,
        )
        return probe.meets(spec.slo.attainment)

    lo, hi = 1.0, HEADROOM_SEARCH_MAX
    if ok(hi):
        return hi - 1.0
    for _ in range(s.bisect_steps):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo - 1.0


def _rank(g: GpuPlan) -> tuple[float, float]:
    """Cheapest per hour first; among equals, the most capacity (headroom)."""
    if g.chosen is None or g.capacity_rps is None:
        return (math.inf, 0.0)
    return (g.chosen.cost_per_hour, -g.capacity_rps * g.chosen.instances)


def plan(spec: PlanSpec, *, catalog: Catalog | None = None, out_dir: str | Path | None = None) -> PlanResult:
    """Search GPU types and fleet sizes (see :mod:`tokenplane.planning`); writes the plot to ``out_dir``."""
    started = time.perf_counter()
    catalog = catalog or Catalog.default()
    per_gpu = [_plan_gpu(spec, opt, catalog) for opt in spec.gpus]
    best = min((g for g in per_gpu if g.chosen is not None), key=_rank, default=None)
    demand = spec.request_rate_rps
    tokens_per_s = required_token_throughput(
        spec.users,
        spec.calls_per_user_per_hour,
        spec.prompt_dist().mean_value(),
        spec.output_dist().mean_value(),
    )
    tasks_per_hour = demand * 3600.0 / spec.steps_per_task
    result = PlanResult(
        name=spec.name,
        model=spec.model,
        request_rate_rps=demand,
        required_tokens_per_s=tokens_per_s,
        tasks_per_hour=tasks_per_hour,
        gpu_type=None,
        gpus=None,
        cost_per_hour=None,
        headroom=None,
        slo_attainment=None,
        task_success_rate=None,
        cost_per_successful_task=None,
        cost_per_million_tokens=None,
        per_gpu=per_gpu,
        plot=None,
        wall_seconds=0.0,
    )
    if best is not None and best.chosen is not None and best.capacity_rps is not None:
        chosen = best.chosen
        success = chosen.slo_attainment**spec.steps_per_task
        result.gpu_type = best.gpu
        result.gpus = chosen.instances
        result.cost_per_hour = chosen.cost_per_hour
        result.headroom = _fleet_headroom(spec, best.gpu, chosen.instances, catalog)
        result.slo_attainment = chosen.slo_attainment
        result.task_success_rate = success
        result.cost_per_successful_task = cost_per_successful_task(
            chosen.cost_per_hour, tasks_per_hour * success
        )
        result.cost_per_million_tokens = cost_per_million_tokens(
            chosen.cost_per_hour, round(tokens_per_s * 3600)
        )
    if out_dir is not None:
        out = Path(out_dir)
        result.plot = plot_costs(result, out / PLOT_FILE)
    result.wall_seconds = time.perf_counter() - started
    if out_dir is not None:
        (Path(out_dir) / RESULT_FILE).write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return result
