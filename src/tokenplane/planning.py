"""Capacity planning for agentic demand: the cheapest fleet that meets the SLOs (``tokenplane plan``).

Demand is users x calls per user x tokens per call (the talk's two multiplying factors):

    request rate           = users x calls_per_user_per_hour / 3600            [calls/s]
    required token rate    = request rate x (mean prompt + mean output tokens)  [tokens/s]
    task rate              = request rate / steps_per_task                      [tasks/s]

e.g. 1,000 users x 12 calls/h x (1,500 + 300) tokens = 3.33 calls/s = 6,000 tokens/s.

Search, per GPU type of the catalogue (each a few dozen small twin runs, well under a second each):

1. **Per-instance capacity**: the highest Poisson rate of this workload that one instance serves
   with every request completed and at least ``slo.attainment`` of them within the TTFT and TBT
   SLOs. Found by doubling from a small rate until a run fails, then bisecting
   (``search.bisect_steps`` times). Each probe runs ``max(probe_duration_s, min_probe_requests /
   rate)`` virtual seconds.
2. **Closed-form fleet size**: ``ceil(request rate / per-instance capacity)``.
3. **Verification with the twin**: the whole demand on fleets from two below to
   ``search.max_extra_instances`` above that size (a fleet multiplexes better than one instance, so
   fewer may do; routing imbalance may need more). The smallest fleet meeting the SLOs is this GPU
   type's answer; the cheapest answer per hour over all GPU types wins (ties: more headroom).

Outputs: GPU type, count, cost per hour, headroom (how much more demand the chosen fleet still
serves within the SLOs, bisected with the twin up to 4x the demand: 0.25 = 25 % more), cost per
successful task, and ``plan.png``, cost per hour against fleet size for every GPU
type (filled markers meet the SLOs). A task succeeds when all of its steps meet the SLO; with the
twin's per-request attainment ``p`` the task success rate is estimated as ``p ** steps_per_task``
(steps taken as independent), and cost per successful task = cost per hour / (tasks per hour x
task success rate).

Limits (conservative on purpose): calls are independent Poisson arrivals without shared prefixes,
so prefix-cache reuse between the steps of a task, which lowers prefill work, is not credited; the
engine is the twin's calibrated vLLM model, not a measurement of your deployment.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenplane.core.economics import cost_per_million_tokens, cost_per_successful_task
from tokenplane.sim.catalog import Catalog, UnknownHardware, kv_capacity_tokens
from tokenplane.sim.report import Slo
from tokenplane.sim.runner import simulate
from tokenplane.sim.scenario import FleetSettings, RunSettings, SloSettings
from tokenplane.sim.workloads.dists import LengthDist
from tokenplane.sim.workloads.factory import LengthDistConfig
from tokenplane.sim.workloads.synthetic import SyntheticWorkload

__all__ = [
    "GpuOption",
    "GpuPlan",
    "PlanError",
    "PlanResult",
    "PlanSpec",
    "load_plan_spec",
    "parse_plan_spec",
    "plan",
    "required_token_throughput",
]

PLOT_FILE = "plan.png"
RESULT_FILE = "plan.json"
DEFAULT_GPUS = ("h100", "a100", "l40s")
START_RATE_RPS = 0.25
MIN_RATE_RPS = 1 / 256
MAX_RATE_RPS = 10_000.0
HEADROOM_SEARCH_MAX = 4.0
"""Headroom is searched up to this multiple of the demand (reported as at least 300 %)."""


class PlanError(ValueError):
    """A plan spec that cannot be read or validated, or a plan with no feasible GPU type."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuOption(_Strict):
    gpu: str
    price_per_hour: float | None = Field(None, ge=0)
    """Per GPU; ``None``: the catalogue's price."""


class PlanSlo(_Strict):
    ttft_s: float = Field(2.0, gt=0)
    tbt_s: float = Field(0.1, gt=0)
    attainment: float = Field(0.95, gt=0, le=1)
    """Fraction of calls that must meet both latency limits."""


