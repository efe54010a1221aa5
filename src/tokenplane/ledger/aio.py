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
worker thread, or, for a store with a connection pool (``read_threads`` > 0:
:class:`~tokenplane.ledger.postgres.PostgresLedger`), on that many threads of their own, so that
several clients' reads are served at once. A failed batch fails every write in it with the
store's exception, except when the store is unreachable (:class:`LedgerUnavailable`, e.g.
PostgreSQL down or cut off):

* writes sent without waiting (the request path's attempts) stay queued, in order, and the batch is
  tried again with a growing pause (``retry_min_s`` doubling up to ``retry_max_s``) until the store
  takes it; at most ``max_buffered`` writes wait, a write beyond that is dropped and counted
  (``dropped``), its callback told :class:`LedgerBufferFull`;
* awaited writes (outcomes, the sweep) and reads fail at once while the store is unreachable
  (``unavailable`` is the last error, ``None`` once a batch commits again): their caller answers an
  error now rather than hold a client for an unknown time;
* a store with ``keyed_writes`` (:class:`~tokenplane.ledger.postgres.PostgresLedger`) gets an
  idempotency key per write, made here when the write is queued, so a batch whose commit happened
  but whose acknowledgement was lost is not written twice when tried again.

:meth:`AsyncLedger.aclose` waits up to ``close_timeout_s`` for queued writes; what it could not
write then is logged as lost (the buffer lives in the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tokenplane.core.economics import EconomicsSummary, TaskOutcome
from tokenplane.ledger.errors import LedgerBufferFull, LedgerUnavailable
from tokenplane.ledger.records import AttemptRecord, WorkflowSummary
from tokenplane.ledger.store import BaseLedger, GroupBy, LedgerStore, LedgerWrite

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_BUFFERED", "AsyncLedger", "OnWritten"]

DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_BUFFERED = 100_000
"""Writes queued while the store is unreachable (about 0.5 KB each): ~50 MB at most."""
T = TypeVar("T")
log = logging.getLogger(__name__)

OnWritten = Callable[[AttemptRecord, WorkflowSummary | None, BaseException | None], None]
"""Called once a write committed (summary, ``None``) or failed (``None``, the error)."""
_Waiter = asyncio.Future[WorkflowSummary] | OnWritten


class AsyncLedger:
    """Async wrapper; create it inside the running loop, :meth:`aclose` it on shutdown."""

    def __init__(
        self,
        store: LedgerStore,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        retry_min_s: float = 0.05,
        retry_max_s: float = 1.0,
        close_timeout_s: float = 5.0,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_buffered < max_batch:
            raise ValueError(f"max_buffered must be >= max_batch, got {max_buffered}")
        self.store = store
        self.max_batch = max_batch
        self.max_buffered = max_buffered
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.close_timeout_s = close_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenplane-ledger")
        # A store with a connection pool (``read_threads`` > 0) reads on threads of their own, so a
        # read does not queue behind a write batch in progress; the others read on the writer's.
        read_threads = int(getattr(store, "read_threads", 0))
        self._read_executor = (
            ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="tokenplane-ledger-read")
            if read_threads > 0
            else self._executor
        )
        self._in_loop = not getattr(store, "blocking", True)
        self._keyed = bool(getattr(store, "keyed_writes", False))
        self._key_prefix = uuid.uuid4().hex[:20] + "-"
        self._next_key = 0
        self._pending: list[tuple[LedgerWrite, _Waiter, str | None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0
        """Transactions committed so far (for tests and metrics)."""
        self.unavailable: LedgerUnavailable | None = None
        """The store's last error while it cannot be written; ``None`` when the last batch committed."""
        self.dropped = 0
        """Writes dropped because ``max_buffered`` were already queued."""
        self.retries = 0
        """Batches tried again after the store was unreachable."""

    @property
    def buffered(self) -> int:
        """Writes queued and not yet committed."""
        return len(self._pending)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._in_loop:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._in_loop:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_executor, fn, *args)

    def _enqueue(self, write: LedgerWrite, waiter: _Waiter) -> None:
        if len(self._pending) >= self.max_buffered:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.error(
                    "ledger buffer full (%d writes queued): %d writes dropped",
                    self.max_buffered,
                    self.dropped,
                )
            _settle(
                write, waiter, None, LedgerBufferFull(f"{self.max_buffered} ledger writes already queued")
            )
            return
        key: str | None = None
        if self._keyed:
            key = self._key_prefix + str(self._next_key)
            self._next_key += 1
        self._pending.append((write, waiter, key))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    def _retrying(self) -> bool:
        """Whether queued writes are being tried again against an unreachable store right now
        (then reads and awaited writes fail at once; otherwise they try the store themselves)."""
        flusher = self._flusher
        return self.unavailable is not None and flusher is not None and not flusher.done()

    async def _submit(self, write: LedgerWrite) -> WorkflowSummary:
        if self._retrying():
            raise LedgerUnavailable(f"the ledger is unreachable: {self.unavailable}")
        fut: asyncio.Future[WorkflowSummary] = asyncio.get_running_loop().create_future()
        self._enqueue(write, fut)
        return await fut

    def _write_batch(
        self, batch: list[tuple[LedgerWrite, _Waiter, str | None]]
    ) -> Callable[[], list[WorkflowSummary]]:
        writes = [w for w, _, _ in batch]
        if not self._keyed:
            return lambda: self.store.write_batch(writes)
        keys = [k for _, _, k in batch]
        keyed: Any = self.store  # a store with keyed_writes takes the keys (PostgresLedger)
        return lambda: keyed.write_batch(writes, keys)

    async def _flush(self) -> None:
        # Yield once so that writes submitted in the same loop iteration join this batch.
        await asyncio.sleep(0)
        pause = self.retry_min_s
        while self._pending:
            batch = self._pending[: self.max_batch]
            failed: BaseException | None = None
            unreachable: LedgerUnavailable | None = None
            results: list[WorkflowSummary] = []
            try:
                results = await self._run(self._write_batch(batch))
            except LedgerUnavailable as gone:
                unreachable = gone
            except Exception as err:
                failed = err
            if unreachable is not None:
                # Awaited writes fail now; writes sent without waiting stay queued, in order.
                self.unavailable = unreachable
                keep = []
                for item in batch:
                    if isinstance(item[1], asyncio.Future):
                        _settle(item[0], item[1], None, unreachable)
                    else:
                        keep.append(item)
                self._pending[: len(batch)] = keep
                self.retries += 1
                if self.retries == 1 or pause >= self.retry_max_s:
                    log.warning("ledger unreachable, %d writes queued: %s", len(self._pending), unreachable)
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.retry_max_s)
                continue
            del self._pending[: len(batch)]
            if failed is not None:
                for w, waiter, _ in batch:
                    _settle(w, waiter, None, failed)
                continue
            if self.unavailable is not None:
                log.warning("ledger reachable again, %d writes still queued", len(self._pending))
            self.unavailable = None
            pause = self.retry_min_s
            self.batches += 1
            for (w, waiter, _), summary in zip(batch, results, strict=True):
                _settle(w, waiter, summary, None)

    async def flush(self) -> None:
        """Wait until every write submitted so far is committed (however long the store is away)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _caught_up(self) -> None:
        """Read-your-writes before a read; fails at once while the store is unreachable."""
        while (flusher := self._flusher) is not None and not flusher.done():
            if self.unavailable is not None:
                raise LedgerUnavailable(f"the ledger is unreachable: {self.unavailable}")
            await asyncio.wait({flusher}, timeout=0.1)

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
        await self._caught_up()
        return await self._run(self.store.sweep, now)

    # -- reads -------------------------------------------------------------------------------------
    async def get_workflow(self, workflow_id: str, tenant: str) -> WorkflowSummary | None:
        await self._caught_up()
        return await self._read(self.store.get_workflow, workflow_id, tenant)

    async def list_attempts(self, workflow_id: str, tenant: str) -> list[AttemptRecord]:
        await self._caught_up()
        return await self._read(self.store.list_attempts, workflow_id, tenant)

    async def request_cost(self, request_id: str, tenant: str) -> float | None:
        await self._caught_up()
        return await self._read(self.store.request_cost, request_id, tenant)

    async def tenant_totals(self, tenant: str) -> EconomicsSummary:
        await self._caught_up()
        return await self._read(self.store.tenant_totals, tenant)

    async def economics(self, *, by: GroupBy | None = None) -> dict[str, EconomicsSummary]:
        await self._caught_up()
        return await self._read(lambda: self.store.economics(by=by))

    async def aclose(self) -> None:
        """Commit what is pending (for up to ``close_timeout_s``), close the store, stop the thread."""
        try:
            await asyncio.wait_for(self.flush(), self.close_timeout_s)
        except TimeoutError:
            lost = len(self._pending)
            log.error("ledger unreachable at shutdown: %d queued writes lost", lost)
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        if self._read_executor is not self._executor:
            self._read_executor.shutdown(wait=True)
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
