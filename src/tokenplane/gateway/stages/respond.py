"""Respond: the first stage in, the last out. Opens the request's trace and, on the way out,
records what happened: one metrics record, the ledger's task step, the trace's end."""

from __future__ import annotations

from collections.abc import Callable

from tokenplane.gateway.metrics import GatewayMetrics
from tokenplane.gateway.path_metrics import PathMetrics
from tokenplane.gateway.proxy import OUTCOME_CLIENT_GONE, OUTCOME_OK
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.stages.pipeline import Clock
from tokenplane.gateway.tracing import NULL_TRACE, Tracing


class Respond:
    __slots__ = ("clock", "metrics", "path_metrics", "tracing")

    def __init__(
        self,
        metrics: GatewayMetrics,
        path_metrics: PathMetrics,
        tracing: Callable[[], Tracing | None],
        clock: Clock,
    ) -> None:
        self.metrics = metrics
        self.path_metrics = path_metrics
        self.tracing = tracing  # read per request: tests and operators may swap it after start-up
        self.clock = clock

    def enter(self, ctx: RequestContext) -> None:
        tracing = self.tracing()
        if tracing is not None:
            client = ctx.client
            ctx.trace = tracing.begin(client.headers, client.method, client.path)

    def exit(self, ctx: RequestContext) -> None:
        metrics = self.metrics
        if ctx.ttft_s is not None:
            metrics.first_token(ctx.model, ctx.ttft_s)
        elapsed = self.clock() - ctx.arrival
        parsed = ctx.parsed
        metrics.request_done(
            ctx.model,
            ctx.tenant,
            ctx.outcome,
            ctx.reason,
            elapsed,
            ctx.stream,
            0 if parsed is None else parsed.prompt_tokens,
        )
        if ctx.outcome == OUTCOME_OK:
            self.path_metrics.request(ctx.model, ctx.tenant, elapsed)
        if ctx.ledger is not None:
            ctx.ledger.finish(failed=ctx.outcome not in (OUTCOME_OK, OUTCOME_CLIENT_GONE))
        trace = ctx.trace
        if trace is not NULL_TRACE:  # (tracing off: not even the null trace's call)
            trace.finish(ctx.outcome)
