"""The whole config file: :class:`GatewayConfig` (its sections and the references between them),
read from YAML (:func:`load_config`) or an already-loaded mapping (:func:`parse_config`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from tokenplane.control.config import AutoscalingConfig
from tokenplane.gateway.config.base import Strict
from tokenplane.gateway.config.discovery import DiscoveryConfig
from tokenplane.gateway.config.edge import DrainConfig, EdgeConfig, LimitsConfig, ListenConfig, ReloadConfig
from tokenplane.gateway.config.instances import HealthConfig, InstanceConfig, ScrapeConfig
from tokenplane.gateway.config.models import ModelConfig
from tokenplane.gateway.config.state import LedgerConfig, StateConfig, TracingConfig
from tokenplane.gateway.config.tenants import TenantConfig
from tokenplane.gateway.config_env import expand_env
from tokenplane.gateway.disagg.config import check_pools
from tokenplane.gateway.errors import ConfigError
from tokenplane.gateway.resilience_config import AdmissionParams, BreakerParams, RetryConfig


class GatewayConfig(Strict):
    listen: ListenConfig = ListenConfig()
    edge: EdgeConfig = EdgeConfig()
    limits: LimitsConfig = LimitsConfig()
    tenants: tuple[TenantConfig, ...] = ()
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    instances: tuple[InstanceConfig, ...] = ()
    scrape: ScrapeConfig = ScrapeConfig()
    health: HealthConfig = HealthConfig()
    retry: RetryConfig = RetryConfig()
    breaker: BreakerParams = BreakerParams()
    admission: AdmissionParams = AdmissionParams()
    autoscaling: AutoscalingConfig | None = None
    ledger: LedgerConfig = LedgerConfig()
    tracing: TracingConfig = TracingConfig()
    state: StateConfig = StateConfig()
    drain: DrainConfig = DrainConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    reload: ReloadConfig = ReloadConfig()

    @model_validator(mode="after")
    def _references(self) -> GatewayConfig:
        names: dict[str, str] = {}
        for i, m in enumerate(self.models):
            for n in (m.name, *m.aliases, *m.adapters):
                if n in names:
                    raise ValueError(
                        f"models[{i}]: name, alias or adapter {n!r} already used by model {names[n]!r}"
                    )
                names[n] = m.name
        for i, m in enumerate(self.models):
            for j, fb in enumerate(m.fallback):
                if fb.model not in names or names[fb.model] == m.name:
                    raise ValueError(f"models[{i}].fallback[{j}].model: {fb.model!r} is not another model")
        if not self.instances and self.discovery.kind != "kubernetes":
            raise ValueError("instances: at least one instance (or discovery.kind: kubernetes)")
        ids: set[str] = set()
        for i, inst in enumerate(self.instances):
            if inst.id in ids:
                raise ValueError(f"instances[{i}].id: duplicate id {inst.id!r}")
            ids.add(inst.id)
            if inst.model not in names or names[inst.model] != inst.model:
                raise ValueError(f"instances[{i}].model: {inst.model!r} is not a configured model name")
        check_pools(self.models, self.instances, static=self.discovery.kind == "static")
        tenants: set[str] = set()
        keys: set[str] = set()
        for i, t in enumerate(self.tenants):
            if t.name in tenants:
                raise ValueError(f"tenants[{i}].name: duplicate tenant {t.name!r}")
            tenants.add(t.name)
            for k in t.api_keys:
                if k in keys:
                    raise ValueError(f"tenants[{i}].api_keys: a key is listed twice")
                keys.add(k)
            for n in t.models or ():
                if n not in names:
                    raise ValueError(f"tenants[{i}].models: unknown model {n!r}")
        return self

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tenants)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def parse_config(raw: Any, *, source: str = "<config>") -> GatewayConfig:
    """Validate an already-loaded mapping; every failure is a :class:`ConfigError` naming the field."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{_format_loc(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{source}: invalid gateway config:\n  " + "\n  ".join(lines)) from None


def load_config(path: str | Path) -> GatewayConfig:
    """Read a YAML file, fill ``${NAME}`` from the environment (:mod:`.config_env`), validate it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    raw, unset = expand_env(raw, os.environ)
    if unset:
        raise ConfigError(f"{p}: environment variables not set:\n  " + "\n  ".join(unset))
    return parse_config(raw, source=str(p))
