"""One attempt on one instance, as the forward stage's retry plan asks for it.

:meth:`Attempts.attempt` sends the request (on the transport that serves the instance), and either
writes the instance's JSON answer to the client (through the client stream) or relays its stream
(:class:`~tokenplane.gateway.continuation.StreamSplicer`); :meth:`Attempts.accounted` wraps it with
its span, its upstream-duration metrics and its ledger record.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from yarl import URL

from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.retry_budget import AttemptKind
from tokenplane.gateway.continuation import StreamSplicer
from tokenplane.gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    UpstreamError,
    UpstreamStalled,
    UpstreamTimeout,
)
from tokenplane.gateway.path_metrics import PathMetrics
from tokenplane.gateway.proxy import (
    OUTCOME_CLIENT_GONE,
    OUTCOME_OK,
    OUTCOME_UPSTREAM_REJECTED,
    open_upstream,
    read_json,
    rejection,
)
from tokenplane.gateway.resilience import Resilience
from tokenplane.gateway.response_cache import CACHE_HEADER
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.tracing import NULL_TRACE
from tokenplane.gateway.transports.base import Transports, UpstreamReply
from tokenplane.gateway.upstreams import Upstream, UpstreamPool

_CACHE_MISS: Mapping[str, str] = {CACHE_HEADER: "miss"}

Check = Callable[[UpstreamReply, Upstream], Awaitable[UpstreamReply]]
"""Looks at a reply before it is answered or relayed; returns the reply to use, or raises (P/D's
decode answer checked for a failed KV load: :mod:`tokenplane.gateway.disagg.decode_check`)."""


def upstream_url(upstream: Upstream, endpoint: str) -> URL:
    """The instance's URL for a request to ``endpoint`` ("chat", "completions" or a path)."""
    if endpoint == "chat":
        return upstream.chat_url
    if endpoint == "completions":
        return upstream.completions_url
    return URL(upstream.config.url + endpoint)


def _outcome(
    result: AttemptResult, upstream: Upstream, delivered: int, latency: float | None
) -> AttemptOutcome:
    return AttemptOutcome(result, upstream.id, delivered, time.monotonic(), latency)


