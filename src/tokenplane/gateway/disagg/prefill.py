"""One prefill attempt: the prefill request to a prefill instance, and the handover it answers with.

The instance computes the prompt's KV and one token, and answers (not streamed) with the
``kv_transfer_params`` a decode instance needs (read by the runtime adapter,
:class:`~tokenplane.gateway.runtimes.vllm.VllmKvTransfer`). What can happen:

* the handover: the parameters (the instance is fine; its breaker hears a success);
* a failure before the handover (unreachable, 5xx, timeout, or an answer without usable parameters):
  the instance's failure (breaker, health), and the flow tries another prefill instance;
* the instance's own 4xx OpenAI error (the prompt is too long...): the request's fault, answered to
  the client as it came.

Its span, ledger record and breaker outcome are its own: a prefill is an attempt that costs GPU
time even though the client never sees its token.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiohttp import web

from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.retry_budget import AttemptKind
from tokenplane.gateway.errors import (
    GatewayError,
    KvHandoverInvalid,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from tokenplane.gateway.proxy import open_upstream, rejection
from tokenplane.gateway.resilience import Resilience
from tokenplane.gateway.runtimes.vllm import VllmKvTransfer
from tokenplane.gateway.stages.attempt import upstream_url
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.transports.base import Transports, UpstreamReply
from tokenplane.gateway.upstreams import Upstream, UpstreamPool

Handover = dict[str, Any]
"""The prefill's ``kv_transfer_params``, for the decode request."""


class PrefillFailed:
    """A prefill that did not hand over: the outcome for the retry plan, and why."""

    __slots__ = ("error", "outcome")

    def __init__(self, outcome: AttemptOutcome, error: GatewayError) -> None:
        self.outcome = outcome
        self.error = error


class Prefills:
    __slots__ = ("pool", "resilience", "transports")

    def __init__(self, transports: Transports, pool: UpstreamPool, resilience: Resilience) -> None:
        self.transports = transports
        self.pool = pool
        self.resilience = resilience

    async def run(
        self,
        ex: RequestContext,
        upstream: Upstream,
        body: bytes,
        kv: VllmKvTransfer,
        timeout_s: float,
        number: int,
    ) -> Handover | PrefillFailed | web.Response:
        """One prefill on ``upstream``: its handover, its failure, or the instance's 4xx answer."""
        info = ex.info
        assert info is not None
        tokens = info.prompt_tokens + 1
        trace = ex.trace
        span = trace.begin_attempt(upstream.id, number, AttemptKind.FIRST, info.prompt_tokens)
        started = time.monotonic()
        upstream.begin(tokens)
        self.resilience.on_attempt(upstream.id, started)
        result = AttemptResult.FAILED_BEFORE_FIRST_BYTE
        resp: UpstreamReply | None = None
        clean = False
        abandoned = False
        error: GatewayError | None = None
        try:
            try:
                resp = await open_upstream(
                    self.transports,
                    upstream,
                    upstream_url(upstream, ex.endpoint),
                    body,
                    trace.headers(span),
                    first_byte_s=timeout_s,
                )
                upstream.heard_at = time.monotonic()
                if resp.status != 200:
                    out = await rejection(resp, upstream)  # raises for 5xx and non-OpenAI 4xx
                    result = AttemptResult.OK  # the instance works; the request was refused
                    return out
                data = await _read(resp, upstream)
                clean = True
            except UpstreamError as exc:
                error = exc
                if isinstance(exc, UpstreamTimeout):
                    result = AttemptResult.TIMEOUT
                if not (isinstance(exc, UpstreamTimeout) and upstream.answered_since(started)):
                    self.pool.record_failure(upstream, exc.reason)
                return PrefillFailed(_outcome(result, upstream, started), exc)
            except GatewayError as exc:  # an instance's 4xx that is not an OpenAI error
                result = AttemptResult.OK
                error = exc
                raise
            except BaseException:  # cancelled: the client left; the instance is not at fault
                if resp is not None and resp.status == 200:
                    result = AttemptResult.OK
                else:
                    abandoned = True
                raise
            got = kv.handover(data)
            if isinstance(got, str):
                error = KvHandoverInvalid(f"prefill instance {upstream.id}: {got}")
                self.pool.record_failure(upstream, error.reason)
                return PrefillFailed(_outcome(result, upstream, started), error)
            result = AttemptResult.OK
            upstream.record_success()
            return got
        finally:
            latency = time.monotonic() - started if result is AttemptResult.OK else None
            if abandoned:
                self.resilience.on_abandoned(upstream.id)
            else:
                self.resilience.on_outcome(AttemptOutcome(result, upstream.id, 0, time.monotonic(), latency))
            if resp is not None:
                if clean:
                    resp.release()
                else:
                    resp.close()
            upstream.end(tokens)
            ok = error is None and result is AttemptResult.OK
            cost = 0.0
            if ex.ledger is not None:
                reason = "prefill" if ok else (error.outcome if error is not None else "client_disconnected")
                cost = ex.ledger.done(info, upstream.config, info.prompt_tokens, 1 if ok else 0, ok, reason)
            trace.end_attempt(span, None if ok else "prefill_failed", result.value, 1 if ok else 0, cost)


async def _read(resp: UpstreamReply, upstream: Upstream) -> bytes:
    try:
        return await resp.read()
    except TimeoutError:
        raise UpstreamTimeout(f"prefill instance {upstream.id} did not finish in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamUnavailable.caused_by(f"prefill instance {upstream.id} broke off", exc) from None


def _outcome(result: AttemptResult, upstream: Upstream, started: float) -> AttemptOutcome:
    return AttemptOutcome(result, upstream.id, 0, time.monotonic(), None)


__all__ = ["Handover", "PrefillFailed", "Prefills"]
