"""Workflows in the gateway: client hints in, spend and outcomes to the ledger, two endpoints out.

* **Hints** (:meth:`Workflows.hints`): a request that carries none of ``x-tokenplane-workflow-id``,
  ``-step``, ``-total-steps``, ``-deadline-s``, an integer ``x-tokenplane-priority``, or a body key
  ``metadata`` / ``nvext`` / ``vllm_xargs`` costs a few dictionary lookups and nothing else. Otherwise
  :func:`~tokenplane.core.workflow_hints.parse_workflow_hints` reads them (see there for sources and
  precedence); an invalid hint is a 400 naming the field. ``X-Tokenplane-Priority`` with a class
  name (``interactive``, ``batch``...) stays the admission header it was and is not a hint. The
  request's :class:`~tokenplane.core.views.WorkflowContext` gets ``sunk_cost_usd`` from an in-memory
  cache of each open workflow's spend, updated on every attempt this gateway records (no database
  read on the request path; after a restart, or for steps served by another replica, it starts
  from what this process saw).
* **Forwarding** (:func:`strip_hints`): ``nvext`` is removed (no runtime here speaks Dynamo's
  extension), the workflow keys are removed from ``metadata`` (which is dropped if left empty:
  OpenAI's ``metadata`` means stored-completion tags), ``vllm_xargs.agentic_context`` stays when it
  is a string (vLLM accepts flat values only) and is removed when it is an object (vLLM would reject
  it).
* **Ledger**: every attempt is recorded (:class:`AttemptLog`) with its cost
  (:class:`~tokenplane.gateway.economics.CostModel`), through
  :class:`~tokenplane.ledger.AsyncLedger` without waiting. A failed attempt is held until the
  gateway knows whether another follows: then it is written as terminal (the step, and the
  workflow, failed) or not. A request without a workflow is its own one-step task. A client that
  leaves mid-answer leaves its step open (its attempt is a failure that is not terminal). Timestamps
  are wall-clock seconds (they persist across restarts); a periodic sweep abandons workflows idle for
  ``ledger.abandon_after_s``.
* **The store** (``ledger:`` in config): in memory, a SQLite file (``path``), or PostgreSQL
  (``url``), which every replica shares: any replica answers for a workflow another started, a
  moment (one batch commit) after that replica recorded it. While PostgreSQL is unreachable the
  attempts wait in a bounded queue (:class:`~tokenplane.ledger.AsyncLedger`), gauged in
  ``/metrics`` (:class:`LedgerQueueCollector`); the endpoints answer 503 ``ledger_unavailable``.
* **Endpoints**: ``GET /v1/workflows/{id}`` (the summary and its attempts) and
  ``POST /v1/workflows/{id}/outcome`` with ``{"outcome": "succeeded" | "failed" | "abandoned"}``.
  Both authenticate; a workflow of another tenant is a 404, exactly as one that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from tokenplane.core.views import RequestInfo, WorkflowContext
from tokenplane.core.workflow_hints import HintError, WorkflowHints, parse_workflow_hints
from tokenplane.gateway.config import InstanceConfig, LedgerConfig
from tokenplane.gateway.economics import CostModel, EconomicsMetrics
from tokenplane.gateway.errors import (
    InvalidHint,
    InvalidParameter,
    InvalidRequest,
    LedgerUnreachable,
    MalformedJSON,
    WorkflowNotFound,
)
from tokenplane.gateway.hint_fields import HINT_HEADERS, PRIORITY_HEADER, has_hints, is_int_text, strip_hints
from tokenplane.gateway.ledger_metrics import LedgerQueueCollector
from tokenplane.gateway.tenants import Tenant
from tokenplane.gateway.wire import decode_outcome
from tokenplane.ledger import (
    AsyncLedger,
    AttemptRecord,
    LedgerBufferFull,
    LedgerError,
    LedgerStore,
    LedgerUnavailable,
    MemoryLedger,
    SqliteLedger,
    TaskOutcome,
    WorkflowSummary,
)

__all__ = [
    "AttemptLog",
    "InvalidHint",
    "LedgerQueueCollector",
    "LedgerUnreachable",
    "WorkflowNotFound",
    "Workflows",
    "has_hints",
    "strip_hints",
]

log = logging.getLogger(__name__)

MAX_SPEND_CACHE = 100_000
"""Open workflows whose running spend is kept in memory (oldest forgotten first beyond it)."""

_encode = msgspec.json.Encoder().encode


class AttemptLog:
    """One request's attempts on their way to the ledger (a failure waits to learn if it was the last)."""

    __slots__ = ("_pending", "_wf")

    def __init__(self, workflows: Workflows) -> None:
        self._wf = workflows
        self._pending: tuple[Any, ...] | None = None

    def done(
        self, info: RequestInfo, inst: InstanceConfig, tokens_in: int, tokens_out: int, ok: bool, reason: str
    ) -> float:
        """Record an attempt; returns its cost in dollars."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._wf.record(*pending, terminal=False)
        cost = self._wf.costs.attempt_cost(inst, tokens_in, tokens_out)
        args = (info, inst.id, tokens_in, tokens_out, cost, ok, reason)
        if ok:
            self._wf.record(*args, terminal=False)
        else:
            self._pending = args
        return cost

    def finish(self, failed: bool) -> None:
        """The request ended: a held failure is terminal if the request ``failed``."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._wf.record(*pending, terminal=failed)


