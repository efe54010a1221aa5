"""Parse: the body (at most ``limits.max_body_bytes``, 413 beyond), decoded and validated once
(:func:`~tokenplane.gateway.request.parse_request`, 400), and the model name or alias resolved to a
served model the tenant may use (404)."""

from __future__ import annotations

from collections.abc import Awaitable

from tokenplane.gateway.catalog import ModelCatalog
from tokenplane.gateway.config import LimitsConfig
from tokenplane.gateway.request import parse_other, parse_request
from tokenplane.gateway.stages.context import RequestContext


class Parse:
    __slots__ = ("catalog", "limits")

    def __init__(self, limits: LimitsConfig, catalog: ModelCatalog) -> None:
        self.limits = limits
        self.catalog = catalog

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        raw = ctx.client.body_now(self.limits.max_body_bytes)
        if raw is None:
            return self._read(ctx)
        self._parse(ctx, raw)
        return None

    async def _read(self, ctx: RequestContext) -> None:
        self._parse(ctx, await ctx.client.read_body(self.limits.max_body_bytes))

    def _parse(self, ctx: RequestContext, raw: bytes) -> None:
        endpoint = ctx.endpoint
        if endpoint == "chat":
            parsed = parse_request(raw, "chat", self.limits)
        elif endpoint == "completions":
            parsed = parse_request(raw, "completions", self.limits)
        else:
            parsed = parse_other(raw, self.limits)
        ctx.parsed = parsed
        ctx.stream = parsed.stream
        assert ctx.caller is not None
        served = self.catalog.resolve(parsed.model, ctx.caller)
        ctx.served = served
        ctx.model = served.name

    cleans_up = False

    def exit(self, ctx: RequestContext) -> None:
        pass
