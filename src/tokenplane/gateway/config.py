"""The gateway's configuration: one YAML file, validated once into typed, frozen objects.

Shape (every section but ``models`` and ``instances`` is optional)::

    listen: {host: 127.0.0.1, port: 8080, fast_front: true}
    edge: {header_timeout_s: 10, body_timeout_s: 30, keepalive_timeout_s: 75,
           max_request_line_bytes: 8190, max_field_bytes: 8190, max_headers: 100}
    limits: {max_body_bytes: 1048576, max_tokens: 32768, max_prompt_tokens: 131072,
             upstream_timeout_s: 300}
    tenants:
      - {name: acme, priority: interactive, api_keys: ["sha256:<hex>"], max_concurrency: 64}
    models:
      - {name: llama-3-8b, aliases: [llama3], router: {name: prefix-affinity}, upstream_model: null}
    instances:
      - {id: vllm-0, url: http://127.0.0.1:8001, model: llama-3-8b, kind: vllm, gpu: H100,
         price_per_hour: 2.99, labels: {}}
    scrape: {interval_s: 1.0, timeout_s: 5.0}
    health: {interval_s: 2.0, failures_to_down: 2, path: /health, timeout_s: 2.0}
    retry: {budget_ratio: 0.2, min_per_s: 1.0, max_attempts: 3, stream_idle_timeout_s: 60, ...}
    breaker: {consecutive_failures: 5, cooldown_s: 5, ...}
    admission: {queue: {max_depth: 1024, ...}, shedding: {thresholds: {...}}}
    # per model (Avoid, Move, Delay):
    #   models[].response_cache: {enabled: true, ttl_s: 60, max_entries: 1024, max_bytes: 67108864}
    #   models[].fallback: [{model: small-model, when: [overloaded, quality_ok], quality: standard}]
    #   models[].deferral: {max_waiting: 256, spare_fraction: 0.5, max_wait_s: 600}
    # Share: the ``outstanding-tokens`` scorer (core/routing/scorers.py) in ``models[].router`` weighs
    # the tokens each instance has in flight (batching-aware load) when placing a request.
    ledger: {path: tokenplane-ledger.sqlite, abandon_after_s: 600}   # path null: in memory,
                                        # keeping memory_max_settled (100000) settled workflows
    # or, shared by every replica: ledger: {url: postgresql://user@db:5432/tokenplane,
    #   pool_max_size: 4, buffer_max_writes: 100000, timeout_s: 5}
    tracing: {otlp_endpoint: null, service_name: tokenplane-gateway, sample_ratio: 1.0}
    state: {backend: memory}    # or {backend: redis, url: redis://127.0.0.1:6379/0, key_prefix: tp:}
                                # (several replicas share limits, breakers and the prefix index)
    # per tenant: rpm_limit, tpm_limit (the tenant's total per minute), key_rpm_limit,
    # key_tpm_limit (each of its API keys per minute); 429 with Retry-After beyond them

API keys are stored hashed (``sha256:`` + hex digest of the raw key, see :func:`hash_key`). An empty
``tenants`` list turns authentication off: every caller is the tenant ``default`` (for a laptop
fleet; say so explicitly in the file). Routers are built once here to validate their params, so a
bad router fails at start with the field's path. Every component receives only its own slice.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tokenplane.control.config import AutoscalingConfig
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.routing import build_router
from tokenplane.gateway.config_env import expand_env
from tokenplane.gateway.errors import ConfigError as ConfigError
from tokenplane.gateway.resilience_config import AdmissionParams, BreakerParams, RetryConfig
from tokenplane.ledger.store import DEFAULT_MAX_SETTLED

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_TOKENS = 32_768
DEFAULT_MAX_PROMPT_TOKENS = 131_072
DEFAULT_UPSTREAM_TIMEOUT_S = 300.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_SCRAPE_INTERVAL_S = 1.0
DEFAULT_SCRAPE_TIMEOUT_S = 5.0
DEFAULT_HEALTH_INTERVAL_S = 2.0
DEFAULT_FAILURES_TO_DOWN = 2
DEFAULT_HEALTH_PATH = "/health"
DEFAULT_METRICS_PATH = "/metrics"
DEFAULT_ROUTER = "prefix-affinity"
DEFAULT_TENANT = "default"
DEFAULT_INSTANCE_MAX_CONCURRENCY = 256
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 75.0
DEFAULT_MAX_REQUEST_LINE_BYTES = 8190
DEFAULT_MAX_FIELD_BYTES = 8190
DEFAULT_MAX_HEADERS = 100

PriorityClass = Literal["interactive", "standard", "batch", "deferrable"]
PRIORITY_VALUES: Mapping[str, int] = {"interactive": 1, "standard": 0, "batch": -1, "deferrable": -1}
"""``RequestInfo.priority`` per class: higher is more urgent; ``standard`` is the core's default 0.
``deferrable`` is the batch class that first waits for spare capacity (see
:mod:`~tokenplane.gateway.deferral`)."""


class InstanceKind(StrEnum):
    """The runtime behind an instance; each value has an adapter in :mod:`tokenplane.gateway.runtimes`."""

    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMACPP = "llamacpp"
    EMULATED = "emulated"
    OPENAI = "openai"


_HASHED_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")


def hash_key(raw: str) -> str:
    """The stored form of an API key: ``sha256:`` + the hex digest of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Strict):
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    # The completion routes' own HTTP/1.1 front (gateway/fast_front.py); false: aiohttp serves all.
    fast_front: bool = True