class Attempts:
    """What one attempt needs: the transports, the pool, the breakers and the path metrics."""

    __slots__ = ("path_metrics", "pool", "resilience", "transports")

    def __init__(
        self, transports: Transports, pool: UpstreamPool, resilience: Resilience, path_metrics: PathMetrics
    ) -> None:
        self.transports = transports
        self.pool = pool
        self.resilience = resilience
        self.path_metrics = path_metrics

    async def attempt(
        self,
        ex: RequestContext,
        body: bytes,
        upstream: Upstream,
        splicer: StreamSplicer | None,
        first_byte_s: float | None,
        headers: dict[str, str] | None = None,
        by_budget: bool = False,
        check: Check | None = None,
    ) -> tuple[AttemptOutcome, web.StreamResponse | None, GatewayError | None]:
        """One attempt on one instance: (its outcome, the client response if it produced one, its error).

        The breaker hears of every attempt that started, whatever happened (a probe slot is never
        leaked); the instance's accounting and the router's in-flight view are released in ``finally``.
        ``by_budget``: ``first_byte_s`` is what is left of the request's latency budget, so running
        out of it is the request's miss; the instance is not judged by it (a busy instance taken
        out for its callers' short budgets would push their load onto the rest: the cascade).
        """
        info, model = ex.info, ex.served
        assert info is not None and model is not None
        started = time.monotonic()
        tokens = info.prompt_tokens + info.max_output_tokens
        model.router.on_routed(info, upstream.id, now=started)
        waiting_ahead = int(upstream.metrics.waiting)  # the instance's queue as this request joins it
        upstream.begin(tokens)
        ex.upstream = upstream
        self.resilience.on_attempt(upstream.id, started)
        result = AttemptResult.FAILED_BEFORE_FIRST_BYTE
        delivered = 0
        latency: float | None = None
        resp = None
        clean = False
        abandoned = False  # the client left before the instance answered
        try:
            url = upstream_url(upstream, ex.endpoint)
            try:
                resp = await open_upstream(
                    self.transports, upstream, url, body, headers, first_byte_s=first_byte_s
                )
                upstream.heard_at = time.monotonic()
                if check is not None:
                    resp = await check(resp, upstream)
                if resp.status != 200:
                    out = await rejection(resp, upstream)  # raises for 5xx and non-OpenAI 4xx
                    ex.outcome = OUTCOME_UPSTREAM_REJECTED
                    result = AttemptResult.OK  # the instance works; the request was refused
                    return _outcome(result, upstream, 0, None), out, None
                if splicer is None:
                    data = await read_json(resp, ex, upstream)
                    clean = True
                    result = AttemptResult.OK
                    upstream.record_success()
                    latency = time.monotonic() - started
                    client = ex.client
                    extra = None
                    if ex.cacheable:  # the response cache keeps it once it is sent
                        ex.answer_body = data
                        extra = _CACHE_MISS
                    sent = client.send_json_now(data, extra)  # (no coroutine where the edge can)
                    if sent is None:
                        sent = await client.send_json(data, extra)
                    if not sent:
                        ex.outcome = OUTCOME_CLIENT_GONE
                    return _outcome(result, upstream, 0, latency), client.answer(), None
            except UpstreamError as exc:
                if by_budget and isinstance(exc, UpstreamTimeout):
                    abandoned = True
                    miss = DeadlineExceeded(f"no answer from {upstream.id} within the latency budget")
                    return _outcome(result, upstream, 0, None), None, miss
                if isinstance(exc, UpstreamTimeout):
                    result = AttemptResult.TIMEOUT
                    if upstream.answered_since(started):  # it answered others meanwhile
                        return _outcome(result, upstream, 0, None), None, exc
                self.pool.record_failure(upstream, exc.reason)
                return _outcome(result, upstream, 0, None), None, exc
            except GatewayError:  # an instance's 4xx that is not an OpenAI error: the caller's fault
                result = AttemptResult.OK
                raise
            except BaseException:  # cancelled: the client left; an answering instance is not at fault
                if resp is not None and resp.status == 200:
                    result = AttemptResult.OK
                else:
                    abandoned = True
                raise
            try:
                end = await splicer.relay(resp, ex, upstream)
            except BaseException:  # cancelled: the client left; the instance was answering
                result = AttemptResult.OK
                raise
            delivered = end.tokens
            latency = end.latency_s
            if latency is not None and end.tokens > 0:
                upstream.observe_ttft(latency, waiting_ahead, now=time.monotonic())  # to the pool's predictor
            if end.failure is not None:
                result = AttemptResult.FAILED_MID_STREAM
                failure = end.failure
                if not (isinstance(failure, UpstreamStalled) and failure.busy):  # else: busy, not down
                    self.pool.record_failure(upstream, failure.reason)
                return _outcome(result, upstream, delivered, latency), splicer.out, end.failure
            result = AttemptResult.OK
            if not end.client_gone:
                clean = True
                upstream.record_success()
            return _outcome(result, upstream, delivered, latency), splicer.out, None
        finally:
            if abandoned:
                self.resilience.on_abandoned(upstream.id)
            else:
                self.resilience.on_outcome(
                    AttemptOutcome(result, upstream.id, delivered, time.monotonic(), latency)
                )
            if resp is not None:
                if clean:
                    resp.release()
                else:
                    resp.close()  # closes the connection: the instance sees the client go and aborts
            upstream.end(tokens)
            model.router.on_finished(info, upstream.id, now=time.monotonic())

    async def accounted(
        self,
        ex: RequestContext,
        body: bytes,
        upstream: Upstream,
        splicer: StreamSplicer | None,
        first_byte_s: float | None,
        kind: AttemptKind,
        number: int,
        by_budget: bool = False,
        check: Check | None = None,
    ) -> tuple[AttemptOutcome, web.StreamResponse | None, GatewayError | None]:
        """:meth:`attempt`, with its span, its upstream-duration metrics and its ledger record."""
        info, model = ex.info, ex.served
        assert info is not None and model is not None
        trace = ex.trace
        base = splicer.delivered_tokens if splicer is not None else 0
        tokens_in = info.prompt_tokens + base
        traced = trace is not NULL_TRACE  # (tracing off: not even the null trace's calls)
        span = trace.begin_attempt(upstream.id, number, kind, tokens_in) if traced else None
        headers = trace.headers(span) if traced else None
        started = time.monotonic()
        outcome: AttemptOutcome | None = None
        out: web.StreamResponse | None = None
        error: GatewayError | None = None
        reason = OUTCOME_CLIENT_GONE
        try:
            outcome, out, error = await self.attempt(
                ex, body, upstream, splicer, first_byte_s, headers, by_budget, check
            )
            return outcome, out, error
        except GatewayError as exc:
            reason = exc.outcome
            raise
        finally:
            duration = time.monotonic() - started
            ok = outcome is not None and error is None and out is not None and ex.outcome == OUTCOME_OK
            if outcome is not None:
                reason = error.outcome if error is not None else ex.outcome
            elif ex.answered and splicer is not None and splicer.left_after is not None:
                # cancelled once the whole answer was written ([DONE]): the client left with it
                end = splicer.left_after
                outcome = _outcome(AttemptResult.OK, upstream, end.tokens, end.latency_s)
                ok, reason = ex.outcome == OUTCOME_OK, ex.outcome
            if splicer is not None:
                delivered = max(0, splicer.delivered_tokens - base)
                tokens_out = outcome.tokens_delivered if outcome is not None else delivered
                first = outcome.latency_s if outcome is not None else None
            else:
                tokens_out = ex.completion_tokens if ok else 0
                first = None
            self.path_metrics.attempt(model.name, upstream.id, duration, tokens_out, first)
            cost = 0.0
            if ex.ledger is not None:
                cost = ex.ledger.done(info, upstream.config, tokens_in, tokens_out, ok, reason)
            if traced:
                result = outcome.result.value if outcome is not None else reason
                trace.end_attempt(span, None if ok else reason, result, tokens_out, cost)
