"""Scenario files: one fleet, one workload, several runs that differ in what they override.

A scenario is YAML validated once into typed objects; an unknown key or a bad value fails at load
with the path of the field. Each run deep-merges its overrides (``router``, ``fleet``,
``workload``, ``seed``) onto the base (:func:`~tokenplane.sim.overrides.deep_merge`), so comparing
policies means listing them. The fleet's settings are in :mod:`tokenplane.sim.fleet_settings`.

.. code-block:: yaml

    name: mooncake-prefix
    seed: 7
    fleet: {instances: 8, gpu: H100, model: llama-3-8b}
    workload: {type: mooncake, path: mooncake/conversation_trace.jsonl, time_scale: 1.0}
    runs:
      - {name: round-robin, router: round-robin}
      - {name: prefix-affinity, router: {name: prefix-affinity}}
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.routing import build_router
from tokenplane.sim.catalog import Catalog, UnknownHardware
from tokenplane.sim.disagg import DisaggSettings, check_disaggregation
from tokenplane.sim.errors import ScenarioError as ScenarioError
from tokenplane.sim.errors import WorkloadConfigError
from tokenplane.sim.faults import ClientSpec, ControlSpec, FaultSpec
from tokenplane.sim.fleet_settings import EngineSettings as EngineSettings
from tokenplane.sim.fleet_settings import FleetGroup as FleetGroup
from tokenplane.sim.fleet_settings import FleetSettings as FleetSettings
from tokenplane.sim.fleet_settings import LifecycleSettings as LifecycleSettings
from tokenplane.sim.overrides import deep_merge as deep_merge
from tokenplane.sim.workloads.factory import check_workload_config
from tokenplane.sim.yaml_file import read_yaml


class AutoscalerSettings(BaseModel):
    """``autoscaler: {name, params, pool, ...}``: see :mod:`tokenplane.sim.autoscaling`."""

    model_config = ConfigDict(extra="forbid")

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    pool: dict[str, Any] = Field(default_factory=dict)
    decision_interval_s: float = Field(15.0, gt=0)
    initial_serving: int | None = Field(None, ge=0)
    arrival_bucket_s: float = Field(15.0, gt=0)
    # What "utilisation" means for utilisation-driven scalers (the HPA baseline): the GPU busy
    # fraction (what nvidia-smi/DCGM report), the KV-cache use, or running / max_num_seqs.
    utilisation_metric: Literal["busy", "kv_usage", "batch_fill"] = "busy"
    history_buckets: int = Field(120, gt=1)
    slo_window_s: float = Field(60.0, gt=0)


class AdmissionSettings(BaseModel):
    """``admission: {...}``: a gateway-like admission layer in the twin (see
    :mod:`tokenplane.sim.admission_shell`). ``policy`` picks the family: ``request-level`` (FCFS by
    class, sheds the newcomer) or ``task-aware`` (orders and sheds by workflow value, budgeted
    retries for late steps).

    ``kv_working_set_fraction`` (task-aware only; default 0.85, ``null`` turns it off): the share of
    the fleet's KV capacity that the contexts of started, unfinished tasks (each projected to its
    last step) may fill; a new task (step 1) that would push them past it is refused (reason
    ``kv_working_set``) so that started tasks keep their prefixes cached through their think time
    (:class:`~tokenplane.core.task_admission.KvWorkingSetLimit`). Steps of started tasks are never
    refused by it."""

    model_config = ConfigDict(extra="forbid")

    policy: Literal["request-level", "task-aware"] = "request-level"
    max_in_flight_per_instance: int = Field(32, gt=0)
    queue: dict[str, Any] = Field(default_factory=dict)  # core AdmissionQueue params
    shedder: dict[str, Any] = Field(default_factory=dict)  # core LoadShedder params
    value: dict[str, Any] = Field(default_factory=dict)  # core WorkflowValueModel params
    protect_density: float = 4.0
    shed_density: float = 0.0
    retry_p_success: float = Field(0.8, ge=0, le=1)
    max_retries_per_step: int = Field(1, ge=0)
    retry_delay_s: float = Field(1.0, ge=0)
    retry_budget: dict[str, Any] = Field(default_factory=dict)  # core RetryBudget params
    pump_interval_s: float = Field(1.0, gt=0)
    kv_working_set_fraction: float | None = Field(0.85, gt=0, allow_inf_nan=False)


class RoutingSettings(BaseModel):
    """What the twin tells the router beyond the views (scenario key ``routing``).

    ``precise_kv``: fill ``RequestInfo.cached_prefix_tokens`` with each instance's exact leading
    cached prompt tokens, read from its engine's prefix cache (as the gateway does from vLLM's KV
    events), so prefix affinity routes on what engines hold (reason ``kv_cache_match``) rather than
    on its own index of past routing. Off by default."""

    model_config = ConfigDict(extra="forbid")

    precise_kv: bool = False


class RequestPathSettings(BaseModel):
    """The fixed cost of the request path outside the engines (scenario key ``request_path``).

    ``first_chunk_s``: what the client, HTTP and the gateway add to every request's time to its
    first chunk on an idle fleet (serialising and sending the request, parsing and routing it,
    relaying the first chunk, decoding it). The twin charges it where a request enters: the fleet
    receives a request ``first_chunk_s`` after its client sent it, and the record's arrival is the
    send time. So TTFT and end-to-end latency include it, TBT does not, and a closed-loop user's
    next step waits for it. It is charged once per request, not per retry.

    Default 0: the twin's latencies are then the fleet's own (from the request's arrival at the
    gateway), as before this setting existed; a real deployment's path depends on its network,
    gateway and clients. Source of a figure: ``tokenplane rehearse`` measures it on the live stack
    (idle instances, a few requests: client TTFT minus the emulator's own TTFT) and runs the twin
    with it; on the 2-core development machine it was a few milliseconds (``bench/rehearse.py
    --client-cost`` measured ~6 ms for the openai client and the HTTP hop alone).
    """

    model_config = ConfigDict(extra="forbid")

    first_chunk_s: float = Field(0.0, ge=0, allow_inf_nan=False)


class SloSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttft_s: float = Field(2.0, gt=0)
    tbt_s: float = Field(0.1, gt=0)


class RunSettings(BaseModel):
    """One run after its overrides were merged onto the scenario's base."""

    model_config = ConfigDict(extra="forbid")

    name: str
    seed: int
    router: Any
    fleet: FleetSettings
    workload: dict[str, Any]
    duration_s: float | None = Field(None, gt=0)
    sample_interval_s: float = Field(10.0, gt=0)
    slo: SloSettings
    clients: ClientSpec | None = None
    controls: ControlSpec | None = None
    faults: list[FaultSpec] = Field(default_factory=list)
    autoscaler: AutoscalerSettings | None = None
    admission: AdmissionSettings | None = None
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    disaggregation: DisaggSettings | None = None
    request_path: RequestPathSettings = Field(default_factory=RequestPathSettings)

    @property
    def resilient(self) -> bool:
        return self.clients is not None or self.controls is not None or bool(self.faults)


class _ScenarioFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "scenario"
    description: str = ""
    seed: int = 0
    traces: str | None = None
    router: Any = "round-robin"
    fleet: dict[str, Any] = Field(default_factory=dict)
    workload: dict[str, Any] = Field(default_factory=lambda: {"type": "synthetic"})
    duration_s: float | None = None
    sample_interval_s: float = 10.0
    slo: dict[str, Any] = Field(default_factory=dict)
    catalog: dict[str, Any] = Field(default_factory=dict)
    clients: dict[str, Any] | None = None
    controls: dict[str, Any] | None = None
    faults: list[dict[str, Any]] = Field(default_factory=list)
    autoscaler: dict[str, Any] | None = None
    admission: dict[str, Any] | None = None
    routing: dict[str, Any] = Field(default_factory=dict)
    disaggregation: dict[str, Any] | None = None
    request_path: dict[str, Any] = Field(default_factory=dict)
    runs: list[dict[str, Any]] = Field(default_factory=list)


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    traces: str | None = None
    catalog: dict[str, Any] = Field(default_factory=dict)
    runs: list[RunSettings]
    source: str | None = None


_RUN_KEYS = {
    "name",
    "router",
    "fleet",
    "workload",
    "seed",
    "duration_s",
    "sample_interval_s",
    "slo",
    "clients",
    "controls",
    "faults",
    "autoscaler",
    "admission",
    "routing",
    "disaggregation",
    "request_path",
}


def router_label(router: Any) -> str:
    if isinstance(router, str):
        return router
    if isinstance(router, Mapping):
        return str(router.get("name", "router"))
    return "router"


def parse_scenario(raw: Any, *, source: str | None = None, catalog: Catalog | None = None) -> Scenario:
    """Validate a scenario mapping; ``catalog`` (default: the built-in one) is the base its
    ``catalog:`` section extends when runs are checked at load."""
    where = source or "scenario"
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected a mapping at the top level")
    try:
        base = _ScenarioFile.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(f"{where}: {_describe(exc)}") from exc
    base_run = {
        "seed": base.seed,
        "router": base.router,
        "fleet": base.fleet,
        "workload": base.workload,
        "duration_s": base.duration_s,
        "sample_interval_s": base.sample_interval_s,
        "slo": base.slo,
        "clients": base.clients,
        "controls": base.controls,
        "faults": base.faults,
        "autoscaler": base.autoscaler,
        "admission": base.admission,
        "routing": base.routing,
        "disaggregation": base.disaggregation,
        "request_path": base.request_path,
    }
    runs_raw = base.runs or [{"name": router_label(base.router)}]
    runs: list[RunSettings] = []
    seen: set[str] = set()
    for i, r in enumerate(runs_raw):
        extra = set(r) - _RUN_KEYS
        if extra:
            raise ScenarioError(f"{where}: runs[{i}]: unknown keys {sorted(extra)}")
        overrides = {k: v for k, v in r.items() if k != "name"}
        merged = deep_merge(base_run, overrides)
        wl = overrides.get("workload")
        if isinstance(wl, Mapping) and wl.get("type", base.workload.get("type")) != base.workload.get("type"):
            merged["workload"] = copy.deepcopy(dict(wl))  # another kind of workload replaces, not merges
        merged["name"] = str(r.get("name") or router_label(merged["router"]))
        if merged["name"] in seen:
            raise ScenarioError(f"{where}: runs[{i}]: duplicate run name {merged['name']!r}")
        seen.add(merged["name"])
        label = f"{where}: runs[{i}] ({merged['name']})"
        try:
            runs.append(RunSettings.model_validate(merged))
        except ValidationError as exc:
            raise ScenarioError(f"{label}: {_describe(exc)}") from exc
        # Fail at load, not after earlier runs were simulated: build the router once and check
        # the workload's fields (trace files are opened only when the run starts).
        try:
            build_router(merged["router"], random.Random(0))
            check_disaggregation([g.role for g in runs[-1].fleet.resolved_groups()], runs[-1].disaggregation)
            check_workload_config(merged["workload"])
            _check_lifecycle(runs[-1], base.catalog, catalog)
            if runs[-1].admission is not None:
                from tokenplane.sim.admission_shell import build_admission_policies

                build_admission_policies(runs[-1].admission)
        except (InvalidPolicyConfig, WorkloadConfigError, UnknownHardware, ValueError) as exc:
            raise ScenarioError(f"{label}: {exc}") from exc
    return Scenario(
        name=base.name,
        description=base.description,
        traces=base.traces,
        catalog=base.catalog,
        runs=runs,
        source=source,
    )


def _check_lifecycle(run: RunSettings, catalog: Mapping[str, Any], base: Catalog | None = None) -> None:
    """Build the autoscaler and its pool spec once (fails at load), and check engine kinds."""
    cold = any(g.state == "cold" for g in run.fleet.resolved_groups())
    if run.autoscaler is None and not cold:
        return
    if any(g.engine.kind != "continuous" for g in run.fleet.resolved_groups()):
        raise ValueError("autoscaling and cold instances need the continuous engine")
    if run.autoscaler is not None:
        from tokenplane.sim.autoscaling import build_scaler_and_pool

        cat = base or Catalog.default()
        if catalog:
            cat = cat.with_overrides(catalog)
        build_scaler_and_pool(run, cat)


def load_scenario(path: str | Path, catalog: Catalog | None = None) -> Scenario:
    p = Path(path)
    raw = read_yaml(p, ScenarioError)
    return parse_scenario(raw, source=str(p), catalog=catalog)


def with_policy(scenario: Scenario, policy: str) -> Scenario:
    """Keep the scenario's first run but route with ``policy`` (the ``--policy`` override)."""
    try:
        build_router(policy, random.Random(0))
    except InvalidPolicyConfig as exc:
        raise ScenarioError(f"--policy: {exc}") from exc
    first = scenario.runs[0]
    run = first.model_copy(update={"name": policy, "router": policy})
    return scenario.model_copy(update={"runs": [run]})


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
