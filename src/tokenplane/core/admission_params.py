"""The admission queue's parameters: their defaults, and how a config mapping is read into an
:class:`~tokenplane.core.admission.AdmissionQueue` (:func:`queue_from_params`, behind
:meth:`AdmissionQueue.from_params <tokenplane.core.admission.AdmissionQueue.from_params>`).

Params (:meth:`AdmissionQueue.from_params`)::

    max_depth: 1024                 # queued requests per pool
    max_per_tenant: 256             # queued requests per tenant in this pool
    max_in_flight: null             # default per-tenant in-flight limit (null: none)
    tenant_max_in_flight: {}        # per-tenant overrides
    tenant_weights: {}              # fair-share weights (> 0), default 1
    reserve: {}                     # class -> fraction of the pool's slots kept for it and above
    budget_s: {interactive: 30, standard: 120, batch: 3600}
    aging_s: null                   # null: strict priority
    retry_after_min_s: 1, retry_after_max_s: 60, retry_after_default_s: 5

What each one does is in :mod:`tokenplane.core.admission`'s docstring; ``window_s`` (default 60) is
the window of the counter store that fairness, reserves and ``retry_after_s`` read, when the caller
passes no store of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.priority import PriorityClass
from tokenplane.core.state_store import (
    CounterStore,
    GaugeStore,
    LocalGaugeStore,
    SlidingWindowCounterStore,
)

if TYPE_CHECKING:
    from tokenplane.core.admission import AdmissionQueue

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_PER_TENANT",
    "DEFAULT_RETRY_AFTER_DEFAULT_S",
    "DEFAULT_RETRY_AFTER_MAX_S",
    "DEFAULT_RETRY_AFTER_MIN_S",
    "DEFAULT_WINDOW_S",
    "queue_from_params",
]

DEFAULT_MAX_DEPTH = 1024
DEFAULT_MAX_PER_TENANT = 256
DEFAULT_BUDGET_S: Mapping[PriorityClass, float] = {
    PriorityClass.INTERACTIVE: 30.0,
    PriorityClass.STANDARD: 120.0,
    PriorityClass.BATCH: 3600.0,
}
DEFAULT_RETRY_AFTER_MIN_S = 1.0
DEFAULT_RETRY_AFTER_MAX_S = 60.0
DEFAULT_RETRY_AFTER_DEFAULT_S = 5.0
DEFAULT_WINDOW_S = 60.0


def queue_from_params(
    cls: type[AdmissionQueue],
    params: Mapping[str, Any],
    *,
    store: CounterStore | None = None,
    gauges: GaugeStore | None = None,
    pool: str = "default",
) -> AdmissionQueue:
    """A queue of class ``cls`` from its params (see the module docstring); raises
    :class:`~tokenplane.core.errors.InvalidPolicyConfig` on an unknown key or a bad value."""
    owner = "admission 'fair-queue'"
    keys = (
        "max_depth", "max_per_tenant", "max_in_flight", "tenant_max_in_flight", "tenant_weights",
        "reserve", "budget_s", "aging_s", "retry_after_min_s", "retry_after_max_s",
        "retry_after_default_s", "window_s",
    )  # fmt: skip
    r = ParamReader(owner, params, keys)

    def positive(key: str, default: float) -> float:
        return r.float_(key, default, min_value=0.0, exclusive_min=True)

    max_in_flight = None if r.raw("max_in_flight") is None else r.int_("max_in_flight", 0, min_value=1)
    aging_s = None if r.raw("aging_s") is None else positive("aging_s", 0.0)
    budgets = _mapping(owner, r.raw("budget_s"), "budget_s", 1e-9)
    reserves = _mapping(owner, r.raw("reserve"), "reserve", 0.0)
    limits = _mapping(owner, r.raw("tenant_max_in_flight"), "tenant_max_in_flight", 1)
    if any(v != int(v) for v in limits.values()):
        raise InvalidPolicyConfig(f"{owner}: tenant_max_in_flight values must be integers")
    return cls(
        store=store or SlidingWindowCounterStore(positive("window_s", DEFAULT_WINDOW_S)),
        gauges=gauges or LocalGaugeStore(),
        pool=pool,
        max_depth=r.int_("max_depth", DEFAULT_MAX_DEPTH, min_value=1),
        max_per_tenant=r.int_("max_per_tenant", DEFAULT_MAX_PER_TENANT, min_value=1),
        max_in_flight=max_in_flight,
        tenant_max_in_flight={k: int(v) for k, v in limits.items()},
        tenant_weights=_mapping(owner, r.raw("tenant_weights"), "tenant_weights", 1e-9),
        reserve={PriorityClass.from_name(k): v for k, v in reserves.items()},
        budget_s={PriorityClass.from_name(k): v for k, v in budgets.items()},
        aging_s=aging_s,
        retry_after_min_s=positive("retry_after_min_s", DEFAULT_RETRY_AFTER_MIN_S),
        retry_after_max_s=positive("retry_after_max_s", DEFAULT_RETRY_AFTER_MAX_S),
        retry_after_default_s=r.float_("retry_after_default_s", DEFAULT_RETRY_AFTER_DEFAULT_S, min_value=0),
    )


def _mapping(owner: str, raw: Any, key: str, min_value: float = 0.0) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidPolicyConfig(f"{owner}: param {key!r} must be a mapping, got {raw!r}")
    out: dict[str, float] = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < min_value:
            raise InvalidPolicyConfig(
                f"{owner}: param {key!r}[{k!r}] must be a number >= {min_value}, got {v!r}"
            )
        out[str(k)] = float(v)
    return out
