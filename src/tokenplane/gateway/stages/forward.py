"""Forward: drive the core retry plan (:func:`tokenplane.core.retry_budget.attempts`, through
:class:`~tokenplane.gateway.resilience.Resilience`) over the model's instances. Each attempt routes
again (the model's router over the views the breakers allow), sends the body re-encoded with the
instance's model name, and either answers the client or relays its stream; a stream broken after
its first token is continued on another instance and spliced into the same answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec

from tokenplane.core.retry_budget import Attempt, AttemptKind
from tokenplane.core.views import InstanceId, RequestInfo, RouteDecision
from tokenplane.gateway.catalog import ServedModel
from tokenplane.gateway.continuation import StreamSplicer, can_continue, continuation_body
from tokenplane.gateway.errors import GatewayError, NoHealthyInstance
from tokenplane.gateway.request import ParsedRequest
from tokenplane.gateway.resilience import Resilience
from tokenplane.gateway.stages.attempt import Attempts
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.tracing import NULL_TRACE
from tokenplane.gateway.upstreams import Upstream, UpstreamPool

_encode = msgspec.json.Encoder().encode


class Forward:
    __slots__ = ("attempts", "pool", "resilience", "retry_after", "upstream_timeout_s")

    def __init__(
        self,
        attempts: Attempts,
        pool: UpstreamPool,
        resilience: Resilience,
        retry_after: Callable[[str, float], float],
        upstream_timeout_s: float,
    ) -> None:
        self.attempts = attempts
        self.pool = pool
        self.resilience = resilience
        self.retry_after = retry_after
        self.upstream_timeout_s = upstream_timeout_s

    def route(
        self,
        info: RequestInfo,
        model: ServedModel,
        now: float,
        exclude: frozenset[InstanceId] = frozenset(),
    ) -> tuple[Upstream, RouteDecision]:
        """The model's router over the views of the instances its breakers allow (503 when none)."""
        views = self.resilience.candidates([u.view() for u in self.pool.for_model(model.name)], exclude, now)
        decision = model.router.select(info, views, now=now) if views else None
        iid = decision.instance_id if decision is not None else None
        upstream = self.pool.get(iid) if iid is not None else None
        if upstream is None or decision is None:
            raise NoHealthyInstance(
                f"no healthy instance serves {model.name!r} right now",
                retry_after_s=self.retry_after(model.name, now),
            )
        return upstream, decision

    def enter(self, ctx: RequestContext) -> Awaitable[None]:
        return self._forward(ctx)

    cleans_up = False

    def exit(self, ctx: RequestContext) -> None:
        pass

    async def _forward(self, ex: RequestContext) -> None:
        """Drive the core retry plan: attempts on instances the breakers allow, spliced into one answer."""
        info, parsed, model, tenant = ex.info, ex.parsed, ex.served, ex.caller
        assert info is not None and parsed is not None and model is not None and tenant is not None
        deadline_s = ex.deadline_s
        body = parsed.body
        body["model"] = info.adapter or model.served_name  # vLLM serves an adapter under its name
        # Re-encoded, never the client's bytes as they came: what the instance reads is then what
        # was validated here (a body with a key twice means one thing to msgspec, last wins, and
        # maybe another to a runtime's parser; max_tokens checked here could be bypassed).
        raw = _encode(body)
        res = self.resilience
        splicer = stream_splicer(ex, parsed, res)
        now = time.monotonic()
        plan = res.plan(
            info,
            now=now,
            deadline_s=plan_deadline_s(ex, parsed.stream, self.upstream_timeout_s),
            # only a stream is ever continued (a JSON answer delivers no token before it ends)
            allow_continuation=parsed.stream and tenant.continuation and can_continue(parsed),
        )
        attempt = next(plan)
        error: GatewayError | None = None
        first_byte_cap = res.retry.first_byte_timeout_s
        try:
            while True:
                if attempt.number > 1:
                    await before_retry(res, model.name, attempt, splicer)
                    if splicer is not None:
                        raw = _encode(continuation_body(parsed, splicer.text, splicer.delivered_tokens))
                now = time.monotonic()
                ttft_left = ttft_budget_left(deadline_s, now, splicer)
                if ttft_left is not None and ttft_left <= 0 and error is not None:
                    break  # nothing delivered and the latency budget is spent: no retry
                trace = ex.trace
                traced = trace is not NULL_TRACE  # (tracing off: not even the null trace's calls)
                rspan = trace.begin_step("tokenplane.route") if traced else None
                try:
                    upstream, decision = self.route(info, model, now, attempt.exclude)
                except NoHealthyInstance as exc:
                    trace.end(rspan, error=exc.message)
                    if error is None:
                        error = exc
                    break
                ex.reason = decision.reason._value_  # (``.value`` is two Python calls: a descriptor)
                if traced:
                    trace.routed(rspan, upstream.id, ex.reason)
                by_budget = budget_bounds_first_byte(first_byte_cap, ttft_left, splicer)
                cap = ttft_left if by_budget else first_byte_cap
                outcome, out, error = await self.attempts.accounted(
                    ex, raw, upstream, splicer, cap, attempt.kind, attempt.number, by_budget
                )
                if error is None and out is not None:
                    plan.close()
                    ex.response = out
                    return
                if await delivered_all(ex, splicer):
                    return
                try:
                    attempt = plan.send(outcome)
                except StopIteration:
                    break
        finally:
            plan.close()
        assert error is not None
        await settle_failure(ex, splicer, error)