class SearchSettings(_Strict):
    probe_duration_s: float = Field(300.0, gt=0)
    min_probe_requests: int = Field(300, ge=10)
    verify_duration_s: float = Field(300.0, gt=0)
    min_verify_requests: int = Field(600, ge=10)
    bisect_steps: int = Field(7, ge=1, le=20)
    max_extra_instances: int = Field(3, ge=0, le=20)
    seed: int = 0


class PlanSpec(_Strict):
    """What ``tokenplane plan SPEC.yaml`` reads (see ``examples/plan.yaml``).

    Token lengths: a bare number is a fixed length; a mapping is a ``LengthDist`` config
    (``{kind: lognormal, mean: 1500, cv: 0.5}``), as in scenario workloads.
    """

    name: str = "plan"
    model: str = "llama-3-8b"
    users: int = Field(gt=0)
    calls_per_user_per_hour: float = Field(gt=0)
    steps_per_task: int = Field(1, ge=1)
    prompt_tokens: float | LengthDistConfig
    output_tokens: float | LengthDistConfig
    slo: PlanSlo = Field(default_factory=lambda: PlanSlo())
    gpus: list[GpuOption] = Field(default_factory=lambda: [GpuOption(gpu=g) for g in DEFAULT_GPUS])
    tp: int = Field(1, ge=1)
    router: Any = "least-tokens"
    search: SearchSettings = Field(default_factory=lambda: SearchSettings())

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_names(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"gpu": g} if isinstance(g, str) else g for g in v]
        return v

    @field_validator("gpus")
    @classmethod
    def _non_empty(cls, v: list[GpuOption]) -> list[GpuOption]:
        if not v:
            raise ValueError("list at least one GPU type")
        return v

    def prompt_dist(self) -> LengthDist:
        return _dist(self.prompt_tokens)

    def output_dist(self) -> LengthDist:
        return _dist(self.output_tokens)

    @property
    def request_rate_rps(self) -> float:
        return self.users * self.calls_per_user_per_hour / 3600.0

    @property
    def mean_tokens_per_call(self) -> float:
        return self.prompt_dist().mean_value() + self.output_dist().mean_value()


def _dist(spec: float | LengthDistConfig) -> LengthDist:
    return spec.build() if isinstance(spec, LengthDistConfig) else LengthDist.fixed(float(spec))


def required_token_throughput(
    users: int, calls_per_user_per_hour: float, prompt_tokens: float, output_tokens: float
) -> float:
    """Tokens per second the fleet must process: users x calls/user/h / 3600 x tokens per call."""
    return users * calls_per_user_per_hour / 3600.0 * (prompt_tokens + output_tokens)


@dataclass(frozen=True, slots=True)
class FleetPoint:
    """One verified fleet size."""

    instances: int
    cost_per_hour: float
    slo_attainment: float
    all_completed: bool
    meets_slo: bool


@dataclass(slots=True)
class GpuPlan:
    """What the search found for one GPU type."""

    gpu: str
    price_per_hour: float
    """Per instance (GPU price x tp)."""
    capacity_rps: float | None = None
    capacity_tokens_per_s: float | None = None
    closed_form_instances: int | None = None
    points: list[FleetPoint] = field(default_factory=list)
    chosen: FleetPoint | None = None
    note: str = ""


