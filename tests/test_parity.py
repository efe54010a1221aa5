"""One core, two shells: the gateway and the twin decide the same on the same inputs.

Retries. The same requests, scripted attempt outcomes and clock readings go through the gateway's
:class:`~tokenplane.gateway.resilience.Resilience` (its plan, breaker board and candidate filter, as
``Gateway.forward`` drives them) and through the twin's :class:`~tokenplane.sim.retry_driver.PlanDriver`
on its event loop (with :class:`~tokenplane.sim.resilience.CoreControls` for breakers and the twin's
exclusion of tried instances), both over the core's ``attempts`` plan with the same budget, policy and
breaker config. Every attempt (number, kind, exclusions, delay, resumed tokens, budget cost), the
instance each was routed to with its reason, and each plan's result must be identical.

Routing. The same engines' state is seen as the twin sees it (``ContinuousEngine.view()``) and as the
gateway would (an :class:`InstanceView` built field by field as ``gateway/upstream.py``'s
``Upstream.view()`` builds it from the same numbers); the same router config must choose the same
instance for the same reason in both.

What would make it fail (each was tried by hand): the twin charging its old budget cost
(``prompt + output`` for a request with a smaller ``max_output_tokens``) exhausts the token budget at
a different retry; the twin ignoring ``Attempt.exclude`` (or falling back to a tried instance) routes
a retry back to the failed instance; the twin adding its own backoff to a continuation changes
``delay_s`` and so the dispatch clock and the breaker's cooldown; the twin filling ``weights`` or
``kv_capacity_tokens`` differently makes the view comparison and a KV-aware router's choice differ.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tokenplane.core.admission import AdmissionQueue, PriorityClass
from tokenplane.core.breaker import BreakerBoard, BreakerConfig
from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.retry_budget import Attempt, PlanResult, RetryBudget, RetryPolicy
from tokenplane.core.routing import build_router
from tokenplane.core.shedding import LoadShedder
from tokenplane.core.ttft import PoolTtft
from tokenplane.core.views import InstanceView, RequestInfo, WorkflowContext
from tokenplane.gateway.admission import AdmissionMetrics, PoolAdmission
from tokenplane.gateway.config import HealthConfig, InstanceConfig
from tokenplane.gateway.errors import Refused
from tokenplane.gateway.resilience import Resilience
from tokenplane.gateway.resilience_config import BreakerParams, RetryConfig
from tokenplane.gateway.runtimes import RuntimeMetrics
from tokenplane.gateway.upstreams import Upstream
from tokenplane.sim.admission_shell import AdmissionGate
from tokenplane.sim.controls import CoreControls, avoid_tried
from tokenplane.sim.engine import ContinuousEngine, EngineConfig, FinishFn, Seq
from tokenplane.sim.faults import ClientSpec
from tokenplane.sim.fleet import Fleet, FleetContext
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.resilience import _Pending
from tokenplane.sim.retry_driver import PlanDriver, RetryPlanner
from tokenplane.sim.scenario import AdmissionSettings
from tokenplane.sim.workloads.base import RequestSpec

IDS = ("a", "b", "c")
BREAKER = {"consecutive_failures": 2, "cooldown_s": 5.0, "max_cooldown_s": 5.0}
RETRY = RetryConfig(
    budget_ratio=0.5,
    min_per_s=0.5,
    min_tokens_per_s=300.0,
    window_s=10.0,
    max_attempts=4,
    backoff_base_s=0.2,
    backoff_multiplier=2.0,
    backoff_max_s=1.0,
)

# (result, tokens delivered by the attempt, seconds from its dispatch to its end)
Step = tuple[AttemptResult, int, float]
OK: Step = (AttemptResult.OK, 0, 0.5)
BEFORE: Step = (AttemptResult.FAILED_BEFORE_FIRST_BYTE, 0, 0.1)
TIMEOUT: Step = (AttemptResult.TIMEOUT, 0, 2.0)


def mid(tokens: int) -> Step:
    return (AttemptResult.FAILED_MID_STREAM, tokens, 0.3)


#: (prompt, max_output, scripted outcomes of its attempts in order; the plan may stop early). One
#: request every SPACING_S seconds, each over before the next arrives, so both shells see the same
#: order of events; the budget's window and the breakers' cooldown span several requests.
SCRIPT: list[tuple[int, int, list[Step]]] = [
    (100, 50, [OK]),
    (200, 80, [BEFORE, OK]),
    (300, 40, [mid(10), OK]),
    (150, 60, [BEFORE, BEFORE, BEFORE, BEFORE]),  # exhausted, or no instance left untried
    (120, 30, [mid(5), mid(7), OK]),
    (900, 400, [TIMEOUT, BEFORE, OK]),
    (100, 20, [BEFORE, OK]),
    (5000, 1000, [BEFORE, BEFORE, OK]),  # big: the token budget decides
    (100, 20, [mid(3), TIMEOUT, OK]),
    (100, 20, [OK]),
    (100, 20, [BEFORE, OK]),
]
SPACING_S = 4.0


@dataclass(frozen=True)
class Seen:
    number: int
    kind: str
    exclude: tuple[str, ...]
    delay_s: float
    resume_tokens: int
    cost_tokens: int
    at_s: float
    instance: str | None
    route_reason: str

    @classmethod
    def of(cls, a: Attempt, at_s: float, instance: str | None, reason: str) -> Seen:
        return cls(
            a.number,
            str(a.kind),
            tuple(sorted(a.exclude)),
            a.delay_s,
            a.resume_tokens,
            a.cost_tokens,
            round(at_s, 9),
            instance,
            reason,
        )


def _views() -> list[InstanceView]:
    return [InstanceView(instance_id=i, outstanding_requests=n) for n, i in enumerate(IDS)]


def _info(k: int, prompt: int, max_output: int, now: float) -> RequestInfo:
    return RequestInfo(
        request_id=str(k), model="m", prompt_tokens=prompt, max_output_tokens=max_output, arrival_s=now
    )


def gateway_side() -> tuple[list[list[Seen]], list[PlanResult | None]]:
    """As ``Gateway.forward`` drives the plan (the sleeps are the scripted clock)."""
    res = Resilience(RETRY, BreakerParams(**BREAKER), CollectorRegistry(), lambda: IDS)
    router = build_router("least-requests", random.Random(0))
    seen: list[list[Seen]] = []
    results: list[PlanResult | None] = []
    for k, (prompt, max_out, steps) in enumerate(SCRIPT):
        arrival = k * SPACING_S
        info = _info(k, prompt, max_out, arrival)
        plan = res.plan(info, now=arrival, deadline_s=None, allow_continuation=True)
        attempt = next(plan)
        now = arrival
        mine: list[Seen] = []
        for result, tokens, took in steps:
            now += attempt.delay_s
            views = res.candidates(_views(), attempt.exclude, now)
            decision = router.select(info, views, now=now)
            iid = decision.instance_id
            mine.append(Seen.of(attempt, now, iid, str(decision.reason)))
            if iid is None:  # NoHealthyInstance: the request fails without a verdict on anyone
                results.append(None)
                break
            res.on_attempt(iid, now)
            now += took
            outcome = AttemptOutcome(result, iid, tokens, now, took if result is AttemptResult.OK else None)
            res.on_outcome(outcome)
            try:
                attempt = plan.send(outcome)
            except StopIteration as stop:
                results.append(stop.value)
                break
        seen.append(mine)
    return seen, results


def twin_side() -> tuple[list[list[Seen]], list[PlanResult | None]]:
    """As ``ResilientDispatch`` drives it: the event loop dispatches each attempt after its delay."""
    loop = EventLoop()
    planner = RetryPlanner(
        RetryPolicy.from_params(RETRY.policy_params()),
        RetryBudget.from_params(RETRY.budget_params()),
        allow_continuation=True,
        rng=None,
    )
    controls = CoreControls(BreakerBoard(BreakerConfig.from_params(BREAKER)))
    router = build_router("least-requests", random.Random(0))
    seen: list[list[Seen]] = [[] for _ in SCRIPT]
    results: list[PlanResult | None] = []

    class Request:
        def __init__(self, k: int) -> None:
            prompt, max_out, steps = SCRIPT[k]
            arrival = k * SPACING_S
            self.k = k
            self.info = _info(k, prompt, max_out, arrival)
            self.steps = list(steps)
            self.driver = PlanDriver(
                planner.plan(self.info, now=arrival), self, loop=loop, dispatch=dispatch, finish=finish
            )

    def dispatch(now: float, r: Request) -> None:
        attempt = r.driver.attempt
        views = avoid_tried(controls.filter_views(_views(), now=now), attempt.exclude)
        decision = router.select(r.info, views, now=now)
        iid = decision.instance_id
        seen[r.k].append(Seen.of(attempt, now, iid, str(decision.reason)))
        if iid is None:  # as ResilientDispatch: the request ends with reason no_instance
            r.driver.close()
            results.append(None)
            return
        controls.on_dispatch(iid, now=now)
        result, tokens, took = r.steps.pop(0)
        latency = took if result is AttemptResult.OK else None
        loop.schedule(now + took, end, (r, AttemptOutcome(result, iid, tokens, now + took, latency)))

    def end(now: float, arg: tuple[Request, AttemptOutcome]) -> None:
        r, outcome = arg
        controls.on_result(outcome.instance_id or "", outcome.ok, outcome.latency_s, now=now)
        r.driver.report(outcome)

    def finish(now: float, r: Request, result: PlanResult) -> None:
        results.append(result)

    for k in range(len(SCRIPT)):
        loop.schedule(k * SPACING_S, lambda now, k: Request(k).driver.start(now), k)
    loop.run()
    return seen, results


def test_both_shells_drive_the_retry_plan_identically() -> None:
    g_seen, g_results = gateway_side()
    t_seen, t_results = twin_side()
    assert t_seen == g_seen
    assert t_results == g_results
    assert len(g_results) == len(SCRIPT)
    reasons = {str(r.reason) if r is not None else "no_instance" for r in g_results}
    # the script exercises success, the token budget, and a request with no instance left
    assert {"succeeded", "budget_tokens", "no_instance"} <= reasons, reasons
    assert any(s.kind == "continuation" for per in g_seen for s in per)
    assert any(s.exclude for per in g_seen for s in per)


# -- routing on the views each shell builds ---------------------------------------------------------


class ConstSteps:
    """Every engine step costs 10 ms."""

    decode_kv_s_per_token = 0.0
    prefill_s_per_pair = 0.0

    def linear_time(self, num_tokens: int) -> float:
        return 0.01


KV_BYTES_PER_TOKEN = 131_072


def _engines(on_finish: FinishFn | None = None) -> tuple[EventLoop, list[ContinuousEngine]]:
    """Three engines of one model pool, sharing its observed TTFT as a fleet shares it."""
    loop = EventLoop()
    tbt = TbtHistogram()
    cfg = EngineConfig(max_num_seqs=2, kv_capacity_tokens=8192)
    pool = PoolTtft()
    engines = [
        ContinuousEngine(
            i,
            cfg,
            ConstSteps(),
            schedule=loop.schedule,
            schedule_late=loop.schedule_late,
            record=InstanceRecord(i, "H100", "m", 2.5),
            tbt=tbt,
            kv_bytes_per_token=KV_BYTES_PER_TOKEN,
            ttft=pool,
        )
        for i in IDS
    ]
    changed: set[int] = set()
    for n, e in enumerate(engines):
        e.bind(n, changed, on_finish)
    return loop, engines


class GatewayMirror:
    """Real gateway :class:`Upstream` objects, one per engine, told what the gateway would know:
    each instance's config (its KV size, price, GPU, bytes per token), a scrape of its metrics
    (running, waiting, KV use), its own accounting of requests sent (``begin``/``end``), an answered
    health check, and the pool's observed TTFTs (``observe_ttft``)."""

    def __init__(self, engines: list[ContinuousEngine]) -> None:
        self.ttft = PoolTtft()
        self.ups: dict[str, Upstream] = {}
        for e in engines:
            cfg = InstanceConfig(
                id=e.id,
                url="http://127.0.0.1:9",
                model=e.record.model,
                gpu=e.record.gpu,
                price_per_hour=e.record.price_per_hour,
                kv_capacity_tokens=e.capacity_tokens,
                kv_bytes_per_token=e.kv_bytes_per_token,
            )
            u = self.ups[e.id] = Upstream(cfg, HealthConfig(failures_to_down=1), ttft=self.ttft)
            u.record_probe_success()

    def view(self, e: ContinuousEngine) -> InstanceView:
        u = self.ups[e.id]
        scraped = RuntimeMetrics(running=len(e.running), waiting=len(e.waiting), kv_usage=e.kv.usage)
        u.apply_metrics(scraped, now=0.0)
        return u.view()


