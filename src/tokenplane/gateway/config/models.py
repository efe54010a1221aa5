"""Served models: names, aliases and adapters, the router, and the per-model Avoid/Move/Delay
sections (response cache, fallback chain, deferral, KV working set)."""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field, field_validator

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.routing import build_router
from tokenplane.gateway.config.base import Strict
from tokenplane.gateway.disagg.config import PoolConfig
from tokenplane.gateway.tokenization.config import TokenizerConfig

DEFAULT_ROUTER = "prefix-affinity"


class ResponseCacheConfig(Strict):
    """Exact response cache for deterministic requests (:mod:`~tokenplane.gateway.response_cache`)."""

    enabled: bool = True
    ttl_s: float = Field(60.0, gt=0)
    max_entries: int = Field(1024, ge=1)
    max_bytes: int = Field(64 << 20, ge=1)


FallbackReason = Literal["overloaded", "quality_ok"]
QualityClass = Literal["any", "standard", "best"]


class FallbackConfig(Strict):
    """One link of a model's fallback chain (:mod:`~tokenplane.gateway.fallback`)."""

    model: str = Field(min_length=1)
    when: tuple[FallbackReason, ...] = ("overloaded", "quality_ok")
    quality: QualityClass = "standard"
    """The quality the fallback model offers: a request asking for more never moves to it."""


class DeferralConfig(Strict):
    """The deferrable class's waiting room (:mod:`~tokenplane.gateway.deferral`)."""

    max_waiting: int = Field(256, ge=0)
    spare_fraction: float = Field(0.5, gt=0, le=1)
    """Deferred requests go once the pool's admitted and queued requests are below this share of
    its capacity."""
    max_wait_s: float = Field(600.0, gt=0)
    """Deadline when the request brings none (a workflow ``deadline_s`` is used when sooner)."""


class ModelConfig(Strict):
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
    pool: PoolConfig = PoolConfig()
    """``colocated`` (default) or ``disaggregated`` prefill/decode (:mod:`..disagg.config`)."""
    tokenizer: TokenizerConfig | None = None
    """The model's tokenizer (a local folder, or the instances' ``/tokenize``): chat and text
    prompts are then matched exactly against the instances' KV events. Off unless given."""

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
