"""The resilience slices of the gateway config: retries, circuit breakers, admission and shedding.

Shape (every key optional; defaults are the core's)::

    retry:
      budget_ratio: 0.2          # retries <= ratio x first attempts + min_per_s x window_s
      min_per_s: 1.0
      token_ratio: null          # null: budget_ratio
      min_tokens_per_s: 2000
      window_s: 10
      max_attempts: 3            # first + retries + continuations
      backoff_base_s: 0.05
      backoff_multiplier: 2
      backoff_max_s: 1.0
      first_byte_timeout_s: null # an attempt with no response headers by then fails (null: none)
      stream_idle_timeout_s: 60  # a stream silent this long after its first token moves on
    breaker: {consecutive_failures: 5, window_s: 30, error_rate: 0.5, cooldown_s: 5, ...}
    admission:
      queue: {max_depth: 1024, max_per_tenant: 256, budget_s: {interactive: 30}, ...}
      shedding: {thresholds: {batch: {max_queue_depth: 64, max_queue_wait_s: 5}, ...}}

``breaker``, ``admission.queue`` and ``admission.shedding`` are the core policies' params, checked
here by building the policy once so a typo fails at start with the field's path.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenplane.core.admission import AdmissionQueue
from tokenplane.core.breaker import BreakerConfig
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.retry_budget import (
    DEFAULT_MIN_PER_S,
    DEFAULT_MIN_TOKENS_PER_S,
    DEFAULT_RATIO,
    DEFAULT_WINDOW_S,
)
from tokenplane.core.shedding import LoadShedder


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_STREAM_IDLE_TIMEOUT_S = 60.0
"""Between tokens a live engine is silent for at most a few seconds (a long prefill batched in)."""


class RetryConfig(_Strict):
    budget_ratio: float = Field(DEFAULT_RATIO, ge=0)
    min_per_s: float = Field(DEFAULT_MIN_PER_S, ge=0)
    token_ratio: float | None = Field(None, ge=0)
    min_tokens_per_s: float = Field(DEFAULT_MIN_TOKENS_PER_S, ge=0)
    window_s: float = Field(DEFAULT_WINDOW_S, gt=0)
    max_attempts: int = Field(3, ge=1)
    backoff_base_s: float = Field(0.05, ge=0)
    backoff_multiplier: float = Field(2.0, ge=1)
    backoff_max_s: float = Field(1.0, ge=0)
    first_byte_timeout_s: float | None = Field(None, gt=0)
    stream_idle_timeout_s: float | None = Field(DEFAULT_STREAM_IDLE_TIMEOUT_S, gt=0)
    """A stream silent this long after its first token is continued on another instance (a hung
    sequence or GPU); the instance is judged by it only if it answered nobody else meanwhile.
    ``null``: only ``limits.upstream_timeout_s`` bounds the silence."""

    def budget_params(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ratio": self.budget_ratio,
            "min_per_s": self.min_per_s,
            "min_tokens_per_s": self.min_tokens_per_s,
            "window_s": self.window_s,
        }
        if self.token_ratio is not None:
            out["token_ratio"] = self.token_ratio
        return out

    def policy_params(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "backoff_base_s": self.backoff_base_s,
            "backoff_multiplier": self.backoff_multiplier,
            "backoff_max_s": self.backoff_max_s,
        }


def _checked(build: Any, params: dict[str, Any]) -> dict[str, Any]:
    try:
        build(params)
    except InvalidPolicyConfig as exc:
        raise ValueError(str(exc)) from None
    return params


class BreakerParams(_Strict):
    """The core :class:`~tokenplane.core.breaker.BreakerConfig` params, validated as a whole."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def build(self) -> BreakerConfig:
        return BreakerConfig.from_params(self.params())

    def model_post_init(self, context: Any) -> None:
        try:
            self.build()
        except InvalidPolicyConfig as exc:
            raise ValueError(str(exc)) from None


class AdmissionParams(_Strict):
    queue: dict[str, Any] = Field(default_factory=dict)
    shedding: dict[str, Any] = Field(default_factory=dict)

    @field_validator("queue")
    @classmethod
    def _queue(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _checked(AdmissionQueue.from_params, v)

    @field_validator("shedding")
    @classmethod
    def _shedding(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _checked(LoadShedder.from_params, v)
