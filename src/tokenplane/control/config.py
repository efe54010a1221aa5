"""The ``autoscaling:`` section of the gateway config, validated once at load.

::

    autoscaling:
      enabled: true
      dry_run: false            # decide and log, change nothing
      interval_s: 15
      model: llama-3-8b         # the gateway model (pool) this loop sizes
      scaler: {name: tokenplane, params: {target_utilisation: 0.7}}
      pool: {min_instances: 1, max_instances: 8, warm_pool_size: 1, capacity_rps: 4,
             cold_start_s: 120, warm_activation_s: 2, ttft_slo_s: 1.0}
      signals: {bucket_s: 10, history_buckets: 60, slo_window_s: 60}
      max_drain_s: 300
      actuator:                 # one of:
        kind: emulated          # args, port_range, warmup_s, host, stop_timeout_s, log_dir
        args: [--served-model-name, llama-3-8b, --gpu, H100]
        port_range: [18100, 18199]
        warmup_s: 30
      # kind: kubernetes        # namespace, name, workload (Deployment|StatefulSet), url_pattern,
      #                         # kubeconfig, context, in_cluster, host, retries, backoff_s, backoff_max_s
      # kind: command           # scale_cmd: [kubectl, scale, deploy/x, "--replicas={replicas}"],
      #                         # timeout_s, initial_replicas, ready_after_s

``scaler`` and ``pool`` are checked by building them with the core's own factories, so a bad
parameter fails here, with its path. ``interval_s`` is also the tokenplane scaler's
``decision_interval_s`` unless its params set one. ``pool.min_instances`` is the floor every
actuator enforces as ``min_replicas``; ``pool.max_instances`` its ``max_replicas``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tokenplane.control.actuators import REPLICAS_PLACEHOLDER, Actuator, CommandActuator
from tokenplane.control.emulated import DEFAULT_PORT_RANGE, DEFAULT_STOP_TIMEOUT_S, EmulatedFleetActuator
from tokenplane.control.errors import AutoscalingConfigError
from tokenplane.control.k8s import DEFAULT_BACKOFF_MAX_S, DEFAULT_BACKOFF_S, DEFAULT_RETRIES
from tokenplane.control.loop import DEFAULT_INTERVAL_S, DEFAULT_MAX_DRAIN_S
from tokenplane.control.signals import DEFAULT_BUCKET_S, DEFAULT_HISTORY_BUCKETS, DEFAULT_SLO_WINDOW_S
from tokenplane.core.autoscale import Autoscaler, PoolSpec, build_autoscaler, parse_pool_spec
from tokenplane.core.errors import InvalidPolicyConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScalerConfig(_Strict):
    name: str = "tokenplane"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _buildable(self) -> ScalerConfig:
        try:
            build_autoscaler({"name": self.name, "params": self.params})
        except InvalidPolicyConfig as exc:
            raise ValueError(str(exc)) from None
        return self


class SignalsConfig(_Strict):
    bucket_s: float = Field(DEFAULT_BUCKET_S, gt=0)
    history_buckets: int = Field(DEFAULT_HISTORY_BUCKETS, ge=2)
    slo_window_s: float = Field(DEFAULT_SLO_WINDOW_S, gt=0)
    tbt_slo_s: float | None = Field(None, gt=0)


class EmulatedActuatorConfig(_Strict):
    kind: Literal["emulated"]
    args: tuple[str, ...] = ()
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    warmup_s: float = Field(0.0, ge=0)
    host: str = "127.0.0.1"
    stop_timeout_s: float = Field(DEFAULT_STOP_TIMEOUT_S, gt=0)
    health_timeout_s: float = Field(60.0, gt=0)
    log_dir: str | None = None

    @field_validator("port_range")
    @classmethod
    def _ports(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 0 < v[0] <= v[1] <= 65535:
            raise ValueError("must be [lo, hi] with 0 < lo <= hi <= 65535")
        return v

    @field_validator("args")
    @classmethod
    def _no_port(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for a in v:
            if a.split("=", 1)[0] in ("--port", "--host"):
                raise ValueError(f"{a.split('=', 1)[0]} is chosen by the actuator; use port_range / host")
        return v


class KubernetesActuatorConfig(_Strict):
    kind: Literal["kubernetes"]
    namespace: str = Field("default", min_length=1)
    name: str = Field(min_length=1)
    workload: Literal["Deployment", "StatefulSet"] = "Deployment"
    url_pattern: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    host: str | None = None
    """API server URL without credentials (a ``kubectl proxy``, or a test's fake)."""
    retries: int = Field(DEFAULT_RETRIES, ge=0)
    backoff_s: float = Field(DEFAULT_BACKOFF_S, ge=0)
    backoff_max_s: float = Field(DEFAULT_BACKOFF_MAX_S, ge=0)

    @model_validator(mode="after")
    def _pattern(self) -> KubernetesActuatorConfig:
        if self.url_pattern is not None:
            if self.workload != "StatefulSet":
                raise ValueError(
                    "url_pattern needs workload: StatefulSet (a Deployment's pods have no stable names)"
                )
            if "{ordinal}" not in self.url_pattern:
                raise ValueError("url_pattern must contain {ordinal}")
            try:
                self.url_pattern.format(name="n", namespace="ns", ordinal=0)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"url_pattern: only {{name}}, {{namespace}}, {{ordinal}} are known ({exc})"
                ) from None
        return self