@dataclass(slots=True)
class PlanResult:
    """The chosen fleet and how it was found; :meth:`as_dict` is what ``plan --json`` prints."""

    name: str
    model: str
    request_rate_rps: float
    required_tokens_per_s: float
    tasks_per_hour: float
    gpu_type: str | None
    gpus: int | None
    cost_per_hour: float | None
    headroom: float | None
    slo_attainment: float | None
    task_success_rate: float | None
    cost_per_successful_task: float | None
    cost_per_million_tokens: float | None
    per_gpu: list[GpuPlan]
    plot: Path | None
    wall_seconds: float

    @property
    def feasible(self) -> bool:
        return self.gpu_type is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "gpu_type": self.gpu_type,
            "gpus": self.gpus,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_successful_task": self.cost_per_successful_task,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "headroom": self.headroom,
            "slo_attainment": self.slo_attainment,
            "task_success_rate": self.task_success_rate,
            "request_rate_rps": self.request_rate_rps,
            "required_tokens_per_s": self.required_tokens_per_s,
            "tasks_per_hour": self.tasks_per_hour,
            "candidates": [
                {
                    "gpu_type": g.gpu,
                    "price_per_hour": g.price_per_hour,
                    "capacity_rps": g.capacity_rps,
                    "capacity_tokens_per_s": g.capacity_tokens_per_s,
                    "closed_form_instances": g.closed_form_instances,
                    "chosen_instances": g.chosen.instances if g.chosen else None,
                    "note": g.note,
                    "fleet_sizes": [
                        {
                            "instances": p.instances,
                            "cost_per_hour": p.cost_per_hour,
                            "slo_attainment": p.slo_attainment,
                            "meets_slo": p.meets_slo,
                        }
                        for p in g.points
                    ],
                }
                for g in self.per_gpu
            ],
            "plot": str(self.plot) if self.plot else None,
            "wall_seconds": self.wall_seconds,
        }

    def summary(self) -> str:
        """One human line, e.g. for the CLI."""
        if not self.feasible:
            return f"{self.name}: no GPU type in the catalogue meets the SLOs at this demand"
        return (
            f"{self.name}: {self.gpus} x {self.gpu_type} at ${self.cost_per_hour:.2f}/h for "
            f"{self.required_tokens_per_s:,.0f} tokens/s ({self.request_rate_rps:.2f} calls/s); "
            f"headroom {self.headroom:.0%}; cost per successful task ${self.cost_per_successful_task:.4f}"
        )


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


def _plot(result: PlanResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for g in result.per_gpu:
        if not g.points:
            continue
        xs = [p.instances for p in g.points]
        ys = [p.cost_per_hour for p in g.points]
        (line,) = ax.plot(xs, ys, "-", label=f"{g.gpu} (${g.price_per_hour:.2f}/h each)")
        for p in g.points:
            ax.plot(
                p.instances,
                p.cost_per_hour,
                "o",
                color=line.get_color(),
                markerfacecolor=line.get_color() if p.meets_slo else "none",
            )
    if result.gpus is not None and result.cost_per_hour is not None:
        ax.plot(result.gpus, result.cost_per_hour, "*", color="black", markersize=16, label="chosen")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("fleet size (instances)")
    ax.set_ylabel("cost ($/h)")
    ax.set_title(f"{result.name}: {result.required_tokens_per_s:,.0f} tokens/s; filled = meets SLOs")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    """Search GPU types and fleet sizes (see the module docstring); writes the plot to ``out_dir``."""
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
        result.plot = _plot(result, out / PLOT_FILE)
    result.wall_seconds = time.perf_counter() - started
    if out_dir is not None:
        (Path(out_dir) / RESULT_FILE).write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return result


def parse_plan_spec(raw: Any, *, source: str = "plan") -> PlanSpec:
    if not isinstance(raw, Mapping):
        raise PlanError(f"{source}: expected a mapping at the top level")
    try:
        return PlanSpec.model_validate(raw)
    except ValidationError as exc:
        parts = [f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()]
        raise PlanError(f"{source}: {'; '.join(parts)}") from exc


def load_plan_spec(path: str | Path) -> PlanSpec:
    """Read and validate a plan YAML; errors name the file and the field."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise PlanError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise PlanError(f"{p}: invalid YAML: {exc}") from exc
    return parse_plan_spec(raw, source=str(p))
