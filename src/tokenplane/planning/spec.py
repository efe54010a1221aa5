"""What ``tokenplane plan SPEC.yaml`` reads: the demand (users, calls, tokens per call), the SLOs,
the GPU types to try and the search's settings, validated; and the demand's token rate."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenplane.sim.workloads.dists import LengthDist
from tokenplane.sim.workloads.factory import LengthDistConfig
from tokenplane.sim.yaml_file import read_yaml

DEFAULT_GPUS = ("h100", "a100", "l40s")


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
    raw = read_yaml(p, PlanError)
    return parse_plan_spec(raw, source=str(p))
