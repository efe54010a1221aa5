"""The disaggregated flow: a stage just before forward that serves a disaggregated model's requests.

Each attempt of the core retry plan (:func:`tokenplane.core.retry_budget.attempts`, through
:class:`~tokenplane.gateway.resilience.Resilience`) is one (prefill, decode) pair chosen by the
model's pair router (:mod:`tokenplane.core.routing.pd`) over the instances the breakers allow:

1. prefill: the request with one output token and ``kv_transfer_params.do_remote_decode``, not
   streamed, to the prefill instance (:mod:`.prefill`); it answers with the KV's handover;
2. decode: the request as the client sent it, with the handover's parameters, to the decode
   instance, answered or streamed to the client by the forward stage's own attempt
   (:class:`~tokenplane.gateway.stages.attempt.Attempts`), checked first for a failed KV load
   (:mod:`.decode_check`).

Failures, on either side, become outcomes for the plan (which budgets, delays and bounds them):

* the prefill fails before handing over: the outcome is the prefill instance's, so the next pair
  avoids it (another prefill instance);
* the decode cannot load the KV (the prefill instance died after handing over, or dropped the KV):
  the outcome is the prefill instance's too, and the next attempt prefills again elsewhere (or on
  the same instance when it is the only one); a prefill instance that dies after the decode has
  loaded its KV changes nothing;
* the decode fails: before the first token it is retried on another pair; after it (mid-stream),
  the stream is continued: the continuation request (the prompt plus the text delivered,
  :func:`~tokenplane.gateway.continuation.continuation_body`) is prefilled and decoded on another
  decode instance, and spliced into the client's one stream.

With no prefill instance available (all down or open), a decode instance serves the request whole
(``pool.colocated_fallback``): vLLM prefills locally a request without KV-transfer parameters.
A client's own ``kv_transfer_params`` are refused (400): the gateway owns the flow.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo
from tokenplane.gateway.catalog import ServedModel
from tokenplane.gateway.continuation import can_continue, continuation_body
from tokenplane.gateway.disagg.decode_check import check_plain, check_stream
from tokenplane.gateway.disagg.pools import DisaggregatedPools, PdPool
from tokenplane.gateway.disagg.prefill import PrefillFailed, Prefills
from tokenplane.gateway.errors import GatewayError, InvalidParameter, KvTransferFailed, NoHealthyInstance
from tokenplane.gateway.proxy import OUTCOME_UPSTREAM_REJECTED
from tokenplane.gateway.resilience import Resilience
from tokenplane.gateway.runtimes import PD_RUNTIMES
from tokenplane.gateway.stages.attempt import Attempts
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.stages.forward import (
    before_retry,
    budget_bounds_first_byte,
    delivered_all,
    plan_deadline_s,
    settle_failure,
    stream_splicer,
    ttft_budget_left,
)
from tokenplane.gateway.upstreams import Upstream, UpstreamPool

_encode = msgspec.json.Encoder().encode


def _usable(views: Sequence[InstanceView]) -> list[InstanceView]:
    return [v for v in views if v.ready and v.healthy]


class Disaggregate:
    """The stage: a disaggregated model's request runs the P/D flow here; any other passes on."""

    __slots__ = ("attempts", "pd", "pool", "prefills", "resilience", "retry_after", "upstream_timeout_s")
    cleans_up = False

    def __init__(
        self,
        pd: DisaggregatedPools,
        attempts: Attempts,
        prefills: Prefills,
        pool: UpstreamPool,
        resilience: Resilience,
        retry_after: Callable[[str, float], float],
        upstream_timeout_s: float,
    ) -> None:
        self.pd = pd
        self.attempts = attempts
        self.prefills = prefills
        self.pool = pool
        self.resilience = resilience
        self.retry_after = retry_after
        self.upstream_timeout_s = upstream_timeout_s

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        model = ctx.served
        if model is None or ctx.endpoint not in ("chat", "completions"):
            return None  # other routes (embeddings...) pass through to any of the pool's instances
        pool = self.pd.pools.get(model.name)
        if pool is None:
            return None
        parsed = ctx.parsed
        assert parsed is not None
        if "kv_transfer_params" in parsed.body:
            raise InvalidParameter(
                f"kv_transfer_params: the gateway sets them for {model.name!r} (a disaggregated pool); "
                "leave them out",
                param="kv_transfer_params",
            )
        return self._run(ctx, pool)

    def exit(self, ctx: RequestContext) -> None:
        pass

    def pair(
        self, info: RequestInfo, model: ServedModel, pool: PdPool, now: float, exclude: frozenset[InstanceId]
    ) -> tuple[Upstream | None, Upstream, str]:
        """(prefill instance or None for a whole request on the decode one, decode instance, reason)."""
        res = self.resilience
        prefill, decode = [], []
        for u in self.pool.for_model(model.name):
            role = u.config.role
            if role != "decode":
                prefill.append(u.view())
            if role != "prefill":
                decode.append(u.view())
        pre = _usable(res.candidates(prefill, exclude, now))
        if not pre and exclude:  # prefilling again where it failed beats not prefilling
            pre = _usable(res.candidates(prefill, frozenset(), now))
        dec = _usable(res.candidates(decode, exclude, now))
        decision = pool.router.select_pair(info, pre, dec, now=now)
        pid, did = decision.prefill_id, decision.decode_id
        if did is None and pool.config.colocated_fallback and dec and not pre:
            only = pool.router.select_pair(info, dec, dec, now=now)
            return None, self._get(only.decode_id, model, now), "pd_colocated_fallback"
        return self._get(pid, model, now), self._get(did, model, now), decision.reason.value

    def _get(self, iid: InstanceId | None, model: ServedModel, now: float) -> Upstream:
        upstream = self.pool.get(iid) if iid is not None else None
        if upstream is None:
            raise NoHealthyInstance(
                f"no healthy prefill and decode instances serve {model.name!r} right now",
                retry_after_s=self.retry_after(model.name, now),
            )
        return upstream

    async def _run(self, ex: RequestContext, pd: PdPool) -> None:
        info, parsed, model, tenant = ex.info, ex.parsed, ex.served, ex.caller
        assert info is not None and parsed is not None and model is not None and tenant is not None
        body = parsed.body
        body["model"] = info.adapter or model.served_name
        res = self.resilience
        metrics = self.pd.metrics
        deadline_s = ex.deadline_s
        splicer = stream_splicer(ex, parsed, res)
        check = check_stream if splicer is not None else check_plain
        plan = res.plan(
            info,
            now=time.monotonic(),
            deadline_s=plan_deadline_s(ex, parsed.stream, self.upstream_timeout_s),
            allow_continuation=tenant.continuation and can_continue(parsed),
        )
        attempt = next(plan)
        error: GatewayError | None = None
        try:
            while True:
                request = body
                if attempt.number > 1:
                    await before_retry(res, model.name, attempt, splicer)
                    if splicer is not None and splicer.delivered_tokens:
                        request = continuation_body(parsed, splicer.text, splicer.delivered_tokens)
                now = time.monotonic()
                ttft_left = ttft_budget_left(deadline_s, now, splicer)
                if ttft_left is not None and ttft_left <= 0 and error is not None:
                    break  # nothing delivered and the latency budget is spent: no retry
                try:
                    prefill, decode, reason = self.pair(info, model, pd, now, attempt.exclude)
                except NoHealthyInstance as exc:
                    error = error or exc
                    break
                ex.reason = reason
                outcome: AttemptOutcome
                if prefill is not None:
                    kv = PD_RUNTIMES[prefill.config.kind]
                    timeout = pd.config.prefill_timeout_s
                    if ttft_left is not None:
                        timeout = min(timeout, ttft_left)
                    got = await self.prefills.run(
                        ex, prefill, _encode(kv.prefill_body(request)), kv, timeout, attempt.number
                    )
                    if isinstance(got, PrefillFailed):
                        metrics.count(model.name, "prefill_failed")
                        error = got.error
                        try:
                            attempt = plan.send(got.outcome)
                        except StopIteration:
                            break
                        continue
                    if not isinstance(got, dict):  # the prefill instance's own 4xx answer
                        ex.outcome = OUTCOME_UPSTREAM_REJECTED
                        ex.response = got
                        return
                    metrics.count(model.name, "handover")
                    raw = _encode(PD_RUNTIMES[decode.config.kind].decode_body(request, got))
                else:
                    metrics.count(model.name, "colocated_fallback")
                    raw = _encode(request)
                first_byte_cap = res.retry.first_byte_timeout_s
                by_budget = budget_bounds_first_byte(first_byte_cap, ttft_left, splicer)
                cap = ttft_left if by_budget else first_byte_cap
                try:
                    outcome, out, error = await self.attempts.accounted(
                        ex, raw, decode, splicer, cap, attempt.kind, attempt.number, by_budget, check
                    )
                except KvTransferFailed as exc:  # the KV is gone with its prefill: prefill again
                    assert prefill is not None
                    metrics.count(model.name, "kv_transfer_failed")
                    self.pool.record_failure(prefill, exc.reason)
                    error = exc
                    outcome = AttemptOutcome(
                        AttemptResult.FAILED_BEFORE_FIRST_BYTE, prefill.id, 0, time.monotonic()
                    )
                else:
                    if error is None and out is not None:
                        ex.response = out
                        return
                    if await delivered_all(ex, splicer):
                        return
                try:
                    attempt = plan.send(outcome)
                except StopIteration:
                    break
        finally:
            plan.close()
        assert error is not None
        await settle_failure(ex, splicer, error)


__all__ = ["Disaggregate"]
