"""Tenants: who a caller is (by API key), their priority class and their concurrency limit.

Keys are stored hashed; a request's key is hashed (SHA-256) before anything is compared, and its
digest looked up in a dict: hash-then-compare, so the time a lookup takes depends on digests an
attacker cannot steer byte by byte, never on how much of a stored key a guess matches. No raw key is
kept, not even of the keys that authenticated. A key can be revoked while the gateway runs
(:meth:`Authenticator.revoke`, the ``POST /v1/keys/revoke`` route). With no tenants configured,
authentication is off and every caller is the ``default`` tenant.

The SHA-256 is most of what authentication costs a request, and a client sends the same header on
every request; so a header that authenticated is remembered in a
:class:`~tokenplane.gateway.header_memo.HeaderMemo`, by a keyed 128-bit tag only: a lookup still
compares digests only, and a raw key is still never kept. Only successes are remembered (guesses
cannot crowd out callers), at most :data:`MEMO_SIZE` headers, and a revocation forgets them all.

:meth:`Tenant.acquire` is a hard bound on the tenant's requests in flight (``max_concurrency``,
refused at once with 429 and ``Retry-After``). Queueing, priorities and fair sharing between tenants
come after it, in :mod:`~tokenplane.gateway.admission` (the core admission queue per pool).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenplane.gateway.config import DEFAULT_TENANT, PRIORITY_VALUES, TenantConfig
from tokenplane.gateway.errors import AuthenticationFailed, TenantConcurrencyExceeded
from tokenplane.gateway.header_memo import HeaderMemo

try:  # CPython's own SHA-256: hashlib's is OpenSSL's, which sets up an EVP context per call (~1,500
    # instructions more per request, measured under callgrind); the digest is the same
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - a Python without the module (3.12 renamed it _sha2)
    from hashlib import sha256 as _sha256

RETRY_AFTER_S = 1.0
MEMO_SIZE = 1024
"""Authorization headers remembered as authenticated (by their keyed digest) at most."""


class Tenant:
    __slots__ = (
        "allow_priority_raise",
        "allowed_models",
        "continuation",
        "in_flight",
        "max_concurrency",
        "name",
        "priority",
    )

    def __init__(
        self,
        name: str,
        priority: int,
        max_concurrency: int | None,
        allowed_models: frozenset[str] | None,
        *,
        continuation: bool = True,
        allow_priority_raise: bool = False,
    ) -> None:
        self.name = name
        self.continuation = continuation
        self.allow_priority_raise = allow_priority_raise
        self.priority = priority
        self.max_concurrency = max_concurrency
        self.allowed_models = allowed_models
        self.in_flight = 0

    def acquire(self) -> None:
        """Take one concurrency slot, or refuse; pair with :meth:`release`."""
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            raise TenantConcurrencyExceeded(
                f"tenant {self.name!r} already has {self.in_flight} requests in flight "
                f"(max_concurrency {self.max_concurrency})",
                retry_after_s=RETRY_AFTER_S,
            )
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    def may_use(self, model_name: str) -> bool:
        return self.allowed_models is None or model_name in self.allowed_models


class Authenticator:
    def __init__(self, tenants: Sequence[TenantConfig]) -> None:
        self.enabled = bool(tenants)
        self.tenants: list[Tenant] = []
        self._by_digest: dict[str, Tenant] = {}
        self._memo: HeaderMemo[Tenant] = HeaderMemo(MEMO_SIZE)  # headers that authenticated
        for t in tenants:
            tenant = Tenant(
                t.name,
                PRIORITY_VALUES[t.priority],
                t.max_concurrency,
                None if t.models is None else frozenset(t.models),
                continuation=t.continuation,
                allow_priority_raise=t.allow_priority_raise,
            )
            self.tenants.append(tenant)
            for k in t.api_keys:
                self._by_digest[k.removeprefix("sha256:")] = tenant
        self.default = Tenant(DEFAULT_TENANT, PRIORITY_VALUES["standard"], None, None)
        if not self.enabled:
            self.tenants.append(self.default)

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant behind an ``Authorization: Bearer <key>`` header, or :class:`AuthenticationFailed`."""
        if not self.enabled:
            return self.default
        if not authorization:
            raise AuthenticationFailed(
                "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key"
            )
        known = self._memo.get(authorization)
        if known is not None:
            return known
        if authorization.startswith("Bearer "):  # the usual spelling: no partition, no lower()
            key = authorization[7:].strip()
        else:
            scheme, _, key = authorization.partition(" ")
            key = key.strip() if scheme.lower() == "bearer" else ""
        if not key:
            raise AuthenticationFailed("the Authorization header must be 'Bearer <key>'")
        tenant = self._by_digest.get(_sha256(key.encode("utf-8", "replace")).hexdigest())
        if tenant is None:
            raise AuthenticationFailed("invalid API key")
        self._memo.put(authorization, tenant)
        return tenant

    def revoke(self, tenant: Tenant, key_hash: str) -> bool:
        """Stop accepting one of ``tenant``'s keys, given in its stored form (``sha256:<hex>``);
        ``False`` when it is not a key of that tenant (already revoked, or another tenant's).
        In memory: the key is back after a restart unless it is also taken out of the config."""
        digest = key_hash.removeprefix("sha256:")
        if self._by_digest.get(digest) is not tenant:
            return False
        del self._by_digest[digest]
        self._memo.clear()  # (which headers carried that key is not known: none is kept)
        return True
