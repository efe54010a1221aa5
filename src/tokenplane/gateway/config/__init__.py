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

One module per concept: ``edge`` (listen, edge, limits, drain, reload), ``tenants``, ``models``,
``instances`` (instances, scrape, health), ``discovery``, ``state`` (shared state, ledger, tracing),
``file`` (the whole file, parsing and loading); every name is importable from here.
"""

from __future__ import annotations

from tokenplane.gateway.config.base import (
    Strict as Strict,
)
from tokenplane.gateway.config.discovery import (
    DiscoveryConfig as DiscoveryConfig,
)
from tokenplane.gateway.config.discovery import (
    KubernetesDiscoveryConfig as KubernetesDiscoveryConfig,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_BODY_TIMEOUT_S as DEFAULT_BODY_TIMEOUT_S,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_CONNECT_TIMEOUT_S as DEFAULT_CONNECT_TIMEOUT_S,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_HEADER_TIMEOUT_S as DEFAULT_HEADER_TIMEOUT_S,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_HOST as DEFAULT_HOST,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_KEEPALIVE_TIMEOUT_S as DEFAULT_KEEPALIVE_TIMEOUT_S,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_MAX_FIELD_BYTES as DEFAULT_MAX_FIELD_BYTES,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_MAX_HEADERS as DEFAULT_MAX_HEADERS,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_MAX_PROMPT_TOKENS as DEFAULT_MAX_PROMPT_TOKENS,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_MAX_REQUEST_LINE_BYTES as DEFAULT_MAX_REQUEST_LINE_BYTES,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_PORT as DEFAULT_PORT,
)
from tokenplane.gateway.config.edge import (
    DEFAULT_UPSTREAM_TIMEOUT_S as DEFAULT_UPSTREAM_TIMEOUT_S,
)
from tokenplane.gateway.config.edge import (
    DrainConfig as DrainConfig,
)
from tokenplane.gateway.config.edge import (
    EdgeConfig as EdgeConfig,
)
from tokenplane.gateway.config.edge import (
    LimitsConfig as LimitsConfig,
)
from tokenplane.gateway.config.edge import (
    ListenConfig as ListenConfig,
)
from tokenplane.gateway.config.edge import (
    ReloadConfig as ReloadConfig,
)
from tokenplane.gateway.config.file import (
    GatewayConfig as GatewayConfig,
)
from tokenplane.gateway.config.file import (
    load_config as load_config,
)
from tokenplane.gateway.config.file import (
    parse_config as parse_config,
)
from tokenplane.gateway.config.instances import (
    DEFAULT_FAILURES_TO_DOWN as DEFAULT_FAILURES_TO_DOWN,
)
from tokenplane.gateway.config.instances import (
    DEFAULT_HEALTH_INTERVAL_S as DEFAULT_HEALTH_INTERVAL_S,
)
from tokenplane.gateway.config.instances import (
    DEFAULT_HEALTH_PATH as DEFAULT_HEALTH_PATH,
)
from tokenplane.gateway.config.instances import (
    DEFAULT_INSTANCE_MAX_CONCURRENCY as DEFAULT_INSTANCE_MAX_CONCURRENCY,
)
from tokenplane.gateway.config.instances import (
    DEFAULT_METRICS_PATH as DEFAULT_METRICS_PATH,
)
from tokenplane.gateway.config.instances import (
    DEFAULT_SCRAPE_INTERVAL_S as DEFAULT_SCRAPE_INTERVAL_S,
)
from tokenplane.gateway.config.instances import (
    DEFAULT_SCRAPE_TIMEOUT_S as DEFAULT_SCRAPE_TIMEOUT_S,
)
from tokenplane.gateway.config.instances import (
    HealthConfig as HealthConfig,
)
from tokenplane.gateway.config.instances import (
    InstanceConfig as InstanceConfig,
)
from tokenplane.gateway.config.instances import (
    InstanceKind as InstanceKind,
)
from tokenplane.gateway.config.instances import (
    KvEventsConfig as KvEventsConfig,
)
from tokenplane.gateway.config.instances import (
    ScrapeConfig as ScrapeConfig,
)
from tokenplane.gateway.config.models import (
    DEFAULT_ROUTER as DEFAULT_ROUTER,
)
from tokenplane.gateway.config.models import (
    DeferralConfig as DeferralConfig,
)
from tokenplane.gateway.config.models import (
    FallbackConfig as FallbackConfig,
)
from tokenplane.gateway.config.models import (
    FallbackReason as FallbackReason,
)
from tokenplane.gateway.config.models import (
    ModelConfig as ModelConfig,
)
from tokenplane.gateway.config.models import (
    QualityClass as QualityClass,
)
from tokenplane.gateway.config.models import (
    ResponseCacheConfig as ResponseCacheConfig,
)
from tokenplane.gateway.config.state import (
    LedgerConfig as LedgerConfig,
)
from tokenplane.gateway.config.state import (
    StateConfig as StateConfig,
)
from tokenplane.gateway.config.state import (
    TracingConfig as TracingConfig,
)
from tokenplane.gateway.config.tenants import (
    DEFAULT_TENANT as DEFAULT_TENANT,
)
from tokenplane.gateway.config.tenants import (
    PRIORITY_VALUES as PRIORITY_VALUES,
)
from tokenplane.gateway.config.tenants import (
    PriorityClass as PriorityClass,
)
from tokenplane.gateway.config.tenants import (
    TenantConfig as TenantConfig,
)
from tokenplane.gateway.config.tenants import (
    hash_key as hash_key,
)
from tokenplane.gateway.errors import ConfigError as ConfigError
