"""Faults the twin can inject, and the client behaviour that turns them into cascades.

Faults (scenario key ``faults``), each at a virtual time on one instance (by index):

* ``slow``: step times multiplied by ``factor`` for ``duration_s`` (a degraded GPU is slow, not
  dead: thermal throttling, a bad HBM stack, a noisy neighbour on the host);
* ``lose``: the instance dies mid-work: its in-flight requests and KV vanish; with
  ``replace_after_s`` a replacement joins after that warm-up;
* ``drain``: maintenance with notice: no new work from ``at_s``; whatever is still running at
  ``at_s + notice_s`` is lost; back after ``replace_after_s`` if given.

Clients (scenario key ``clients``) give up on an attempt after ``timeout_s`` and retry per
``retry``: ``none``, ``naive`` (at once), ``backoff`` (exponential with jitter). Without a control
plane, a client that gives up does not stop the work it started: it keeps burning GPU time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["slow", "lose", "drain"]
    instance: int = Field(ge=0)
    at_s: float = Field(ge=0)
    duration_s: float | None = Field(None, gt=0)
    factor: float = Field(5.0, gt=0)
    notice_s: float = Field(30.0, ge=0)
    replace_after_s: float | None = Field(None, ge=0)


class ClientSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(None, gt=0)
    retry: Literal["none", "naive", "backoff"] = "none"
    max_attempts: int = Field(4, ge=1)
    backoff_base_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    retry_on_error: bool = True


class ControlSpec(BaseModel):
    """What tokenplane's control plane does in the twin (all off: a bare fleet)."""

    model_config = ConfigDict(extra="forbid")

    cancel_on_timeout: bool = False
    continuation: bool = False
    retry_elsewhere: bool = False
    breaker: dict[str, Any] | None = None  # core BreakerConfig params; {} for the defaults
    retry_budget: dict[str, Any] | None = None  # core RetryBudget params; {} for the defaults
