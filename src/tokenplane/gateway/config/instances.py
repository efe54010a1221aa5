"""Instances: where each runs and on which runtime, its KV-event feed, and how the gateway scrapes
and health-checks them."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from tokenplane.gateway.config.base import Strict
from tokenplane.gateway.disagg.config import InstanceRole

DEFAULT_SCRAPE_INTERVAL_S = 1.0
DEFAULT_SCRAPE_TIMEOUT_S = 5.0
DEFAULT_HEALTH_INTERVAL_S = 2.0
DEFAULT_FAILURES_TO_DOWN = 2
DEFAULT_HEALTH_PATH = "/health"
DEFAULT_METRICS_PATH = "/metrics"
DEFAULT_INSTANCE_MAX_CONCURRENCY = 256


class InstanceKind(StrEnum):
    """The runtime behind an instance; each value has an adapter in :mod:`tokenplane.gateway.runtimes`."""

    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMACPP = "llamacpp"
    EMULATED = "emulated"
    OPENAI = "openai"


class KvEventsConfig(Strict):
    """Where the gateway BINDS a ZMQ SUB socket for this instance's vLLM KV events (vLLM's
    ``--kv-events-config`` connects its publisher to the same endpoint); see
    :mod:`tokenplane.gateway.kv_events`. Needs the ``kv-events`` extra (pyzmq)."""

    endpoint: str = Field(min_length=1)
    topic: str = "kv"
    connect: bool = False
    """Connect to a publisher that binds (vLLM given ``tcp://*:PORT`` binds): then every gateway
    replica subscribes to the same instance's events. Default: bind, and vLLM connects here."""

    @field_validator("endpoint")
    @classmethod
    def _zmq(cls, endpoint: str) -> str:
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("must be a ZMQ endpoint (tcp://HOST:PORT, ipc://PATH)")
        return endpoint


class InstanceConfig(Strict):
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
    role: InstanceRole = "both"
    """In a disaggregated pool: ``prefill``, ``decode`` or ``both`` (:mod:`..disagg.config`)."""

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


class ScrapeConfig(Strict):
    """Runtime metrics scrapes. ``timeout_s`` is independent of the interval: a runtime busy with a
    burst answers ``/metrics`` late, and a late scrape still gives a fresher view than none (the
    view's ``scraped_at`` says how fresh it is); rounds do not overlap."""

    interval_s: float = Field(DEFAULT_SCRAPE_INTERVAL_S, gt=0)
    timeout_s: float = Field(DEFAULT_SCRAPE_TIMEOUT_S, gt=0)
    enabled: bool = True


class HealthConfig(Strict):
    """Active health checks. ``failures_to_down`` consecutive failures (checks and requests alike)
    take an instance out; a check that times out while the instance kept sending answers is not
    counted (busy, not down); one answered check brings it back."""

    interval_s: float = Field(DEFAULT_HEALTH_INTERVAL_S, gt=0)
    failures_to_down: int = Field(DEFAULT_FAILURES_TO_DOWN, ge=1)
    path: str = DEFAULT_HEALTH_PATH
    timeout_s: float = Field(2.0, gt=0)