class CommandActuatorConfig(_Strict):
    kind: Literal["command"]
    scale_cmd: tuple[str, ...] = Field(min_length=1)
    timeout_s: float = Field(60.0, gt=0)
    initial_replicas: int = Field(0, ge=0)
    ready_after_s: float = Field(0.0, ge=0)

    @field_validator("scale_cmd")
    @classmethod
    def _placeholder(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not a for a in v):
            raise ValueError("arguments must be non-empty strings")
        if not any(REPLICAS_PLACEHOLDER in a for a in v):
            raise ValueError(f"one argument must contain {REPLICAS_PLACEHOLDER}")
        return v


ActuatorConfig = Annotated[
    EmulatedActuatorConfig | KubernetesActuatorConfig | CommandActuatorConfig, Field(discriminator="kind")
]


class AutoscalingConfig(_Strict):
    enabled: bool = False
    dry_run: bool = False
    interval_s: float = Field(DEFAULT_INTERVAL_S, gt=0)
    model: str | None = None
    """The gateway model whose pool this loop sizes (required when the gateway serves several)."""
    scaler: ScalerConfig = ScalerConfig()
    pool: dict[str, Any]
    actuator: ActuatorConfig
    signals: SignalsConfig = SignalsConfig()
    max_drain_s: float = Field(DEFAULT_MAX_DRAIN_S, gt=0)
    adopt_existing: bool = True

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            parse_pool_spec(v, owner="pool")
        except InvalidPolicyConfig as exc:
            raise ValueError(str(exc)) from None
        return v

    def pool_spec(self) -> PoolSpec:
        return parse_pool_spec(self.pool, owner="autoscaling.pool")

    def build_scaler(self) -> Autoscaler:
        params = dict(self.scaler.params)
        if self.scaler.name == "tokenplane":
            params.setdefault("decision_interval_s", self.interval_s)
        return build_autoscaler({"name": self.scaler.name, "params": params})


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = "autoscaling"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse_autoscaling_config(raw: Any, *, source: str = "<config>") -> AutoscalingConfig:
    """Validate the section; every failure is an :class:`AutoscalingConfigError` naming the field."""
    if not isinstance(raw, Mapping):
        raise AutoscalingConfigError(f"{source}: autoscaling must be a mapping, got {type(raw).__name__}")
    try:
        return AutoscalingConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{_format_loc(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise AutoscalingConfigError(
            f"{source}: invalid autoscaling config:\n  " + "\n  ".join(lines)
        ) from None


def build_actuator(cfg: AutoscalingConfig, *, api_client: Any = None) -> Actuator:
    """The configured actuator (the Kubernetes client is created here unless one is passed)."""
    a = cfg.actuator
    spec = cfg.pool_spec()
    if isinstance(a, EmulatedActuatorConfig):
        return EmulatedFleetActuator(
            a.args,
            a.port_range,
            a.warmup_s,
            host=a.host,
            stop_timeout_s=a.stop_timeout_s,
            health_timeout_s=a.health_timeout_s,
            log_dir=Path(a.log_dir) if a.log_dir else None,
        )
    if isinstance(a, KubernetesActuatorConfig):
        from tokenplane.control.k8s import KubernetesActuator, load_api_client

        client = api_client or load_api_client(
            host=a.host, kubeconfig=a.kubeconfig, context=a.context, in_cluster=a.in_cluster
        )
        return KubernetesActuator(
            a.namespace,
            a.name,
            a.workload,
            client,
            min_replicas=spec.min_instances,
            max_replicas=spec.max_instances,
            url_pattern=a.url_pattern,
            retries=a.retries,
            backoff_s=a.backoff_s,
            backoff_max_s=a.backoff_max_s,
        )
    return CommandActuator(
        a.scale_cmd,
        initial_replicas=a.initial_replicas,
        min_replicas=spec.min_instances,
        max_replicas=spec.max_instances,
        timeout_s=a.timeout_s,
        ready_after_s=a.ready_after_s,
    )