class KubernetesDiscoveryConfig(_Strict):
    """Ready pods in ``namespace`` matching ``label_selector`` (gateway/discovery/kubernetes.py)."""

    namespace: str = Field(min_length=1)
    label_selector: str = Field(min_length=1)
    port_name: str = "http"
    api_host: str | None = None
    """A bare API server URL (a proxy, tests); else in-cluster or the kubeconfig."""
    in_cluster: bool = True
    kubeconfig: str | None = None
    watch_timeout_s: float = Field(60.0, ge=1)
    backoff_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(10.0, gt=0)


class DiscoveryConfig(_Strict):
    """Where instances come from: ``static`` (``instances``, fixed), ``file`` (``path``'s
    ``instances``, re-read on change), ``kubernetes`` (ready pods)."""

    kind: Literal["static", "file", "kubernetes"] = "static"
    path: str | None = None
    interval_s: float = Field(1.0, gt=0)
    drain_timeout_s: float = Field(110.0, gt=0)
    """A leaving instance is removed once its requests end, or after this long."""
    kubernetes: KubernetesDiscoveryConfig | None = None

    @model_validator(mode="after")
    def _source(self) -> DiscoveryConfig:
        if self.kind == "file" and not self.path:
            raise ValueError("path: required with kind: file")
        if self.kind == "kubernetes" and self.kubernetes is None:
            raise ValueError("kubernetes: required with kind: kubernetes (namespace, label_selector)")
        return self


class ReloadConfig(_Strict):
    """Reload tenants, models and limits when the config file changes (SIGHUP reloads always)."""

    watch: bool = True
    interval_s: float = Field(1.0, gt=0)


class DrainConfig(_Strict):
    """SIGTERM: requests in flight get up to ``deadline_s`` to finish (keep it under the pod's
    ``terminationGracePeriodSeconds``, 120 s in deploy/kubernetes) before the gateway exits."""

    deadline_s: float = Field(110.0, gt=0)


