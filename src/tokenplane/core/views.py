"""Immutable views that the shells (simulator, gateway) hand to policies.

They are frozen ``msgspec.Struct``s rather than frozen dataclasses: the twin builds one
``RequestInfo`` per request and an ``InstanceView`` per instance state change, and a Struct is about
ten times cheaper to construct (measured: 0.15 µs against 1.7 µs for twelve fields).

Policies read these and nothing else: no sockets, no clocks, no engine internals. The simulator and
the gateway build the same views from their own state, which is what makes a twin run a faithful
rehearsal of production.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

import msgspec

InstanceId = str

_EMPTY_LABELS: Mapping[str, str] = MappingProxyType({})


def _empty_labels() -> Mapping[str, str]:
    return _EMPTY_LABELS


class WorkflowContext(msgspec.Struct, frozen=True):
    """Where a request sits in a multi-step task (request R at step 3 of 5)."""

    workflow_id: str
    step: int = 1
    total_steps: int | None = None
    sunk_cost_usd: float = 0.0
    deadline_s: float | None = None


class RequestInfo(msgspec.Struct, frozen=True):
    """What a policy may know about one request before it runs.

    ``block_hashes`` is the chain of prompt-block hashes (one per full block of
    ``hash_block_tokens`` tokens, each hash covering every token before it), computed once per
    request by the shell and reused by every policy that needs prefix overlap.
    """

    request_id: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 16
    tenant: str = "default"
    priority: int = 0
    arrival_s: float = 0.0
    workflow: WorkflowContext | None = None
    latency_budget_s: float | None = None  # time-to-first-token budget counted from arrival_s
    cached_prefix_tokens: Mapping[InstanceId, int] | None = None
    """Exact leading prompt tokens each instance holds in its KV cache, when the shell knows them
    (the gateway's precise mode, from vLLM's KV events); instances not named hold none. ``None``:
    unknown, and prefix-aware routers fall back to their own approximate index."""
    adapter: str | None = None
    """The LoRA adapter the request asks for (vLLM serves adapters as model names); None: the base."""


class InstanceView(msgspec.Struct, frozen=True):
    """One serving instance as the control plane sees it.

    ``outstanding_*`` is the control plane's own accounting of work it has sent and not yet seen
    finish (the freshest signal); ``running``/``waiting``/``kv_usage`` are what the instance itself
    last reported (in the gateway, scraped from its metrics; in the twin, read at the last event).
    """

    instance_id: InstanceId
    model: str = ""
    gpu: str = ""
    ready: bool = True
    healthy: bool = True
    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_capacity_tokens: int = 0
    price_per_hour: float = 0.0
    weights: str = "warm"  # model-weight readiness: warm, warming or cold
    hbm_free_bytes: int = 0
    predicted_ttft_s: float = 0.0
    labels: Mapping[str, str] = msgspec.field(default_factory=_empty_labels)
    adapters: frozenset[str] = frozenset()
    """LoRA adapters resident on the instance (vLLM's ``vllm:lora_requests_info``; the twin's slots)."""
    peer_outstanding_requests: int = 0
    peer_outstanding_tokens: int = 0
    """The other control planes' ``outstanding_*`` on the instance (other gateway replicas, shared
    through the state backend as of its last sync); 0 where none shares them (one replica, the twin)."""


class RouteReason(StrEnum):
    """Why a router chose what it chose; stable values, used as metric labels."""

    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    LEAST_REQUESTS = "least_requests"
    LEAST_TOKENS = "least_tokens"
    POWER_OF_TWO = "power_of_two"
    PREFIX_MATCH = "prefix_match"
    PREFIX_MISS_LEAST_LOADED = "prefix_miss_least_loaded"
    KV_CACHE_MATCH = "kv_cache_match"  # an exact match in an instance's reported KV cache
    KV_CACHE_MISS_LEAST_LOADED = "kv_cache_miss_least_loaded"  # exact: no instance holds enough
    LOAD_IMBALANCE = "load_imbalance"
    WEIGHTED_SCORE = "weighted_score"
    NO_CANDIDATES = "no_candidates"


class RouteDecision(msgspec.Struct, frozen=True):
    """The instance a router picked, and why."""

    instance_id: InstanceId | None
    reason: RouteReason
    scores: Mapping[InstanceId, float] | None = None

    @property
    def routed(self) -> bool:
        return self.instance_id is not None