def _feed_first_tokens(mirror: GatewayMirror, seqs: list[Seq], fed: set[int]) -> None:
    """The gateway observes each attempt's TTFT and the queue it was sent behind; in the order the
    twin's engines produced the first tokens (first token time, then submission order)."""
    new = [q for q in seqs if q.generated >= 1 and q.uid not in fed and q.record.first_token_s is not None]
    for q in sorted(new, key=lambda q: (q.record.first_token_s or 0.0, q.uid)):
        fed.add(q.uid)
        first = q.record.first_token_s or 0.0
        mirror.ups[q.record.instance_id or ""].observe_ttft(first - q.sent_s, q.waiting_ahead, now=first)


ROUTERS: list[Any] = [
    "round-robin",
    "least-requests",
    "least-tokens",
    {"name": "prefix-affinity"},
    {"name": "power-of-two"},
]


@pytest.mark.parametrize("router", ROUTERS, ids=lambda r: r if isinstance(r, str) else r["name"])
def test_same_router_same_views_same_decisions(router: Any) -> None:
    ups: dict[str, Upstream] = {}

    def finished(seq: Seq, now: float) -> None:  # the gateway's accounting: the request left
        ups[seq.record.instance_id or ""].end(seq.spec.prompt_tokens + seq.info.max_output_tokens)

    loop, engines = _engines(finished)
    mirror = GatewayMirror(engines)
    ups.update(mirror.ups)
    twin_router = build_router(router, random.Random(7))
    gw_router = build_router(router, random.Random(7))
    rng = random.Random(3)
    seqs: list[Seq] = []
    fed: set[int] = set()
    for k in range(40):
        now = k * 0.005
        loop.run(until=now)
        _feed_first_tokens(mirror, seqs, fed)
        prefix = rng.randrange(4)
        hashes = tuple(hash((prefix, j)) for j in range(rng.randrange(1, 8)))
        spec = RequestSpec(k, now, 16 * len(hashes) + 5, rng.randrange(1, 30), block_hashes=hashes)
        info = RequestInfo(
            request_id=str(k),
            model="m",
            prompt_tokens=spec.prompt_tokens,
            max_output_tokens=spec.output_tokens,
            block_hashes=hashes,
            arrival_s=now,
        )
        twin_views = [e.view() for e in engines]
        gw_views = [mirror.view(e) for e in engines]
        assert twin_views == gw_views  # a field one shell fills and the other does not fails here
        t = twin_router.select(info, twin_views, now=now)
        g = gw_router.select(info, gw_views, now=now)
        assert (t.instance_id, t.reason) == (g.instance_id, g.reason), k
        assert t.instance_id is not None
        twin_router.on_routed(info, t.instance_id, now=now)
        gw_router.on_routed(info, g.instance_id, now=now)
        e = next(e for e in engines if e.id == t.instance_id)
        rec = RequestRecord(k, "default", now, spec.prompt_tokens, spec.output_tokens)
        rec.instance_id = e.id
        seq = Seq(k, spec, info, rec, 16)
        seqs.append(seq)
        mirror.ups[e.id].begin(spec.prompt_tokens + info.max_output_tokens)
        e.submit(seq, now)
    loop.run()
    _feed_first_tokens(mirror, seqs, fed)
    # the seven-axis fields were filled, and the pool's TTFT was learned, in both shells alike
    assert mirror.ttft.observed == engines[0].ttft.observed == len(seqs)
    # (the order of first tokens at one instant differs between engines' events and a sort; an EWMA
    # depends on the order a little)
    assert math.isclose(mirror.ttft.mean_prefill_s, engines[0].ttft.mean_prefill_s, rel_tol=1e-2)
    assert engines[0].ttft.mean_prefill_s > 0
    assert all(v.hbm_free_bytes > 0 and v.predicted_ttft_s > 0 for v in (e.view() for e in engines))


