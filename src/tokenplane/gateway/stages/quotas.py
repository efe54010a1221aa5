"""Shared tenant limits (only when a tenant has a per-minute limit, or the state backend is Redis).

After the tenant limits stage (which holds the tenant's local concurrency slot and describes the
request): the tenant's and the API key's requests- and tokens-per-minute limits, and with Redis the
tenant's concurrency limit across every replica (:mod:`tokenplane.shared_state`). A refusal is 429
``rate_limit_exceeded`` or ``concurrency_limit_exceeded`` with ``Retry-After``. On the way out the
request's completion tokens are charged and its concurrency lease freed (with Redis, batched off
the request path).

Interpreted on purpose (not in ``COMPILED_MODULES``): it is in the chain only when configured.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter

from tokenplane.gateway.config import TenantConfig
from tokenplane.gateway.errors import TenantConcurrencyExceeded, TenantRateLimited
from tokenplane.gateway.header_memo import HeaderMemo
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.shared_state.quotas import WINDOW_S, LocalQuotas, QuotaDecision, QuotaReason, TenantQuota
from tokenplane.shared_state.redis_backend import RedisState

MAX_KEY_IDS = 4096


def tenant_quotas(tenants: Sequence[TenantConfig], *, shared_concurrency: bool) -> dict[str, TenantQuota]:
    """The tenants with a limit this stage enforces (concurrency only when it is shared)."""
    out: dict[str, TenantQuota] = {}
    for t in tenants:
        q = TenantQuota(
            t.name,
            concurrency=(t.max_concurrency or 0) if shared_concurrency else 0,
            rpm=t.rpm_limit or 0,
            tpm=t.tpm_limit or 0,
            key_rpm=t.key_rpm_limit or 0,
            key_tpm=t.key_tpm_limit or 0,
        )
        if q.rated or q.concurrency:
            out[t.name] = q
    return out


class KeyIds:
    """A stable id of the caller's API key (the same on every replica: a SHA-256 of the header),
    remembered per header without keeping the header, in a
    :class:`~tokenplane.gateway.header_memo.HeaderMemo` of at most :data:`MAX_KEY_IDS` headers. An
    id is a digest of its header, so it never goes stale: nothing ever needs to clear the memo."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: HeaderMemo[str] = HeaderMemo(MAX_KEY_IDS)

    def __call__(self, authorization: str) -> str:
        key_id = self._ids.get(authorization)
        if key_id is None:
            key_id = hashlib.sha256(authorization.encode("utf-8", "replace")).hexdigest()[:24]
            self._ids.put(authorization, key_id)
        return key_id

    def __len__(self) -> int:
        return len(self._ids)


class Quotas:
    """The stage (see the module docstring); ``shared`` None: the memory backend."""

    def __init__(
        self,
        quotas: Mapping[str, TenantQuota],
        shared: RedisState | None,
        registry: CollectorRegistry,
        window_s: float = WINDOW_S,
    ) -> None:
        self.quotas = quotas
        self.shared = shared
        self.local = LocalQuotas(window_s)
        self._held: dict[int, tuple[TenantQuota, str, str, bool]] = {}
        self.key_ids = KeyIds()
        self.refused = Counter(
            "tokenplane_quota_refusals",
            "Requests refused by a tenant's shared limits, by the limit that refused",
            ["tenant", "reason"],
            registry=registry,
        )

    def _key_id(self, ctx: RequestContext) -> str:
        return self.key_ids(ctx.client.headers.get("Authorization") or "")

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        tenant = ctx.caller
        assert tenant is not None and ctx.parsed is not None and ctx.info is not None
        quota = self.quotas.get(tenant.name)
        if quota is None:
            return None
        key_id = self._key_id(ctx) if (quota.key_rpm or quota.key_tpm) else ""
        tokens = ctx.parsed.prompt_tokens
        if self.shared is None:
            self._settle(ctx, quota, key_id, "", self.local.acquire(quota, key_id, tokens, time.time()))
            return None
        return self._enter_shared(ctx, quota, key_id, tokens)

    async def _enter_shared(self, ctx: RequestContext, quota: TenantQuota, key_id: str, tokens: int) -> None:
        assert self.shared is not None and ctx.info is not None
        member = self.shared.replica_id + ":" + ctx.info.request_id
        decision = await self.shared.acquire(quota, key_id, member, tokens)
        self._settle(ctx, quota, key_id, member, decision)

    def _settle(
        self, ctx: RequestContext, quota: TenantQuota, key_id: str, member: str, decision: QuotaDecision
    ) -> None:
        if decision.admit:
            self._held[id(ctx)] = (quota, key_id, member, decision.shared)
            return
        self.refused.labels(quota.tenant, decision.reason.value).inc()
        if decision.reason is QuotaReason.CONCURRENCY:
            raise TenantConcurrencyExceeded(
                f"tenant {quota.tenant!r} already has {quota.concurrency} requests in flight across "
                f"the gateway's replicas (max_concurrency {quota.concurrency})",
                retry_after_s=decision.retry_after_s,
            )
        what = {
            QuotaReason.TENANT_RPM: f"tenant {quota.tenant!r} has used its {quota.rpm} requests per minute",
            QuotaReason.TENANT_TPM: f"tenant {quota.tenant!r} has used its {quota.tpm} tokens per minute",
            QuotaReason.KEY_RPM: f"this API key has used its {quota.key_rpm} requests per minute",
            QuotaReason.KEY_TPM: f"this API key has used its {quota.key_tpm} tokens per minute",
        }[decision.reason]
        raise TenantRateLimited(
            f"{what}; retry in {decision.retry_after_s:.0f} s", retry_after_s=decision.retry_after_s
        )

    def exit(self, ctx: RequestContext) -> None:
        held = self._held.pop(id(ctx), None)
        if held is None:
            return
        quota, key_id, member, shared = held
        tokens = ctx.completion_tokens or ctx.events_sent
        if self.shared is None:
            self.local.charge(quota, key_id, tokens, time.time())
        else:
            self.shared.release(quota, key_id, member, tokens, shared=shared)