class EdgeConfig(_Strict):
    """The HTTP edge's own limits and timeouts (both edges; see :mod:`tokenplane.gateway.edges`)."""

    header_timeout_s: float = Field(DEFAULT_HEADER_TIMEOUT_S, gt=0)
    """From a request's first byte to the end of its head; later: 408 and the connection closed."""
    body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0)
    """From the end of a request's head to the end of its body; later: 408 and closed."""
    keepalive_timeout_s: float = Field(DEFAULT_KEEPALIVE_TIMEOUT_S, gt=0)
    """An idle keep-alive connection is closed after this long."""
    max_request_line_bytes: int = Field(DEFAULT_MAX_REQUEST_LINE_BYTES, ge=64)
    """A longer request line is refused with 414."""
    max_field_bytes: int = Field(DEFAULT_MAX_FIELD_BYTES, ge=64)
    """A longer header line (name and value) is refused with 431."""
    max_headers: int = Field(DEFAULT_MAX_HEADERS, ge=1)
    """More header lines are refused with 431."""


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1)
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    max_prompt_tokens: int = Field(DEFAULT_MAX_PROMPT_TOKENS, ge=1)
    upstream_timeout_s: float = Field(DEFAULT_UPSTREAM_TIMEOUT_S, gt=0)
    connect_timeout_s: float = Field(DEFAULT_CONNECT_TIMEOUT_S, gt=0)