# -- admission: the up-front TTFT rule in both shells -------------------------------------------------

ADMISSION_QUEUE = {"budget_s": {"interactive": 1.0, "standard": 5.0, "batch": 60.0}}
INTERACTIVE, STANDARD = 1, 0

#: One admission script: ("queue", instance, n) n more requests wait on an instance (an engine's
#: queue; the gateway scrapes it); ("ttft", instance, seconds, waiting ahead) an attempt's first
#: token was observed; ("down", instance) the instance is lost; ("request", prompt tokens, class,
#: latency budget, workflow deadline from now) a request arrives and is admitted or refused.
ADMISSION_SCRIPT: list[tuple[Any, ...]] = [
    ("request", 5000, INTERACTIVE, 0.2, None),  # hopeless, but nothing observed yet: no prediction
    ("queue", 0, 5),
    ("queue", 1, 8),
    ("queue", 2, 3),
    ("request", 5000, INTERACTIVE, 0.2, None),  # still no first token observed
    ("ttft", 0, 2.4, 5),  # 0.4 s per request ahead: the mean moves from 0.2 to 0.22 s
    ("request", 1000, STANDARD, 0.5, None),  # 3 x 0.22 + 0.1 = 0.76 s > 0.5: shed
    ("request", 1000, STANDARD, 1.0, None),  # 0.76 s < 1: admitted
    ("request", 5000, INTERACTIVE, None, None),  # the class's 1 s: 0.66 + 0.5 = 1.16 s: shed
    ("request", 5000, STANDARD, None, None),  # the class's 5 s: admitted
    ("request", 100, STANDARD, 10.0, 0.5),  # the workflow's deadline caps the budget: shed
    ("queue", 2, 6),  # the shortest queue is now 5 long
    ("ttft", 1, 0.9, 8),  # 0.1 s per request ahead: the mean falls to 0.208 s
    ("request", 1000, STANDARD, 1.2, None),  # 5 x 0.208 + 0.1 = 1.14 s < 1.2: admitted
    ("request", 1000, STANDARD, 1.1, None),  # 1.14 s > 1.1: shed
    ("down", 0),
    ("request", 1000, STANDARD, 1.2, None),  # c: 9 x 0.208 + 0.1 = 1.97 s: shed
    ("request", 1000, STANDARD, 2.0, None),  # admitted
]
# (With no usable instance left the shells part ways after the rule, which lets the request through
# in both: the gateway's admission stage answers 503 "no healthy instance", while the twin's gate
# queues it for capacity that may come back. tests/core/test_ttft.py covers the rule's answer.)
ADMISSION_SPACING_S = 0.5


