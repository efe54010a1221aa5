"""What outlives a request or a process: the state replicas share, the workflow ledger, tracing."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tokenplane.gateway.config.base import Strict
from tokenplane.ledger.store import DEFAULT_MAX_SETTLED


class StateConfig(Strict):
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
    share_in_flight: bool = True
    """``redis``: share each instance's in-flight work between replicas (one script call per
    ``sync_interval_s``), so the KV survival estimate sees the fleet's queue, not this replica's."""
    rate_window_s: float = Field(60.0, gt=0)
    """The per-minute limits' window (``rpm_limit``, ``tpm_limit``, ...): 60 s; shorter in tests."""

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return url


class LedgerConfig(Strict):
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


class TracingConfig(Strict):
    """OpenTelemetry spans per request (:mod:`tokenplane.gateway.tracing`); off without an endpoint."""

    otlp_endpoint: str | None = None
    """OTLP/HTTP collector base URL (``/v1/traces`` is appended unless the URL has a path)."""
    service_name: str = "tokenplane-gateway"
    sample_ratio: float = Field(1.0, ge=0, le=1)