class TenantConfig(_Strict):
    name: str = Field(min_length=1)
    priority: PriorityClass = "standard"
    api_keys: tuple[str, ...] = ()
    max_concurrency: int | None = Field(None, ge=1)
    models: tuple[str, ...] | None = None
    """Served names (or aliases) this tenant may use; ``None`` means every model."""
    continuation: bool = True
    """Whether this tenant's streams are continued on another instance after a mid-stream failure."""
    allow_priority_raise: bool = False
    """Whether ``X-Tokenplane-Priority`` may raise this tenant's class (it may always lower it)."""
    allow_deferrable: bool = False
    """Whether ``X-Tokenplane-Deferrable: true`` may mark this tenant's requests deferrable."""
    rpm_limit: int | None = Field(None, ge=1)
    """Requests per minute for the whole tenant (every key, every replica); 429 beyond it."""
    tpm_limit: int | None = Field(None, ge=1)
    """Tokens (prompt + completion) per minute for the whole tenant; 429 once spent."""
    key_rpm_limit: int | None = Field(None, ge=1)
    """Requests per minute for each of the tenant's API keys."""
    key_tpm_limit: int | None = Field(None, ge=1)
    """Tokens per minute for each of the tenant's API keys."""

    @property
    def has_rate_limits(self) -> bool:
        return any(
            v is not None for v in (self.rpm_limit, self.tpm_limit, self.key_rpm_limit, self.key_tpm_limit)
        )

    @field_validator("api_keys")
    @classmethod
    def _hashed(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for k in keys:
            if not _HASHED_KEY.match(k):
                raise ValueError("api keys are stored hashed: 'sha256:' + 64 lowercase hex digits")
        return keys


class ResponseCacheConfig(_Strict):
    """Exact response cache for deterministic requests (:mod:`~tokenplane.gateway.response_cache`)."""

    enabled: bool = True
    ttl_s: float = Field(60.0, gt=0)
    max_entries: int = Field(1024, ge=1)
    max_bytes: int = Field(64 << 20, ge=1)


FallbackReason = Literal["overloaded", "quality_ok"]
QualityClass = Literal["any", "standard", "best"]


class FallbackConfig(_Strict):
    """One link of a model's fallback chain (:mod:`~tokenplane.gateway.fallback`)."""

    model: str = Field(min_length=1)
    when: tuple[FallbackReason, ...] = ("overloaded", "quality_ok")
    quality: QualityClass = "standard"
    """The quality the fallback model offers: a request asking for more never moves to it."""


class DeferralConfig(_Strict):
    """The deferrable class's waiting room (:mod:`~tokenplane.gateway.deferral`)."""

    max_waiting: int = Field(256, ge=0)
    spare_fraction: float = Field(0.5, gt=0, le=1)
    """Deferred requests go once the pool's admitted and queued requests are below this share of
    its capacity."""
    max_wait_s: float = Field(600.0, gt=0)
    """Deadline when the request brings none (a workflow ``deadline_s`` is used when sooner)."""


class ModelConfig(_Strict):
    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    router: str | dict[str, Any] = DEFAULT_ROUTER
    upstream_model: str | None = None
    """The name the instances serve this model under (default: ``name``)."""
    adapters: tuple[str, ...] = ()
    """LoRA adapters the instances serve on this model (vLLM's ``--lora-modules``): a request whose
    ``model`` names one is this model's, asks for that adapter (``RequestInfo.adapter``) and goes
    upstream under the adapter's name."""
    response_cache: ResponseCacheConfig | None = None
    """Off unless given."""
    fallback: tuple[FallbackConfig, ...] = ()
    deferral: DeferralConfig = DeferralConfig()
    kv_working_set_fraction: float | None = Field(None, gt=0)
    """Start a new multi-step task (a request with workflow hints at step 1) only while the tasks
    in progress, each projected to its last step, fit this share of the pool's KV cache
    (each instance's ``kv_capacity_tokens``, else the size vLLM publishes in
    ``vllm:cache_config_info``); refusals are 429 ``kv_working_set``. Off unless given."""

    @property
    def served_name(self) -> str:
        return self.upstream_model or self.name

    @field_validator("router")
    @classmethod
    def _buildable(cls, router: str | dict[str, Any]) -> str | dict[str, Any]:
        try:
            build_router(router, random.Random(0))
        except InvalidPolicyConfig as exc:
            raise ValueError(str(exc)) from None
        return router


class KvEventsConfig(_Strict):
    """Where the gateway BINDS a ZMQ SUB socket for this instance's vLLM KV events (vLLM's
    ``--kv-events-config`` connects its publisher to the same endpoint); see
    :mod:`tokenplane.gateway.kv_events`. Needs the ``kv-events`` extra (pyzmq)."""

    endpoint: str = Field(min_length=1)
    topic: str = "kv"

    @field_validator("endpoint")
    @classmethod
    def _zmq(cls, endpoint: str) -> str:
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("must be a ZMQ endpoint (tcp://HOST:PORT, ipc://PATH)")
        return endpoint


class InstanceConfig(_Strict):
    id: str = Field(min_length=1)
    url: str
    model: str
    kind: InstanceKind = InstanceKind.VLLM
    gpu: str = ""
    price_per_hour: float = Field(0.0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    api_key: str | None = None
    """Bearer key the upstream expects (sent as is; it is the upstream's secret, not a tenant's)."""
    metrics_path: str = DEFAULT_METRICS_PATH
    kv_capacity_tokens: int = Field(0, ge=0)
    max_concurrency: int = Field(DEFAULT_INSTANCE_MAX_CONCURRENCY, ge=1)
    """Requests this gateway sends the instance at once; admission queues beyond the pool's sum."""
    prefill_tokens_per_s: float | None = Field(None, gt=0)
    decode_tokens_per_s: float | None = Field(None, gt=0)
    """Throughput for cost attribution (see :mod:`tokenplane.gateway.economics`); default: the twin's
    step-time model for ``gpu`` and the model, else ``ledger``'s defaults."""
    kv_bytes_per_token: int = Field(0, ge=0)
    """KV cache bytes per token, for the view's ``hbm_free_bytes`` (free KV tokens x this); default:
    the twin's catalogue entry for ``model`` where it has one, else unknown (``hbm_free_bytes`` 0)."""
    kv_events: KvEventsConfig | None = None
    """Subscribe to this instance's vLLM KV events (exact prefix-cache state); off by default."""

    @model_validator(mode="after")
    def _kv_events_supported(self) -> InstanceConfig:
        from tokenplane.gateway.runtimes import runtime_for  # the adapters import no config

        if self.kv_events is not None and not runtime_for(self.kind).capabilities.kv_events:
            raise ValueError(
                f"kv_events: a {self.kind.value} instance publishes no KV events the gateway reads"
            )
        return self

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url.rstrip("/")


class ScrapeConfig(_Strict):
    """Runtime metrics scrapes. ``timeout_s`` is independent of the interval: a runtime busy with a
    burst answers ``/metrics`` late, and a late scrape still gives a fresher view than none (the
    view's ``scraped_at`` says how fresh it is); rounds do not overlap."""

    interval_s: float = Field(DEFAULT_SCRAPE_INTERVAL_S, gt=0)
    timeout_s: float = Field(DEFAULT_SCRAPE_TIMEOUT_S, gt=0)
    enabled: bool = True


class HealthConfig(_Strict):
    """Active health checks. ``failures_to_down`` consecutive failures (checks and requests alike)
    take an instance out; a check that times out while the instance kept sending answers is not
    counted (busy, not down); one answered check brings it back."""

    interval_s: float = Field(DEFAULT_HEALTH_INTERVAL_S, gt=0)
    failures_to_down: int = Field(DEFAULT_FAILURES_TO_DOWN, ge=1)
    path: str = DEFAULT_HEALTH_PATH
    timeout_s: float = Field(2.0, gt=0)


class LedgerConfig(_Strict):
    """The workflow ledger (:mod:`tokenplane.gateway.workflows`): where spend and outcomes go."""

    enabled: bool = True
    path: str | None = None
    """SQLite file; ``null`` (and no ``url``) keeps the ledger in memory (lost on restart, not shared)."""
    url: str | None = None
    """PostgreSQL (``postgresql://...``): one ledger every replica shares (exclusive with ``path``)."""
    pool_max_size: int = Field(4, ge=1)
    """PostgreSQL only: connections per gateway process."""
    buffer_max_writes: int = Field(100_000, ge=256)
    """PostgreSQL only: attempts queued while the database is unreachable; beyond, they are dropped
    (counted in ``tokenplane_ledger_dropped_writes_total``)."""
    timeout_s: float = Field(5.0, gt=0)
    """PostgreSQL only: to connect, and to wait for a pooled connection."""
    memory_max_settled: int = Field(DEFAULT_MAX_SETTLED, ge=0)
    """In memory only: settled workflows kept readable (oldest forgotten first; totals keep them)."""
    abandon_after_s: float = Field(600.0, gt=0)
    sweep_interval_s: float = Field(30.0, gt=0)
    prefill_tokens_per_s: float = Field(10_000.0, gt=0)
    decode_tokens_per_s: float = Field(2_000.0, gt=0)
    """Fallback throughput for instances neither configured nor known to the twin's catalogue."""

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a PostgreSQL URL (postgresql://user@host:port/database)")
        return v

    @model_validator(mode="after")
    def _one_store(self) -> LedgerConfig:
        if self.url is not None and self.path is not None:
            raise ValueError("give path (SQLite) or url (PostgreSQL), not both")
        return self


class TracingConfig(_Strict):
    """OpenTelemetry spans per request (:mod:`tokenplane.gateway.tracing`); off without an endpoint."""

    otlp_endpoint: str | None = None
    """OTLP/HTTP collector base URL (``/v1/traces`` is appended unless the URL has a path)."""
    service_name: str = "tokenplane-gateway"
    sample_ratio: float = Field(1.0, ge=0, le=1)


class StateConfig(_Strict):
    """Where replicas keep what they must agree on (:mod:`tokenplane.shared_state`).

    ``memory``: this process only (one replica). ``redis``: tenant concurrency and rate limits,
    breaker transitions and the prefix index are shared through the Redis at ``url``, under
    ``key_prefix``; on a Redis failure the replica goes on with its local state (fail open)."""

    backend: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field("tokenplane:", min_length=1)
    timeout_s: float = Field(0.25, gt=0)
    """A Redis call slower than this counts as a failure: the request goes on with local state."""
    lease_ttl_s: float = Field(10.0, gt=0)
    """A concurrency slot's lease; renewed every third of it while the request runs, so a killed
    replica's slots are free again within this time."""
    sync_interval_s: float = Field(0.1, gt=0)
    """How often routing observations are published to the other replicas (in one message). A
    turn is published when it is routed, so only a next turn sent less than this after the
    previous one was routed can miss it."""
    retry_connect_s: float = Field(0.5, gt=0)
    """While Redis is down, how often the replica tries it again."""
    cache_max_entry_bytes: int = Field(1 << 20, ge=1)
    """The largest response cache entry shared through Redis (larger answers stay local)."""

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return url


class GatewayConfig(_Strict):
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