def stream_splicer(ex: RequestContext, parsed: ParsedRequest, res: Resilience) -> StreamSplicer | None:
    """What relays a streamed answer to the client (and splices its continuations into it); None
    for a JSON answer."""
    if not parsed.stream:
        return None
    return StreamSplicer(ex.client, parsed.endpoint == "chat", res.retry.stream_idle_timeout_s)


def plan_deadline_s(ex: RequestContext, stream: bool, upstream_timeout_s: float) -> float:
    """The retry plan's deadline. A stream's deadline for continuations is its whole life: the
    admission deadline is a time-to-first-token budget, which bounds retries only while nothing
    was delivered."""
    deadline_s = ex.deadline_s
    return max(deadline_s, ex.arrival + upstream_timeout_s) if stream else deadline_s


async def before_retry(res: Resilience, model: str, attempt: Attempt, splicer: StreamSplicer | None) -> None:
    """Before a retry or a continuation: count it, wait its delay, and take in what the broken
    stream delivered (the splicer's text and tokens, for the continuation's body)."""
    res.count_attempt(model, attempt.kind is AttemptKind.CONTINUATION)
    if attempt.delay_s > 0:
        await asyncio.sleep(attempt.delay_s)
    if splicer is not None:
        splicer.digest()


def ttft_budget_left(deadline_s: float, now: float, splicer: StreamSplicer | None) -> float | None:
    """What is left of the time-to-first-token budget; None once the stream delivered a token
    (the budget then no longer bounds retries)."""
    return deadline_s - now if (splicer is None or not splicer.delivered_tokens) else None


def budget_bounds_first_byte(
    first_byte_cap: float | None, ttft_left: float | None, splicer: StreamSplicer | None
) -> bool:
    """Whether what is left of the latency budget, rather than ``first_byte_cap`` (the configured
    wait), bounds an attempt's wait for its response headers. The budget is a time-to-first-token
    budget. A stream's headers come at once, so it bounds their wait; a plain answer's headers come
    with its last token, so there the budget bounds only the queue and retries, not a long
    generation."""
    return (
        ttft_left is not None
        and splicer is not None
        and (first_byte_cap is None or ttft_left < first_byte_cap)
    )


async def delivered_all(ex: RequestContext, splicer: StreamSplicer | None) -> bool:
    """After a failed attempt: True when the stream already carried every token the client asked
    for and only its end was lost; the stream is then ended (``finish_reason: length``)."""
    parsed = ex.parsed
    if (
        splicer is None
        or not splicer.started
        or parsed is None
        or parsed.max_tokens is None
        or splicer.delivered_tokens < parsed.max_tokens
    ):
        return False
    await splicer.end_length(ex)
    ex.response = splicer.out
    return True


async def settle_failure(ex: RequestContext, splicer: StreamSplicer | None, error: GatewayError) -> None:
    """The retry plan is spent: a started stream ends with the error as its last event, anything
    else raises it (the client gets it as an error answer)."""
    if splicer is not None and splicer.started:
        ex.outcome = error.outcome
        ex.response = await splicer.fail(error)
        return
    raise error
