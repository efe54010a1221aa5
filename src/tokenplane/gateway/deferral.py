"""Delay: the deferrable class waits for spare capacity, up to its deadline.

A request is deferrable when its tenant's priority is ``deferrable``, or when it carries
``x-tokenplane-deferrable: true`` and its tenant has ``allow_deferrable``. Before admission it waits
in a bounded waiting room (``models[].deferral.max_waiting``) until the pool has spare capacity:
its admitted and queued requests below ``spare_fraction`` of its capacity (``max_concurrency``
summed over usable instances). It then enters the admission queue as the ``batch`` class, so the
core queue's ordering, fairness and shedding still apply; the waiting room only holds it back while
the pool is busy with other work. A full room, or a deadline reached first (the workflow's
``deadline_s`` when given, else ``max_wait_s``), is a 503 with ``Retry-After``.

The waiting room is woken when a request of the pool finishes and polled by the gateway's
housekeeping (capacity that comes back with an instance); a woken waiter checks and enters
admission without yielding in between, so waking several at once cannot overshoot the threshold.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from tokenplane.gateway.admission import PoolAdmission
from tokenplane.gateway.config import DeferralConfig
from tokenplane.gateway.errors import PoolSaturated

DEFERRABLE_HEADER = "x-tokenplane-deferrable"
POLL_S = 0.1


def wants_deferral(headers: Mapping[str, str]) -> bool:
    raw = headers.get(DEFERRABLE_HEADER)
    return raw is not None and raw.strip().lower() in ("1", "true", "yes")


class DeferralRoom:
    """One pool's waiting room for deferrable requests."""

    def __init__(self, pool: PoolAdmission, config: DeferralConfig) -> None:
        self.pool = pool
        self.max_waiting = config.max_waiting
        self.spare_fraction = config.spare_fraction
        self.max_wait_s = config.max_wait_s
        self.waiting = 0
        self._changed = asyncio.Event()

    def spare(self) -> bool:
        pool = self.pool
        return pool.in_flight + pool.queue.depth < self.spare_fraction * pool.capacity()

    def notify(self) -> None:
        if self.waiting:
            self._changed.set()

    async def wait(self, now: float, deadline_s: float | None) -> None:
        """Return once the pool has spare capacity; raise :class:`PoolSaturated` when it will not."""
        if self.waiting == 0 and self.spare():
            return
        deadline = now + self.max_wait_s if deadline_s is None else min(deadline_s, now + self.max_wait_s)
        if self.waiting >= self.max_waiting:
            raise PoolSaturated(
                f"{self.pool.model!r} has {self.waiting} deferred requests waiting already",
                code="deferral_queue_full",
                retry_after_s=max(1.0, min(60.0, self.max_wait_s / 10)),
            )
        self.waiting += 1
        try:
            while not self.spare():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolSaturated(
                        f"no spare capacity on {self.pool.model!r} before the deferred request's deadline",
                        code="deferral_expired",
                        retry_after_s=max(1.0, min(60.0, self.max_wait_s / 10)),
                    )
                self._changed.clear()
                try:
                    async with asyncio.timeout(min(left, POLL_S)):
                        await self._changed.wait()
                except TimeoutError:
                    pass
        finally:
            self.waiting -= 1
