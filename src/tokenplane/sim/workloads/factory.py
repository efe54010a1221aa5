"""Build a workload from a plain config mapping (as read from YAML), validated with pydantic.

Examples::

    {"type": "mooncake", "path": "mooncake/conversation_trace.jsonl", "time_scale": 1.0}
    {"type": "azure", "path": "azure-2023/AzureLLMInferenceTrace_conv.csv", "limit": 1000}
    {"type": "synthetic", "rate_rps": 10, "num_requests": 1000,
     "prompt": {"kind": "lognormal", "mean": 1000, "cv": 1}}
    {"type": "agentic", "preset": "copilot", "users": 20}
    {"type": "servegen", "path": "servegen/reason/deepseek-r1", "time_scale": 0.04}
    {"type": "bursty", "rate_rps": 20, "cv": 4, "peak_ratio": 4, "burst_s": 60, "duration_s": 1800}

Every type takes ``adapters: {count, zipf_s, seed}``: requests then ask for LoRA adapters
(:mod:`tokenplane.sim.workloads.adapters`).

Relative trace paths are resolved against the traces folder; a typo or a bad value raises
:class:`WorkloadConfigError` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenplane.sim.errors import WorkloadConfigError
from tokenplane.sim.workloads.adapters import AdapterSettings, AdapterWorkload
from tokenplane.sim.workloads.agentic import AGENTIC_PRESETS, AgenticWorkload
from tokenplane.sim.workloads.azure import AzureTrace
from tokenplane.sim.workloads.base import Workload
from tokenplane.sim.workloads.bursty import BurstyWorkload
from tokenplane.sim.workloads.dists import IntDist, LengthDist
from tokenplane.sim.workloads.mooncake import MooncakeTrace
from tokenplane.sim.workloads.servegen import ServeGenWorkload
from tokenplane.sim.workloads.synthetic import ServiceClass, SyntheticWorkload
from tokenplane.sim.workloads.traces import TraceNotFound, require_trace

__all__ = ["WORKLOAD_TYPES", "WorkloadConfigError", "build_workload", "check_workload_config"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LengthDistConfig(_Strict):
    kind: Literal["fixed", "uniform", "lognormal", "normal"]
    value: float = Field(0.0, ge=0)
    lo: float = Field(0.0, ge=0)
    hi: float = Field(0.0, ge=0)
    mean: float = Field(0.0, ge=0)
    cv: float = Field(1.0, ge=0)
    min: float = Field(0.0, ge=0)
    max: float | None = Field(None, ge=0)

    def build(self) -> LengthDist:
        return LengthDist(
            kind=self.kind,
            value=self.value,
            lo=self.lo,
            hi=self.hi,
            mean=self.mean,
            cv=self.cv,
            min=self.min,
            max=self.max,
        )


# A bare number means a fixed value.
LengthSpec = float | LengthDistConfig


def _length(spec: LengthSpec | None) -> LengthDist | None:
    if spec is None:
        return None
    if isinstance(spec, LengthDistConfig):
        return spec.build()
    return LengthDist.fixed(float(spec))


class IntRangeConfig(_Strict):
    min: int = Field(ge=1)
    max: int = Field(ge=1)


class MooncakeConfig(_Strict):
    type: Literal["mooncake"]
    path: str = "mooncake/conversation_trace.jsonl"
    time_scale: float = Field(1.0, gt=0)
    limit: int | None = Field(None, ge=0)
    model: str = ""
    tenant: str = "default"
    block_tokens: int = Field(512, ge=1)


class AzureConfig(_Strict):
    type: Literal["azure"]
    path: str = "azure-2023/AzureLLMInferenceTrace_conv.csv"
    time_scale: float = Field(1.0, gt=0)
    limit: int | None = Field(None, ge=0)
    model: str = ""
    tenant: str = "default"


class ServiceClassConfig(_Strict):
    weight: float = Field(1.0, gt=0)
    priority: int = Field(0, ge=-1, le=1)
    latency_budget_s: float | None = Field(None, gt=0)


class SyntheticConfig(_Strict):
    type: Literal["synthetic"]
    rate_rps: float = Field(gt=0)
    num_requests: int | None = Field(None, ge=0)
    duration_s: float | None = Field(None, ge=0)
    process: Literal["poisson", "gamma", "weibull"] = "poisson"
    cv: float = Field(1.0, ge=0)
    prompt: LengthSpec | None = None
    output: LengthSpec | None = None
    seed: int | None = None
    shared_prefix_tokens: int = Field(0, ge=0)
    prefix_groups: int = Field(1, ge=1)
    hash_block_tokens: int = Field(16, ge=1)
    tenant: str = "default"
    model: str = ""
    classes: list[ServiceClassConfig] = Field(default_factory=list)


class BurstyConfig(_Strict):
    type: Literal["bursty"]
    rate_rps: float = Field(gt=0)
    cv: float = Field(ge=1)
    peak_ratio: float = Field(4.0, gt=1)
    burst_s: float = Field(60.0, gt=0)
    num_requests: int | None = Field(None, ge=0)
    duration_s: float | None = Field(None, ge=0)
    prompt: LengthSpec | None = None
    output: LengthSpec | None = None
    seed: int | None = None
    tenant: str = "default"
    model: str = ""


class AgenticConfig(_Strict):
    type: Literal["agentic"]
    preset: Literal["chat", "copilot", "research", "autonomous"] | None = None
    users: int | None = Field(None, ge=0)
    tasks_per_user: int | None = Field(None, ge=0)
    steps_per_task: int | IntRangeConfig | None = None
    calls_per_step: int | None = Field(None, ge=1)
    system_prompt_tokens: int | None = Field(None, ge=0)
    first_prompt_tokens: LengthSpec | None = None
    tool_result_tokens: LengthSpec | None = None
    output_tokens: LengthSpec | None = None
    think_time_s: LengthSpec | None = None
    user_start_spread_s: float | None = Field(None, ge=0)
    hash_block_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    max_context_tokens: int | None = Field(None, ge=1)
    model: str | None = None
    tenant: str | None = None


class ServeGenConfig(_Strict):
    type: Literal["servegen"]
    path: str = "servegen/reason/deepseek-r1"
    clients: list[int] | None = None
    time_scale: float = Field(1.0, gt=0)
    duration_s: float | None = Field(None, ge=0)
    seed: int | None = None
    model: str = ""


WORKLOAD_TYPES: Mapping[str, type[_Strict]] = {
    "mooncake": MooncakeConfig,
    "azure": AzureConfig,
    "synthetic": SyntheticConfig,
    "agentic": AgenticConfig,
    "servegen": ServeGenConfig,
    "bursty": BurstyConfig,
}


def _format_errors(kind: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {kind}.{loc}: {err['msg']}")
    return f"invalid {kind} workload config:\n" + "\n".join(lines)


def _resolve(path: str, traces: Path | None) -> Path:
    try:
        return require_trace(path, traces)
    except TraceNotFound as exc:
        raise WorkloadConfigError(str(exc)) from exc


def check_workload_config(cfg: Mapping[str, Any]) -> _Strict:
    """Validate a workload config without building it (no trace files are opened)."""
    if not isinstance(cfg, Mapping):
        raise WorkloadConfigError(f"a workload config must be a mapping, got {type(cfg).__name__}")
    kind = cfg.get("type")
    if not isinstance(kind, str) or kind not in WORKLOAD_TYPES:
        raise WorkloadConfigError(
            f"workload config needs 'type', one of {sorted(WORKLOAD_TYPES)}; got {kind!r}"
        )
    body = {k: v for k, v in cfg.items() if k != "adapters"}  # an option of every type
    try:
        if "adapters" in cfg:
            AdapterSettings.model_validate(cfg["adapters"])
        return WORKLOAD_TYPES[kind].model_validate(body)
    except ValidationError as exc:
        raise WorkloadConfigError(_format_errors(kind, exc)) from None


def build_workload(cfg: Mapping[str, Any], *, traces: Path | None, seed: int) -> Workload:
    """The workload ``cfg`` describes; ``seed`` is used unless the config sets its own ``seed``.

    Raises :class:`WorkloadConfigError` for an unknown ``type``, an unknown or mistyped field, a
    bad value or a trace file that cannot be found.
    """
    parsed = check_workload_config(cfg)
    kind = cfg["type"]
    try:
        workload = _build(parsed, traces, seed)
        if "adapters" in cfg:
            tags = AdapterSettings.model_validate(cfg["adapters"])
            workload = AdapterWorkload(
                workload, count=tags.count, zipf_s=tags.zipf_s, seed=seed if tags.seed is None else tags.seed
            )
        return workload
    except (ValueError, FileNotFoundError) as exc:
        if isinstance(exc, WorkloadConfigError):
            raise
        raise WorkloadConfigError(f"invalid {kind} workload config: {exc}") from exc


def _build(parsed: _Strict, traces: Path | None, seed: int) -> Workload:
    if isinstance(parsed, MooncakeConfig):
        return MooncakeTrace(
            _resolve(parsed.path, traces),
            time_scale=parsed.time_scale,
            limit=parsed.limit,
            model=parsed.model,
            block_tokens=parsed.block_tokens,
            tenant=parsed.tenant,
        )
    if isinstance(parsed, AzureConfig):
        return AzureTrace(
            _resolve(parsed.path, traces),
            time_scale=parsed.time_scale,
            limit=parsed.limit,
            model=parsed.model,
            tenant=parsed.tenant,
        )
    if isinstance(parsed, SyntheticConfig):
        return SyntheticWorkload(
            rate_rps=parsed.rate_rps,
            num_requests=parsed.num_requests,
            duration_s=parsed.duration_s,
            process=parsed.process,
            cv=parsed.cv,
            prompt=_length(parsed.prompt),
            output=_length(parsed.output),
            seed=seed if parsed.seed is None else parsed.seed,
            shared_prefix_tokens=parsed.shared_prefix_tokens,
            prefix_groups=parsed.prefix_groups,
            hash_block_tokens=parsed.hash_block_tokens,
            tenant=parsed.tenant,
            model=parsed.model,
            classes=[ServiceClass(c.weight, c.priority, c.latency_budget_s) for c in parsed.classes],
        )
    if isinstance(parsed, BurstyConfig):
        return BurstyWorkload(
            rate_rps=parsed.rate_rps,
            cv=parsed.cv,
            peak_ratio=parsed.peak_ratio,
            burst_s=parsed.burst_s,
            num_requests=parsed.num_requests,
            duration_s=parsed.duration_s,
            prompt=_length(parsed.prompt),
            output=_length(parsed.output),
            seed=seed if parsed.seed is None else parsed.seed,
            tenant=parsed.tenant,
            model=parsed.model,
        )
    if isinstance(parsed, AgenticConfig):
        return _build_agentic(parsed, seed)
    if isinstance(parsed, ServeGenConfig):
        return ServeGenWorkload(
            _resolve(parsed.path, traces),
            clients=parsed.clients,
            time_scale=parsed.time_scale,
            duration_s=parsed.duration_s,
            seed=seed if parsed.seed is None else parsed.seed,
            model=parsed.model,
        )
    raise WorkloadConfigError(f"unsupported workload config {type(parsed).__name__}")  # pragma: no cover


def _build_agentic(parsed: AgenticConfig, seed: int) -> AgenticWorkload:
    params: dict[str, Any] = {}
    for name in (
        "users",
        "tasks_per_user",
        "calls_per_step",
        "system_prompt_tokens",
        "user_start_spread_s",
        "hash_block_tokens",
        "max_context_tokens",
        "model",
        "tenant",
    ):
        value = getattr(parsed, name)
        if value is not None:
            params[name] = value
    steps = parsed.steps_per_task
    if isinstance(steps, IntRangeConfig):
        if steps.max < steps.min:
            raise WorkloadConfigError(
                f"invalid agentic workload config: steps_per_task.max ({steps.max}) < min ({steps.min})"
            )
        params["steps_per_task"] = IntDist(steps.min, steps.max)
    elif steps is not None:
        params["steps_per_task"] = steps
    for name in ("first_prompt_tokens", "tool_result_tokens", "output_tokens", "think_time_s"):
        dist = _length(getattr(parsed, name))
        if dist is not None:
            params[name] = dist
    params["seed"] = seed if parsed.seed is None else parsed.seed
    if parsed.preset is not None:
        assert parsed.preset in AGENTIC_PRESETS
        return AgenticWorkload.preset(parsed.preset, **params)
    if "users" not in params:
        raise WorkloadConfigError("invalid agentic workload config: 'users' is required without a preset")
    return AgenticWorkload(**params)
