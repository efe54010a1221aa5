"""A scenario's fleet: its instance groups, each group's engine and lifecycle settings.

``fleet: {instances, gpu, model, tp, engine: {...}, lifecycle: {...}}`` describes one group;
``fleet: {groups: [...]}`` several, each taking the fleet-level values it does not set (see
:class:`FleetSettings`). Validated as part of a scenario (:mod:`tokenplane.sim.scenario`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokenplane.sim.lora import LoraSettings
from tokenplane.sim.overrides import deep_merge


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["continuous", "static"] = "continuous"
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(2048, gt=0)
    block_size: int = Field(16, gt=0)
    enable_prefix_caching: bool = True
    # vLLM's scheduler_reserve_full_isl (its default since it was added): a waiting request is
    # admitted only when KV blocks for its whole prompt are free, not just for its first chunk.
    reserve_full_prompt: bool = True
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_capacity_tokens: int | None = Field(None, gt=0)
    max_model_len: int | None = Field(None, gt=0)
    static_batch_size: int = Field(32, gt=0)
    lora: LoraSettings | None = None  # LoRA slots and adapter load time (sim/lora.py)


class LifecycleSettings(BaseModel):
    """How long an instance takes to get ready (see :mod:`tokenplane.sim.lifecycle`).

    A cold start takes ``cold_start_s`` when set, else ``start_s + weight bytes / (load_gb_per_s
    x 1e9)``: a fixed part (container, engine start, CUDA graph capture) plus loading the model's
    weights at the instance's load bandwidth. ``warm_activation_s`` is how long a loaded, idle
    instance takes to join the router's candidate set.
    """

    model_config = ConfigDict(extra="forbid")

    start_s: float = Field(60.0, ge=0)
    load_gb_per_s: float = Field(2.0, gt=0)
    cold_start_s: float | None = Field(None, ge=0)
    warm_activation_s: float = Field(5.0, ge=0)


class FleetGroup(BaseModel):
    """One group of identical instances in a heterogeneous fleet; ids are ``<name>-<i>``.

    ``state: cold`` instances start their cold start at t = 0 (they hold a GPU and are not routed
    to until loaded); with an autoscaler they start stopped instead.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    instances: int = Field(gt=0)
    gpu: str = "H100"
    model: str = "llama-3-8b"
    tp: int = Field(1, gt=0)
    expert_parallel: bool = False  # a MoE model's experts spread whole over the tp GPUs (all-to-all)
    price_per_hour: float | None = Field(None, ge=0)
    state: Literal["warm", "cold"] = "warm"
    role: Literal["mixed", "prefill", "decode"] = "mixed"  # prefill/decode disaggregation (sim/disagg.py)
    engine: EngineSettings = Field(default_factory=lambda: EngineSettings())
    lifecycle: LifecycleSettings = Field(default_factory=lambda: LifecycleSettings())


class FleetSettings(BaseModel):
    """One group (``instances`` x ``gpu``, ids ``<gpu>-<i>``) or ``groups: [...]``.

    With ``groups``, each group's ``gpu``, ``model``, ``tp``, ``price_per_hour``, ``engine`` and
    ``lifecycle`` default to the fleet-level values (``engine`` and ``lifecycle`` merge key by key)
    and ``instances`` is the total.
    """

    model_config = ConfigDict(extra="forbid")

    instances: int = Field(4, gt=0)
    gpu: str = "H100"
    model: str = "llama-3-8b"
    tp: int = Field(1, gt=0)
    expert_parallel: bool = False  # a MoE model's experts spread whole over the tp GPUs (all-to-all)
    price_per_hour: float | None = Field(None, ge=0)
    state: Literal["warm", "cold"] = "warm"
    engine: EngineSettings = Field(default_factory=lambda: EngineSettings())
    lifecycle: LifecycleSettings = Field(default_factory=lambda: LifecycleSettings())
    groups: list[FleetGroup] | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_groups(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping) or raw.get("groups") is None:
            return raw
        groups = raw["groups"]
        if not isinstance(groups, list) or not groups:
            raise ValueError("groups must be a non-empty list")
        out = dict(raw)
        filled = []
        for g in groups:
            if not isinstance(g, Mapping):
                filled.append(g)
                continue
            g2 = dict(g)
            for key in ("gpu", "model", "tp", "expert_parallel", "price_per_hour"):
                if key not in g2 and key in raw:
                    g2[key] = raw[key]
            for key in ("engine", "lifecycle"):
                base = raw.get(key)
                if isinstance(base, Mapping):
                    own = g2.get(key)
                    g2[key] = deep_merge(base, own) if isinstance(own, Mapping) else dict(base)
            filled.append(g2)
        out["groups"] = filled
        if "instances" not in raw:
            total = sum(int(g.get("instances", 0)) for g in filled if isinstance(g, Mapping))
            out["instances"] = max(1, total)
        return out

    @model_validator(mode="after")
    def _check_groups(self) -> FleetSettings:
        if self.groups is None:
            return self
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique, got {names}")
        if len({g.engine.block_size for g in self.groups}) > 1:
            raise ValueError("every group must use the same engine.block_size")
        self.instances = sum(g.instances for g in self.groups)
        return self

    @property
    def grouped(self) -> bool:
        return self.groups is not None

    def resolved_groups(self) -> list[FleetGroup]:
        """The groups; the single form is one group (its ids stay ``<gpu>-<i>``, see the runner)."""
        if self.groups is not None:
            return list(self.groups)
        return [
            FleetGroup(
                name=self.gpu.lower(),
                instances=self.instances,
                gpu=self.gpu,
                model=self.model,
                tp=self.tp,
                expert_parallel=self.expert_parallel,
                price_per_hour=self.price_per_hour,
                state=self.state,
                engine=self.engine,
                lifecycle=self.lifecycle,
            )
        ]