class NoArrivals:
    name = "none"

    def arrivals(self) -> Iterator[RequestSpec]:
        return iter(())

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> list[RequestSpec]:
        return []


class RecordingPath:
    """The twin's request path beyond its admission gate, recording what the gate decided."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.clients = ClientSpec()
        self.decisions: list[tuple[str, str]] = []

    def send(self, now: float, p: _Pending) -> None:
        self.decisions.append(("admitted", ""))

    def end(self, p: _Pending, now: float, *, ok: bool, reason: str) -> None:
        self.decisions.append(("refused", reason))


def _spec(
    k: int, prompt: int, cls: int, budget: float | None, wf_in: float | None, now: float
) -> RequestSpec:
    wf = None if wf_in is None else WorkflowContext(f"w{k}", deadline_s=now + wf_in)
    return RequestSpec(k, now, prompt, 16, priority=cls, latency_budget_s=budget, workflow=wf)


def admission_twin_side() -> list[tuple[str, str]]:
    """The twin's :class:`AdmissionGate` over a real fleet of engines."""
    loop, engines = _engines()
    fleet = Fleet(
        FleetContext(
            loop,
            engines,
            build_router("least-requests", random.Random(0)),
            NoArrivals(),
            "m",
            16,
            TbtHistogram(),
        )
    )
    gate = AdmissionGate(AdmissionSettings(max_in_flight_per_instance=100, queue=ADMISSION_QUEUE), {})
    path = RecordingPath(fleet)
    gate.bind(path)  # type: ignore[arg-type]  # a recording stand-in for ResilientDispatch
    uid = 1000
    for k, step in enumerate(ADMISSION_SCRIPT):
        now = k * ADMISSION_SPACING_S
        if step[0] == "queue":
            e = engines[step[1]]
            for _ in range(step[2]):
                uid += 1
                spec = RequestSpec(uid, now, 10, 10)
                info = RequestInfo(str(uid), "m", 10, 10, arrival_s=now)
                e.submit(Seq(uid, spec, info, RequestRecord(uid, "default", now, 10, 10), 16), now)
        elif step[0] == "ttft":
            engines[step[1]].ttft.observe(step[2], step[3], now=now)  # as the engine does at a first token
        elif step[0] == "down":
            engines[step[1]].ready = False
            engines[step[1]].changed.add(step[1])
        else:
            spec = _spec(k, step[1], step[2], step[3], step[4], now)
            gate.dispatch(now, _Pending(spec, RequestRecord(k, "default", now, spec.prompt_tokens, 16)))
    return path.decisions


