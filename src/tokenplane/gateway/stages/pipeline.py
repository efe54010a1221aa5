"""The shape of a stage, and the one loop that runs a request through the chain.

A stage is a pair: ``enter(ctx)`` does its work on the way in and returns ``None``, or an awaitable
when it has something to wait for (reading a body that has not all arrived, a deferral room,
the admission queue, the instance); ``exit(ctx)`` cleans up after it on the way out. ``exit`` runs
only for a stage whose ``enter`` (and its awaitable) completed, in reverse order, whatever
happened later; an ``enter`` that fails undoes its own work before raising. A stage ends the
request early by setting ``ctx.response`` (a cache hit): the stages after it are not entered.

Why not ``async handle(ctx, call_next)`` (Starlette's middleware): a chain of nested coroutines is
one coroutine made and one frame resumed per stage, per wake-up of the request. Most stages have
nothing to wait for; run by one loop they cost a call each, and the request's coroutine depth stays
what it was before stages existed (``bench/gateway_inproc.py --instructions``).

The runner maps a :class:`~tokenplane.gateway.errors.GatewayError` raised by any stage to its
OpenAI error answer, in one place, and records the outcome before the exits run (they read it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Protocol

from aiohttp import web

from tokenplane.gateway.edges.base import ClientStream
from tokenplane.gateway.errors import GatewayError, error_response
from tokenplane.gateway.proxy import OUTCOME_CLIENT_GONE
from tokenplane.gateway.stages.context import RequestContext

log = logging.getLogger(__name__)


class Stage(Protocol):
    """One concern of the request path (see the module docstring)."""

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None: ...

    def exit(self, ctx: RequestContext) -> None: ...


class Clock(Protocol):
    def __call__(self) -> float: ...


class Pipeline:
    """The stages in their order, run for each request."""

    __slots__ = ("clock", "exits", "stages")

    def __init__(self, stages: Sequence[Stage], clock: Clock) -> None:
        self.stages = tuple(stages)
        self.clock = clock
        # a stage with nothing to clean up says so (``cleans_up = False``): its exit is not called
        self.exits = tuple(s.exit if getattr(s, "cleans_up", True) else None for s in self.stages)

    async def run(self, client: ClientStream, endpoint: str) -> web.StreamResponse:
        """Run one request; returns what the edge sends (or the answer already sent)."""
        ctx = RequestContext(client, endpoint, self.clock())
        stages, exits = self.stages, self.exits  # a config reload swaps both; this request keeps these
        entered = 0
        try:
            for stage in stages:
                waiting = stage.enter(ctx)
                if waiting is not None:
                    await waiting
                entered += 1
                if ctx.response is not None:
                    break
        except GatewayError as exc:
            ctx.outcome = exc.outcome
            ctx.trace.refused(exc.status)
            ctx.response = error_response(exc)
        except BaseException as other:
            if not isinstance(other, Exception):  # cancelled: the client went away
                if not ctx.answered:  # (after the whole answer, it left as a client does)
                    ctx.outcome = OUTCOME_CLIENT_GONE
                raise
            log.exception("unexpected error in the request path")
            ctx.outcome = "internal_error"
            ctx.response = error_response(
                GatewayError("internal error in the gateway", code="internal_error")
            )
        finally:
            while entered:
                entered -= 1
                exit_ = exits[entered]
                if exit_ is not None:
                    exit_(ctx)
        out = ctx.response
        return out if out is not None else client.answer()


__all__ = ["Pipeline", "Stage"]
