"""Tenant limits: the request's workflow hints (a tenant may or may not raise its priority), the
tenant's concurrency bound (429), and the request's description for the policies
(:class:`~tokenplane.core.views.RequestInfo`, its prompt hashed once); the slot is given back on
the way out."""

from __future__ import annotations

import itertools
import os
import time

from tokenplane.core.prompt_hash import ROUTING_BLOCK_TOKENS, block_hashes
from tokenplane.core.views import RequestInfo
from tokenplane.core.workflow_hints import WorkflowHints
from tokenplane.gateway.catalog import ServedModel
from tokenplane.gateway.kv_events import KvEventsSubscriber
from tokenplane.gateway.request import ASSUMED_OUTPUT_TOKENS, ParsedRequest
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.tenants import Tenant
from tokenplane.gateway.tracing import NULL_TRACE
from tokenplane.gateway.workflows import AttemptLog, Workflows


class Describer:
    """Builds a request's :class:`RequestInfo` (ids unique to this process and start)."""

    __slots__ = ("_id_prefix", "_ids", "kv_events")

    def __init__(self, kv_events: KvEventsSubscriber | None) -> None:
        self.kv_events = kv_events
        self._ids = itertools.count(1)
        self._id_prefix = f"tp-{os.getpid():x}-{int(time.time()):x}-"

    def describe(
        self,
        parsed: ParsedRequest,
        model: ServedModel,
        tenant: Tenant,
        now: float,
        hints: WorkflowHints | None = None,
    ) -> RequestInfo:
        # (no call where nothing publishes KV events: the approximate index, the usual case)
        cached = None if self.kv_events is None else self._cached_prefix(parsed)
        return RequestInfo(
            request_id=self._id_prefix + str(next(self._ids)),
            model=model.name,
            prompt_tokens=parsed.prompt_tokens,
            max_output_tokens=parsed.max_tokens or ASSUMED_OUTPUT_TOKENS,
            # precise mode matches token blocks: the approximate chain is neither read nor recorded
            block_hashes=block_hashes(parsed.prompt_text, ROUTING_BLOCK_TOKENS) if cached is None else (),
            tenant=tenant.name,
            priority=tenant.priority if hints is None else hints.priority,
            arrival_s=now,
            workflow=None if hints is None else hints.workflow,
            cached_prefix_tokens=cached,
            adapter=parsed.model if parsed.model in model.adapters else None,
        )

    def _cached_prefix(self, parsed: ParsedRequest) -> dict[str, int] | None:
        """Precise mode: exact cached tokens per instance from vLLM's KV events, where the request
        has token ids (sent by the client, or from the model's tokenizer: the tokenize stage) and
        some instance publishes events; else ``None`` (approximate index)."""
        if self.kv_events is None or parsed.token_ids is None:
            return None
        return self.kv_events.index.match_tokens(parsed.token_ids, blocks=parsed.token_blocks)


class TenantLimits:
    __slots__ = ("describer", "ledger_on", "workflows")

    def __init__(self, workflows: Workflows, describer: Describer, ledger_on: bool) -> None:
        self.workflows = workflows
        self.describer = describer
        self.ledger_on = ledger_on

    def enter(self, ctx: RequestContext) -> None:
        tenant, parsed, model = ctx.caller, ctx.parsed, ctx.served
        assert tenant is not None and parsed is not None and model is not None
        now = ctx.arrival
        hints = ctx.hints = self.workflows.hints(ctx.client.headers, parsed.body, tenant, now)
        tenant.acquire()
        try:
            info = ctx.info = self.describer.describe(parsed, model, tenant, now, hints)
        except BaseException:
            tenant.release()
            raise
        if self.ledger_on:
            ctx.ledger = AttemptLog(self.workflows)
        trace = ctx.trace
        if trace is not NULL_TRACE:  # (tracing off: not even the null trace's call)
            trace.described(tenant.name, model.name, parsed.stream, info)

    def exit(self, ctx: RequestContext) -> None:
        assert ctx.caller is not None
        ctx.caller.release()
