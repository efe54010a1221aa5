"""Admission at the gateway: one core :class:`~tokenplane.core.admission.AdmissionQueue` per model pool.

A request is offered with its priority class (the tenant's; ``X-Tokenplane-Priority`` may lower it,
and raise it only for a tenant with ``allow_priority_raise``) and the pool's free capacity: the sum
of ``instances[].max_concurrency`` over instances that are healthy and whose breaker allows them,
minus the requests this pool has admitted and not finished. ``ADMIT_NOW`` goes on at once; a
``QUEUED`` request first meets the core :class:`~tokenplane.core.shedding.LoadShedder` (queue depth
and the oldest wait, per class: batch sheds first) and then waits on a future until
:meth:`PoolAdmission.pump` dispatches it (``next()``: strict priority, then the tenant with the least
token-weighted service, then earliest deadline), or its deadline passes, or a higher class evicts it.

SLO-predictive shedding: given the pool's instance views and its
:class:`~tokenplane.core.ttft.PoolTtft` (the core's TTFT predictor, fed with observed TTFTs), a
request is shed before it is offered by the core's up-front rule,
:func:`~tokenplane.core.ttft.ttft_up_front`, which the twin's admission applies the same way:
``TTFT_OVER_BUDGET`` when ``now + predicted TTFT > deadline``, the work would be spent on an
answer that comes too late anyway. The deadline is the queue's (arrival plus the request's latency
budget, ``RequestInfo.latency_budget_s`` where set, else its class's ``budget_s``: a
time-to-first-token budget). A queued request's load signal carries the same prediction. Without
views and a pool TTFT (the default) nothing is predicted; the rule waits for the pool's first
observed TTFT, so a pool that has served no stream builds no views for it. An infinite prediction
(no usable instance) sheds nothing here: routing answers that with its own error.

Refusals are errors (rendered at the edge, with ``Retry-After``): 429 when the tenant is over its
own share (``TENANT_QUEUE_FULL``, or it expired while held by its in-flight limit), 503 when the
pool is saturated (``QUEUE_FULL``, shed, expired, deadline unreachable, predicted TTFT over budget:
the message names the prediction). ``pump`` runs when a request
finishes and from the gateway's housekeeping loop (capacity coming back with an instance).

Metrics: ``tokenplane_queue_depth{model}``, ``tokenplane_queue_wait_seconds{model}``,
``tokenplane_shed_total{reason}``, ``tokenplane_rejected_total{reason}``.

Cost when the pool has room: one ``offer`` (a few dict reads and two counter adds) and one
``on_finish``; no future, no task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenplane.core.admission import (
    Admission,
    AdmissionQueue,
    AdmissionReason,
    PriorityClass,
)
from tokenplane.core.shedding import LoadShedder, LoadSignal, load_signal
from tokenplane.core.ttft import PoolTtft, ttft_up_front
from tokenplane.core.views import InstanceView, RequestInfo
from tokenplane.gateway.errors import PoolSaturated, Refused, TenantOverShare

PRIORITY_HEADER = "X-Tokenplane-Priority"

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def priority_for(base: int, header: str | None, may_raise: bool) -> PriorityClass:
    """The tenant's class, lowered (or, when allowed, raised) by the client's header."""
    cls = PriorityClass.from_value(base)
    if header is None:
        return cls
    try:
        wanted = PriorityClass.from_name(header)
    except Exception:  # an unknown class name is ignored, not an error: the key decides
        return cls
    return wanted if (wanted <= cls or may_raise) else cls


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry, pools: Callable[[], Mapping[str, PoolAdmission]]) -> None:
        self.shed = Counter("tokenplane_shed", "Requests shed by reason", ["reason"], registry=registry)
        self.rejected = Counter(
            "tokenplane_rejected", "Requests refused by admission, by reason", ["reason"], registry=registry
        )
        self.wait = Histogram(
            "tokenplane_queue_wait_seconds",
            "Time a request waited in the admission queue (dispatched ones)",
            ["model"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        registry.register(_DepthCollector(pools))


class _DepthCollector(Collector):
    def __init__(self, pools: Callable[[], Mapping[str, PoolAdmission]]) -> None:
        self._pools = pools

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("tokenplane_queue_depth", "Requests queued for admission", labels=["model"])
        inflight = GaugeMetricFamily(
            "tokenplane_admitted_in_flight", "Requests admitted and not finished", labels=["model"]
        )
        for name, pool in self._pools().items():
            depth.add_metric([name], pool.queue.depth)
            inflight.add_metric([name], pool.in_flight)
        yield depth
        yield inflight


class PoolAdmission:
    """Admission for one model's pool of instances."""

    def __init__(
        self,
        model: str,
        queue: AdmissionQueue,
        shedder: LoadShedder,
        capacity: Callable[[], int],
        metrics: AdmissionMetrics,
        *,
        views: Callable[[], Sequence[InstanceView]] | None = None,
        ttft: PoolTtft | None = None,
    ) -> None:
        self.model = model
        self.queue = queue
        self.shedder = shedder
        self._capacity = capacity
        # Requests the pool's usable instances take at once (``max_concurrency`` summed): the
        # function itself, not a method that calls it (one call less per request).
        self.capacity = capacity
        self._metrics = metrics
        self._views = views
        self.ttft = ttft
        """The pool's observed TTFT; with ``views``, admission predicts TTFT (see the module docstring)."""
        self.in_flight = 0
        self._waiters: dict[str, asyncio.Future[None]] = {}

    def free(self) -> int:
        return self._capacity() - self.in_flight

    async def admit(
        self, info: RequestInfo, priority: PriorityClass, now: float, capacity: int | None = None
    ) -> float:
        """Wait until the request may go; returns its deadline. Raises a :class:`Refused`.
        ``capacity``: :meth:`capacity` as the caller just read it (saves summing it again)."""
        adm = self.offer(info, priority, now, capacity)
        if adm.admitted:
            return adm.deadline_s
        return await self.wait(info, adm, now)

    def offer(
        self, info: RequestInfo, priority: PriorityClass, now: float, capacity: int | None = None
    ) -> Admission:
        """:meth:`admit`'s first half, without a coroutine: admitted at once (it holds a slot),
        refused (raises), or queued (then :meth:`wait` for it, which it must)."""
        queue = self.queue
        ttft = self.ttft
        if ttft is not None and self._views is not None and ttft.observed:
            self._shed_if_too_late(info, priority, now)
        total = self._capacity() if capacity is None else capacity
        free = total - self.in_flight
        adm = queue.offer(info, now=now, capacity=free, total_capacity=total, priority=priority)
        if adm.evicted is not None:
            self._refuse(adm.evicted.request.request_id, AdmissionReason.SHED_LOW_PRIORITY, now)
        if adm.admitted:
            self.in_flight += 1
            return adm
        if adm.rejected:
            raise self._refusal(adm.reason, adm, now)
        return adm

    async def wait(self, info: RequestInfo, adm: Admission, now: float) -> float:
        """:meth:`admit`'s second half, for a request :meth:`offer` queued: shed, or wait for a slot."""
        queue = self.queue
        signal = self.load_signal(info, queue.depth - 1, now)
        shed = self.shedder.decide(adm.priority, signal, now=now, deadline_s=adm.deadline_s)
        if shed.shed:
            queue.cancel(info.request_id)
            self._metrics.shed.labels(shed.reason.value).inc()
            raise PoolSaturated(
                f"shed ({shed.reason.value}): {self.model!r} has {signal.queue_depth} queued, the oldest "
                f"for {signal.oldest_wait_s:.1f} s",
                code="shed",
                retry_after_s=queue.retry_after_s(now=now),
            )
        rid = info.request_id
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        self.pump()  # capacity may have come back since the offer
        try:
            async with asyncio.timeout(max(0.0, adm.deadline_s - time.monotonic())):
                await fut
        except TimeoutError:
            self._waiters.pop(rid, None)
            if _dispatched(fut):
                self.release(info)
            else:
                queue.cancel(rid)
            held = adm.reason is AdmissionReason.QUEUED_TENANT_LIMIT
            raise self._refusal(AdmissionReason.EXPIRED, adm, time.monotonic(), tenant=held) from None
        except BaseException:  # refused while queued (evicted, expired) or the client left
            self._waiters.pop(rid, None)
            if _dispatched(fut):
                self.release(info)  # dispatched just as the client left: give the slot back
            else:
                queue.cancel(rid)
            raise
        self._metrics.wait.labels(self.model).observe(time.monotonic() - now)
        return adm.deadline_s
        return adm.deadline_s

    def load_signal(self, info: RequestInfo, queue_depth: int, now: float) -> LoadSignal:
        """The pool's load as the shedder reads it; with the TTFT model, its predicted TTFT too."""
        oldest = self.queue.oldest_wait_s(now=now)
        if self.ttft is None or self._views is None:
            return LoadSignal(queue_depth=queue_depth, oldest_wait_s=oldest)
        return load_signal(
            self._views(),
            queue_depth=queue_depth,
            oldest_wait_s=oldest,
            predictor=self.ttft.predictor,
            prompt_tokens=info.prompt_tokens,
        )

    def _shed_if_too_late(self, info: RequestInfo, priority: PriorityClass, now: float) -> None:
        ttft = self.ttft
        assert ttft is not None and self._views is not None
        up = ttft_up_front(ttft, self._views, info, priority, self.queue, self.shedder, now=now)
        if up.shed:
            self._metrics.shed.labels(up.reason.value).inc()
            raise PoolSaturated(
                f"shed ({up.reason.value}): the predicted time to first token on {self.model!r} is "
                f"{up.predicted_ttft_s:.2f} s, over the request's latency budget of "
                f"{up.deadline_s - info.arrival_s:.3g} s",
                code="shed",
                retry_after_s=self.queue.retry_after_s(now=now),
            )

    def release(self, info: RequestInfo) -> None:
        """The request left the pool (whatever its fate); dispatch what now fits."""
        self.in_flight -= 1
        self.queue.on_finish(info, now=time.monotonic())
        if self._waiters:
            self.pump()

    def pump(self) -> None:
        now = time.monotonic()
        queue = self.queue
        for expired, reason in queue.expire(now):
            self._refuse(expired.request.request_id, reason, now)
        while self._waiters:
            total = self._capacity()
            free = total - self.in_flight
            if free <= 0:
                break
            item = queue.next(now=now, capacity=free, total_capacity=total)
            if item is None:
                break
            fut = self._waiters.pop(item.request.request_id, None)
            if fut is None or fut.done():  # the waiter left between the offer and now
                queue.on_finish(item.request, now=now)
                continue
            self.in_flight += 1
            fut.set_result(None)

    def _refuse(self, request_id: str, reason: AdmissionReason, now: float) -> None:
        fut = self._waiters.pop(request_id, None)
        if fut is not None and not fut.done():
            err = self._refusal(reason, None, now)
            fut.set_exception(err)
            fut.exception()  # retrieved: the waiter may be gone already

    def _refusal(
        self, reason: AdmissionReason, adm: Admission | None, now: float, *, tenant: bool = False
    ) -> Refused:
        retry_after = (adm.retry_after_s if adm is not None else None) or self.queue.retry_after_s(now=now)
        if reason is AdmissionReason.SHED_LOW_PRIORITY:
            self._metrics.shed.labels(reason.value).inc()
        else:
            self._metrics.rejected.labels(reason.value).inc()
        if reason is AdmissionReason.TENANT_QUEUE_FULL or tenant:
            return TenantOverShare(
                f"the tenant is over its share of {self.model!r} ({reason.value})", retry_after_s=retry_after
            )
        return PoolSaturated(
            f"{self.model!r} is saturated ({reason.value}); try again later",
            code=reason.value,
            retry_after_s=retry_after,
        )


def _dispatched(fut: asyncio.Future[None]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None