def admission_gateway_side() -> list[tuple[str, str]]:
    """The gateway's :class:`PoolAdmission` over real :class:`Upstream` objects that scrape the same
    queues and observe the same first tokens."""
    _, engines = _engines()
    mirror = GatewayMirror(engines)
    pool = PoolAdmission(
        "m",
        AdmissionQueue.from_params(ADMISSION_QUEUE, pool="m"),
        LoadShedder.from_params({}),
        lambda: 100 * sum(u.view().healthy for u in mirror.ups.values()),
        AdmissionMetrics(CollectorRegistry(), dict),
        views=lambda: [u.view() for u in mirror.ups.values()],
        ttft=mirror.ttft,
    )
    queued = {e.id: 0 for e in engines}
    decisions: list[tuple[str, str]] = []

    async def admit(info: RequestInfo, cls: PriorityClass, now: float) -> None:
        try:
            await pool.admit(info, cls, now)
        except Refused as err:
            reason = "shed_ttft_over_budget" if "ttft_over_budget" in err.message else err.code
            decisions.append(("refused", reason))
        else:
            decisions.append(("admitted", ""))
            pool.release(info)

    for k, step in enumerate(ADMISSION_SCRIPT):
        now = k * ADMISSION_SPACING_S
        if step[0] == "queue":
            u = mirror.ups[engines[step[1]].id]
            queued[u.id] += step[2]
            u.apply_metrics(RuntimeMetrics(waiting=queued[u.id]), now=now)
        elif step[0] == "ttft":
            mirror.ups[engines[step[1]].id].observe_ttft(step[2], step[3], now=now)
        elif step[0] == "down":
            mirror.ups[engines[step[1]].id].record_failure("connection refused")
        else:
            spec = _spec(k, step[1], step[2], step[3], step[4], now)
            info = RequestInfo(
                str(k), "m", spec.prompt_tokens, 16, priority=spec.priority, arrival_s=now,
                workflow=spec.workflow, latency_budget_s=spec.latency_budget_s,
            )  # fmt: skip
            asyncio.run(admit(info, PriorityClass.from_value(spec.priority), now))
    return decisions


def test_both_shells_admit_and_shed_up_front_identically() -> None:
    twin = admission_twin_side()
    gateway = admission_gateway_side()
    assert twin == gateway
    assert twin.count(("refused", "shed_ttft_over_budget")) == 5, twin
    assert twin[0] == twin[1] == twin[-1] == ("admitted", ""), twin  # no prediction yet; in budget
