"""Deferral (only when some tenant may defer): a deferrable request waits in its model's deferral
room for spare capacity (:mod:`~tokenplane.gateway.deferral`), then is admitted at batch priority.
On the way out, an admitted request's end may let a deferred one in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from tokenplane.gateway.admission import PoolAdmission
from tokenplane.gateway.deferral import DeferralRoom, wants_deferral
from tokenplane.gateway.errors import NoHealthyInstance
from tokenplane.gateway.stages.context import RequestContext


class Deferral:
    __slots__ = ("allowed", "always", "pools", "retry_after", "rooms")

    def __init__(
        self,
        rooms: Mapping[str, DeferralRoom],
        pools: Mapping[str, PoolAdmission],
        always: frozenset[str],
        allowed: frozenset[str],
        retry_after: Callable[[str, float], float],
    ) -> None:
        self.rooms = rooms
        self.pools = pools
        self.always = always
        self.allowed = allowed
        self.retry_after = retry_after

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        tenant = ctx.tenant
        if tenant not in self.allowed or (
            tenant not in self.always and not wants_deferral(ctx.client.headers)
        ):
            return None
        if self.pools[ctx.model].capacity() <= 0:  # nothing to wait for
            raise NoHealthyInstance(
                f"no healthy instance serves {ctx.model!r} right now",
                retry_after_s=self.retry_after(ctx.model, ctx.arrival),
            )
        return self._wait(ctx)

    async def _wait(self, ctx: RequestContext) -> None:
        wf = ctx.info.workflow if ctx.info is not None else None
        await self.rooms[ctx.model].wait(ctx.arrival, wf.deadline_s if wf is not None else None)
        ctx.deferred = True

    def exit(self, ctx: RequestContext) -> None:
        if ctx.admitted:
            self.rooms[ctx.model].notify()
