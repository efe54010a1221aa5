"""An asyncio face for a synchronous :class:`LedgerStore`: one worker thread, batched writes.

The gateway's event loop must never block on SQLite. :class:`AsyncLedger` runs every store call in
one dedicated worker thread (a single-thread executor: the store sees one caller at a time, in
submission order). Writes are group-committed: each ``await record_attempt(...)`` validates on the
loop (bad input fails at once, in the caller), appends to a pending list and waits; one flusher
task hands everything pending (up to ``max_batch`` writes) to :meth:`LedgerStore.write_batch`, one
transaction for the lot, then wakes each writer with its own result. Under load, many concurrent
requests share a commit; at rest, a write costs one transaction.

A store that declares ``blocking = False`` (:class:`~tokenplane.ledger.store.MemoryLedger`: dicts,
no I/O) runs on the loop instead, batched the same way: a thread hop per batch would cost more
than the write itself.

Reads wait for the writes submitted before them (read-your-writes) and then run on the same
worker thread. A failed batch fails every write in it with the store's exception.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tokenplane.core.economics import EconomicsSummary, TaskOutcome
from tokenplane.ledger.records import AttemptRecord, WorkflowSummary
from tokenplane.ledger.store import BaseLedger, GroupBy, LedgerStore, LedgerWrite

__all__ = ["DEFAULT_MAX_BATCH", "AsyncLedger", "OnWritten"]

DEFAULT_MAX_BATCH = 256
T = TypeVar("T")
log = logging.getLogger(__name__)

OnWritten = Callable[[AttemptRecord, WorkflowSummary | None, BaseException | None], None]
"""Called once a write committed (summary, ``None``) or failed (``None``, the error)."""
_Waiter = asyncio.Future[WorkflowSummary] | OnWritten


class AsyncLedger:
    """Async wrapper; create it inside the running loop, :meth:`aclose` it on shutdown."""

    def __init__(self, store: LedgerStore, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.store = store
        self.max_batch = max_batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenplane-ledger")
        self._in_loop = not getattr(store, "blocking", True)
        self._pending: list[tuple[LedgerWrite, _Waiter]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0
        """Transactions committed so far (for tests and metrics)."""

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._in_loop:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def _enqueue(self, write: LedgerWrite, waiter: _Waiter) -> None:
        self._pending.append((write, waiter))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _submit(self, write: LedgerWrite) -> WorkflowSummary:
        fut: asyncio.Future[WorkflowSummary] = asyncio.get_running_loop().create_future()
        self._enqueue(write, fut)
        return await fut

    async def _flush(self) -> None:
        # Yield once so that writes submitted in the same loop iteration join this batch.
        await asyncio.sleep(0)
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                results = await self._run(self.store.write_batch, [w for w, _ in batch])
            except Exception as exc:
                for w, waiter in batch:
                    _settle(w, waiter, None, exc)
                continue
            self.batches += 1
            for (w, waiter), summary in zip(batch, results, strict=True):
                _settle(w, waiter, summary, None)

    async def flush(self) -> None:
        """Wait until every write submitted so far is committed."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    # -- writes ------------------------------------------------------------------------------------
    async def record_attempt(self, **fields: Any) -> WorkflowSummary:
        """Same keywords as :meth:`LedgerStore.record_attempt`."""
        return await self._submit(BaseLedger.attempt(**fields))

    def record_attempt_nowait(self, on_written: OnWritten, **fields: Any) -> None:
        """:meth:`record_attempt` without waiting (for a request path that must not): validated here
        (a bad write raises at once), committed with the next batch, then ``on_written`` is called
        from the flusher. No future per write: a request path pays one list append."""
        self._enqueue(BaseLedger.attempt(**fields), on_written)

    async def record_outcome(
        self, workflow_id: str, tenant: str, outcome: str | TaskOutcome, t: float, *, reason: str = "client"
    ) -> WorkflowSummary:
        return await self._submit(BaseLedger.outcome(workflow_id, tenant, outcome, t, reason=reason))

    async def sweep(self, now: float) -> list[WorkflowSummary]:
        await self.flush()
        return await self._run(self.store.sweep, now)

    # -- reads -------------------------------------------------------------------------------------
    async def get_workflow(self, workflow_id: str, tenant: str) -> WorkflowSummary | None:
        await self.flush()
        return await self._run(self.store.get_workflow, workflow_id, tenant)

    async def list_attempts(self, workflow_id: str, tenant: str) -> list[AttemptRecord]:
        await self.flush()
        return await self._run(self.store.list_attempts, workflow_id, tenant)

    async def request_cost(self, request_id: str, tenant: str) -> float | None:
        await self.flush()
        return await self._run(self.store.request_cost, request_id, tenant)

    async def tenant_totals(self, tenant: str) -> EconomicsSummary:
        await self.flush()
        return await self._run(self.store.tenant_totals, tenant)

    async def economics(self, *, by: GroupBy | None = None) -> dict[str, EconomicsSummary]:
        await self.flush()
        return await self._run(lambda: self.store.economics(by=by))

    async def aclose(self) -> None:
        """Commit what is pending, close the store, stop the worker thread."""
        await self.flush()
        await self._run(self.store.close)
        self._executor.shutdown(wait=True)


def _settle(
    write: LedgerWrite, waiter: _Waiter, summary: WorkflowSummary | None, exc: BaseException | None
) -> None:
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            if exc is not None:
                waiter.set_exception(exc)
            else:
                assert summary is not None
                waiter.set_result(summary)
        return
    assert isinstance(write, AttemptRecord)  # only attempts are written without waiting
    try:
        waiter(write, summary, exc)
    except Exception:  # one bad callback must not stop the rest of the batch
        log.exception("a ledger write callback failed")
