"""Admission: the model's pool admits the request now, queues it by priority, or refuses it (429,
503 when nothing serves the model); the slot is given back on the way out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from tokenplane.core.admission import Admission as QueueAdmission
from tokenplane.core.admission import PriorityClass
from tokenplane.core.views import RequestInfo
from tokenplane.gateway.admission import PRIORITY_HEADER, PoolAdmission, priority_for
from tokenplane.gateway.errors import NoHealthyInstance
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.stages.pipeline import Clock
from tokenplane.gateway.tracing import NULL_TRACE


class Admission:
    __slots__ = ("clock", "pools", "retry_after")

    def __init__(
        self, pools: Mapping[str, PoolAdmission], retry_after: Callable[[str, float], float], clock: Clock
    ) -> None:
        self.pools = pools
        self.retry_after = retry_after
        self.clock = clock

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        pool = self.pools[ctx.model]
        capacity: int | None = None
        if ctx.deferred:
            priority = PriorityClass.BATCH  # the capacity it waited for may have changed meanwhile
        else:
            capacity = pool.capacity()
            if capacity <= 0:
                raise NoHealthyInstance(
                    f"no healthy instance serves {ctx.model!r} right now",
                    retry_after_s=self.retry_after(ctx.model, ctx.arrival),
                )
            hints = ctx.hints
            if hints is not None and hints.requested_priority is not None:
                priority = PriorityClass.from_value(hints.priority)
            else:
                tenant = ctx.caller
                assert tenant is not None
                header = ctx.client.headers.get(PRIORITY_HEADER)
                priority = priority_for(tenant.priority, header, tenant.allow_priority_raise)
        info = ctx.info
        assert info is not None
        if ctx.trace is not NULL_TRACE:
            return self._admit(ctx, pool, priority, capacity)
        # Tracing off: the offer without a coroutine; only a queued request has one to wait in.
        adm = pool.offer(info, priority, ctx.arrival, capacity)
        if not adm.admitted:
            return self._wait(ctx, pool, info, adm)
        ctx.deadline_s = adm.deadline_s
        ctx.admitted = True
        return None

    async def _wait(
        self, ctx: RequestContext, pool: PoolAdmission, info: RequestInfo, adm: QueueAdmission
    ) -> None:
        ctx.deadline_s = await pool.wait(info, adm, ctx.arrival)
        ctx.admitted = True

    async def _admit(
        self, ctx: RequestContext, pool: PoolAdmission, priority: PriorityClass, capacity: int | None
    ) -> None:
        trace = ctx.trace
        info = ctx.info
        assert info is not None
        span = trace.begin_admission(priority)  # (enum properties cost: the trace reads them)
        started = self.clock()
        ctx.deadline_s = await pool.admit(info, priority, ctx.arrival, capacity)
        ctx.admitted = True
        trace.admitted(span, started)

    def exit(self, ctx: RequestContext) -> None:
        if ctx.admitted:
            assert ctx.info is not None
            self.pools[ctx.model].release(info=ctx.info)
