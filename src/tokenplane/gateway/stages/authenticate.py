"""Authenticate: ``Authorization: Bearer`` → tenant. First, before the body is read: it needs only
a header, and an unauthenticated caller then costs (and learns) nothing more (401)."""

from __future__ import annotations

from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.tenants import Authenticator
from tokenplane.gateway.tracing import NULL_TRACE


class Authenticate:
    __slots__ = ("auth",)

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def enter(self, ctx: RequestContext) -> None:
        trace = ctx.trace
        if trace is not NULL_TRACE:  # (tracing off: not even the null trace's calls)
            span = trace.begin_step("tokenplane.authenticate")
            tenant = self.auth.authenticate(ctx.client.headers.get("Authorization"))
            trace.authenticated(span, tenant.name)
        else:
            tenant = self.auth.authenticate(ctx.client.headers.get("Authorization"))
        ctx.caller = tenant
        ctx.tenant = tenant.name

    cleans_up = False

    def exit(self, ctx: RequestContext) -> None:
        pass
