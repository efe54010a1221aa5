"""Scenario files: one fleet, one workload, several runs that differ in what they override.

A scenario is YAML validated once into typed objects; an unknown key or a bad value fails at load
with the path of the field. Each run deep-merges its overrides (``router``, ``fleet``,
``workload``, ``seed``) onto the base, so comparing policies means listing them.

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

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.routing import build_router
from tokenplane.sim.faults import ClientSpec, ControlSpec, FaultSpec
from tokenplane.sim.workloads.factory import WorkloadConfigError, check_workload_config


class ScenarioError(ValueError):
    """A scenario file cannot be read or does not validate; the message names the field."""


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["continuous", "static"] = "continuous"
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(2048, gt=0)
    block_size: int = Field(16, gt=0)
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_capacity_tokens: int | None = Field(None, gt=0)
    max_model_len: int | None = Field(None, gt=0)
    static_batch_size: int = Field(32, gt=0)


class FleetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instances: int = Field(4, gt=0)
    gpu: str = "H100"
    model: str = "llama-3-8b"
    tp: int = Field(1, gt=0)
    price_per_hour: float | None = Field(None, ge=0)
    engine: EngineSettings = Field(default_factory=lambda: EngineSettings())


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
}


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def router_label(router: Any) -> str:
    if isinstance(router, str):
        return router
    if isinstance(router, Mapping):
        return str(router.get("name", "router"))
    return "router"


def parse_scenario(raw: Any, *, source: str | None = None) -> Scenario:
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
            check_workload_config(merged["workload"])
        except (InvalidPolicyConfig, WorkloadConfigError) as exc:
            raise ScenarioError(f"{label}: {exc}") from exc
    return Scenario(
        name=base.name,
        description=base.description,
        traces=base.traces,
        catalog=base.catalog,
        runs=runs,
        source=source,
    )


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{p}: invalid YAML: {exc}") from exc
    return parse_scenario(raw, source=str(p))


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