class Workflows:
    """The gateway's workflow state: the ledger, the spend cache, the endpoints."""

    def __init__(
        self,
        config: LedgerConfig,
        costs: CostModel,
        metrics: EconomicsMetrics,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.costs = costs
        self.metrics = metrics
        self.ledger: AsyncLedger | None = None
        if registry is not None and config.url is not None:
            registry.register(LedgerQueueCollector(self))
        self._spend: dict[tuple[str, str], float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        store: LedgerStore
        if cfg.url:
            from tokenplane.ledger.postgres import PostgresLedger  # psycopg loads only when used

            # connecting and migrating wait on the network: off the loop
            store = await asyncio.to_thread(
                PostgresLedger,
                cfg.url,
                abandon_after_s=cfg.abandon_after_s,
                pool_max_size=cfg.pool_max_size,
                timeout_s=cfg.timeout_s,
            )
            self.ledger = AsyncLedger(store, max_buffered=cfg.buffer_max_writes)
        else:
            store = (
                SqliteLedger(cfg.path, abandon_after_s=cfg.abandon_after_s)
                if cfg.path
                else MemoryLedger(abandon_after_s=cfg.abandon_after_s, max_settled=cfg.memory_max_settled)
            )
            self.ledger = AsyncLedger(store)
        self._sweeper = asyncio.create_task(self._sweep_loop())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self.ledger is not None:
            ledger, self.ledger = self.ledger, None
            try:
                await ledger.aclose()
            except Exception:
                log.exception("closing the ledger failed")

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            await self.sweep()

    async def sweep(self) -> list[WorkflowSummary]:
        if self.ledger is None:
            return []
        try:
            abandoned = await self.ledger.sweep(time.time())
        except LedgerUnavailable as exc:  # the database is away: the next sweep catches up
            log.warning("ledger sweep skipped: %s", exc)
            return []
        except Exception:
            log.exception("ledger sweep failed")
            return []
        for w in abandoned:
            self._spend.pop((w.tenant, w.workflow_id), None)
            self.metrics.task(w.tenant, w.model, w.outcome.value)
        return abandoned

    # -- the request path -------------------------------------------------------------------------
    def hints(
        self, headers: Mapping[str, str], body: dict[str, Any], tenant: Tenant, now: float
    ) -> WorkflowHints | None:
        """The request's hints (``None`` when it has none); raises :class:`InvalidHint`."""
        if not has_hints(headers, body):
            return None
        hdrs = {h: headers[h] for h in HINT_HEADERS if h in headers}
        p = headers.get(PRIORITY_HEADER)
        if p is not None and is_int_text(p):
            hdrs[PRIORITY_HEADER] = p
        res = parse_workflow_hints(
            hdrs,
            body,
            now=now,
            base_priority=tenant.priority,
            allow_priority_raise=tenant.allow_priority_raise,
            max_priority=1,
        )
        if isinstance(res, HintError):
            raise InvalidHint(f"invalid workflow hint {res.field}: {res.message}", param=res.field)
        strip_hints(body)
        wf = res.workflow
        if wf is not None:
            sunk = self._spend.get((tenant.name, wf.workflow_id))
            if sunk:
                res = msgspec.structs.replace(res, workflow=msgspec.structs.replace(wf, sunk_cost_usd=sunk))
        return res

    def record(
        self,
        info: RequestInfo,
        instance_id: str,
        tokens_in: int,
        tokens_out: int,
        cost: float,
        ok: bool,
        reason: str,
        *,
        terminal: bool,
    ) -> None:
        """Send one attempt to the ledger without waiting; counts its cost and a task it settles."""
        self.metrics.cost(info.tenant, info.model, cost)
        ledger = self.ledger
        if ledger is None:
            return
        wf: WorkflowContext | None = info.workflow
        if wf is not None:
            key = (info.tenant, wf.workflow_id)
            spend = self._spend
            spend[key] = spend.get(key, 0.0) + cost
            if len(spend) > MAX_SPEND_CACHE:
                del spend[next(iter(spend))]
        t = time.time()
        try:
            ledger.record_attempt_nowait(
                self._written,
                request_id=info.request_id,
                workflow_id=wf.workflow_id if wf is not None else None,
                tenant=info.tenant,
                instance_id=instance_id,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost_usd=cost,
                ok=ok,
                reason=reason,
                t=t,
                model=info.model,
                step=wf.step if wf is not None else None,
                total_steps=wf.total_steps if wf is not None else None,
                terminal=terminal,
            )
        except LedgerError:
            log.exception("an attempt could not be recorded")
            return

    def _written(self, write: AttemptRecord, w: WorkflowSummary | None, exc: BaseException | None) -> None:
        if exc is not None or w is None:
            if not isinstance(exc, LedgerBufferFull):  # drops are counted and logged by the ledger
                log.error("the ledger refused an attempt: %s", exc)
            return
        if w.outcome is not TaskOutcome.OPEN and w.settled_t == write.t:  # this attempt settled it
            self.metrics.task(w.tenant, w.model, w.outcome.value)
            self._spend.pop((w.tenant, w.workflow_id), None)

    async def refresh(self) -> None:
        """Read the ledger's per-tenant aggregates into the gauges' snapshot (off the loop)."""
        if self.ledger is None:
            return
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.create_task(self._refresh())
        await asyncio.shield(task)

    async def _refresh(self) -> None:
        assert self.ledger is not None
        try:
            self.metrics.snapshot = await self.ledger.economics(by="tenant")
        except LedgerUnavailable as exc:  # a scrape while the database is away: the last snapshot stays
            log.warning("reading the ledger's economics failed: %s", exc)
        except Exception:
            log.exception("reading the ledger's economics failed")

    # -- endpoints --------------------------------------------------------------------------------
    async def _find(self, workflow_id: str, tenant: Tenant) -> WorkflowSummary:
        if self.ledger is None:
            raise WorkflowNotFound("the workflow ledger is off in this gateway")
        try:
            w = await self.ledger.get_workflow(workflow_id, tenant.name)
        except LedgerUnavailable as exc:
            raise LedgerUnreachable(f"the workflow ledger is unreachable: {exc}") from None
        if w is None:
            raise WorkflowNotFound(f"no workflow {workflow_id!r}")
        return w

    async def show(self, workflow_id: str, tenant: Tenant) -> web.Response:
        w = await self._find(workflow_id, tenant)
        assert self.ledger is not None
        try:
            attempts = await self.ledger.list_attempts(workflow_id, tenant.name)
        except LedgerUnavailable as exc:
            raise LedgerUnreachable(f"the workflow ledger is unreachable: {exc}") from None
        body = _view(w)
        body["attempt_log"] = [
            {
                "request_id": a.request_id,
                "instance": a.instance_id,
                "step": a.step,
                "tokens_in": a.tokens_in,
                "tokens_out": a.tokens_out,
                "cost_usd": a.cost_usd,
                "ok": a.ok,
                "reason": a.reason,
                "terminal": a.terminal,
                "t": a.t,
            }
            for a in attempts
        ]
        return web.Response(body=_encode(body), content_type="application/json")

    async def set_outcome(self, workflow_id: str, tenant: Tenant, raw: bytes) -> web.Response:
        try:
            req = decode_outcome(raw)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(f"invalid outcome body: {exc}", param="outcome") from None
        except msgspec.DecodeError as exc:
            raise MalformedJSON(f"the request body is not valid JSON: {exc}") from None
        allowed = (TaskOutcome.SUCCEEDED, TaskOutcome.FAILED, TaskOutcome.ABANDONED)
        if req.outcome not in {o.value for o in allowed}:
            raise InvalidParameter(
                f"'outcome' must be one of {[o.value for o in allowed]}, got {req.outcome!r}", param="outcome"
            )
        prev = await self._find(workflow_id, tenant)
        assert self.ledger is not None
        try:
            w = await self.ledger.record_outcome(workflow_id, tenant.name, req.outcome, time.time())
        except LedgerUnavailable as exc:
            raise LedgerUnreachable(f"the workflow ledger is unreachable: {exc}") from None
        if prev.outcome is TaskOutcome.OPEN:
            self.metrics.task(w.tenant, w.model, w.outcome.value)
        self._spend.pop((tenant.name, workflow_id), None)
        return web.Response(body=_encode(_view(w)), content_type="application/json")


def _view(w: WorkflowSummary) -> dict[str, Any]:
    return {
        "object": "workflow",
        "id": w.workflow_id,
        "outcome": w.outcome.value,
        "reason": w.reason,
        "model": w.model,
        "total_steps": w.total_steps,
        "max_step": w.max_step,
        "attempts": w.attempts,
        "failed_attempts": w.failed_attempts,
        "cost_usd": w.cost_usd,
        "failed_attempt_cost_usd": w.failed_attempt_cost_usd,
        "tokens_in": w.tokens_in,
        "tokens_out": w.tokens_out,
        "first_t": w.first_t,
        "last_t": w.last_t,
        "settled_t": w.settled_t,
    }
