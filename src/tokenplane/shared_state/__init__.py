"""What several gateway replicas share: the state backends (``state: {backend: memory | redis}``).

* :mod:`~tokenplane.shared_state.quotas`: per-minute request and token limits (local buckets:
  the ``memory`` backend, and every backend's fallback);
* :mod:`~tokenplane.shared_state.redis_backend`: the ``redis`` backend (limits by Lua script,
  concurrency by leases, breakers and the prefix index by pub/sub; fail open on local state);
* :mod:`~tokenplane.shared_state.routing`: the prefix index shared between replicas;
* :mod:`~tokenplane.shared_state.in_flight`: each instance's in-flight work, fleet-wide (for the
  KV survival estimate).

The README's "Several replicas" section says what each backend guarantees.
"""

from tokenplane.shared_state.quotas import LocalQuotas, QuotaDecision, QuotaReason, TenantQuota

__all__ = ["LocalQuotas", "QuotaDecision", "QuotaReason", "TenantQuota"]
