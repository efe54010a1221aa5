"""Tenants: their API keys (stored hashed), priority class, model list and limits."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from tokenplane.gateway.config.base import Strict

DEFAULT_TENANT = "default"
PriorityClass = Literal["interactive", "standard", "batch", "deferrable"]
PRIORITY_VALUES: Mapping[str, int] = {"interactive": 1, "standard": 0, "batch": -1, "deferrable": -1}
"""``RequestInfo.priority`` per class: higher is more urgent; ``standard`` is the core's default 0.
``deferrable`` is the batch class that first waits for spare capacity (see
:mod:`~tokenplane.gateway.deferral`)."""
_HASHED_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")


def hash_key(raw: str) -> str:
    """The stored form of an API key: ``sha256:`` + the hex digest of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()


class TenantConfig(Strict):
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
