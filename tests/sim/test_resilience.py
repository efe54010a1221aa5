"""The resilient twin: clients that time out and retry, faults, and the control plane's answers.

Hand-checked cases use a constant step time (``dt`` = 10 ms): a lone request with ``N`` output
tokens that arrives at ``t`` gets its first token at ``t + dt`` (the prefill step samples it) and
finishes at ``t + N * dt``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.core.routing import build_router
from tokenplane.sim.controls import ControlHooks, CoreControls
from tokenplane.sim.engine import ContinuousEngine, EngineConfig, Seq
from tokenplane.sim.faults import ClientSpec, ControlSpec, FaultSpec
from tokenplane.sim.fleet import Fleet, FleetContext
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.resilience import ResilientDispatch
from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import parse_scenario
from tokenplane.sim.workloads.base import RequestSpec

DT = 0.01
APPROX = 1e-9
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Submit:
    t: float
    instance: str
    spec: RequestSpec


@dataclass
class RHarness:
    loop: EventLoop
    fleet: Fleet
    path: ResilientDispatch
    engines: list[ContinuousEngine]
    submits: list[Submit] = field(default_factory=list)

    def run(self, until: float | None = None) -> list[RequestRecord]:
        records: list[RequestRecord] = self.fleet.run(until=until).records
        return records

    @property
    def c(self) -> dict[str, int]:
        return self.path.counters

    def rec(self, request_id: int) -> RequestRecord:
        (r,) = [r for r in self.fleet.records if r.request_id == request_id]
        return r

    def submits_of(self, request_id: int) -> list[Submit]:
        return [s for s in self.submits if s.spec.request_id == request_id]


def make_resilient(
    fakes: SimpleNamespace,
    specs: Sequence[RequestSpec],
    *,
    engines: int = 2,
    clients: ClientSpec | None = None,
    controls: ControlSpec | None = None,
    faults: Sequence[FaultSpec] = (),
    hooks: ControlHooks | None = None,
    config: EngineConfig | None = None,
    model: object | None = None,
    router: str | object = "round-robin",
    seed: int = 0,
) -> RHarness:
    """A fleet on the resilient path over constant-step engines, recording every engine submission."""
    loop = EventLoop()
    tbt = TbtHistogram()
    cfg = config or EngineConfig()
    engs = [
        ContinuousEngine(
            f"i{k}",
            cfg,
            model or fakes.ConstModel(DT),  # type: ignore[arg-type]
            schedule=loop.schedule,
            schedule_late=loop.schedule_late,
            record=InstanceRecord(f"i{k}", "FAKE", "m", 1.0),
            tbt=tbt,
        )
        for k in range(engines)
    ]
    ctx = FleetContext(
        loop=loop,
        engines=engs,
        router=build_router(router, random.Random(seed)) if isinstance(router, str) else router,  # type: ignore[arg-type]
        workload=fakes.ListWorkload(list(specs)),
        model="m",
        block_size=cfg.block_size,
        tbt=tbt,
    )
    path = ResilientDispatch(
        clients=clients,
        controls=controls,
        faults=faults,
        hooks=hooks,
        seed=seed,
    )
    h = RHarness(loop, Fleet(ctx, path), path, engs)
    for e in engs:
        original = e.submit

        def submit(seq: Seq, now: float, _orig: Any = original, _id: str = e.id) -> None:
            h.submits.append(Submit(now, _id, seq.spec))
            _orig(seq, now)

        e.submit = submit  # type: ignore[method-assign]
    return h


def assert_idle_and_clean(h: RHarness, fakes: SimpleNamespace) -> None:
    for e in h.engines:
        assert not e.running and not e.waiting and not e.prefilling, e.id
        assert e.n_dec == 0, e.id
        assert e.outstanding_tokens == 0, e.id
        fakes.assert_kv_clean(e)
    assert h.fleet.in_flight == 0
    assert not h.path._pending


def spec(rid: int, t: float, prompt: int = 100, out: int = 10) -> RequestSpec:
    return RequestSpec(rid, t, prompt, out)


# -- a lost instance: continuation vs restart ----------------------------------------------------


def test_lost_mid_stream_continues_on_another_instance(fakes: SimpleNamespace) -> None:
    # i0 streams tokens at 0.01 (prefill), then one per 10 ms; lost at 0.055 after k = 5 tokens
    h = make_resilient(
        fakes,
        [spec(1, 0.0, prompt=100, out=10)],
        controls=ControlSpec(continuation=True),
        faults=[FaultSpec(kind="lose", instance=0, at_s=0.055)],
    )
    h.run()
    r = h.rec(1)
    assert r.ok and r.reason == ""
    assert r.interrupted
    assert r.attempts == 2
    assert r.first_token_s == pytest.approx(0.01, abs=APPROX)  # what the user saw first
    first, cont = h.submits_of(1)
    assert first.instance == "i0" and cont.instance == "i1"
    k = 5
    assert cont.t == pytest.approx(0.055, abs=APPROX)
    assert (cont.spec.prompt_tokens, cont.spec.output_tokens) == (100 + k, 10 - k)
    assert k + cont.spec.output_tokens == r.output_tokens == 10
    # the continuation prefills at once on i1 (next token at 0.065), then 4 more tokens
    assert r.finish_s == pytest.approx(0.055 + (10 - k) * DT, abs=APPROX)
    assert h.path.resume_gaps == [pytest.approx(DT, abs=APPROX)]
    assert h.c["streams_interrupted"] == 1
    assert h.c["streams_completed_after_loss"] == 1
    assert h.c["continuations"] == 1 and h.c["retries"] == 0
    assert h.c["lost_tokens"] == 0
    assert h.c["attempts"] == 2
    assert_idle_and_clean(h, fakes)


def test_lost_mid_stream_without_continuation_restarts_and_loses_tokens(fakes: SimpleNamespace) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0, prompt=100, out=10)],
        clients=ClientSpec(retry="naive"),
        faults=[FaultSpec(kind="lose", instance=0, at_s=0.055)],
    )
    h.run()
    r = h.rec(1)
    assert r.ok and r.interrupted and r.attempts == 2
    _, again = h.submits_of(1)
    assert (again.spec.prompt_tokens, again.spec.output_tokens) == (100, 10)  # from scratch
    assert r.finish_s == pytest.approx(0.055 + 10 * DT, abs=APPROX)
    assert h.c["lost_tokens"] == 5
    assert h.c["retries"] == 1 and h.c["continuations"] == 0
    assert h.c["streams_interrupted"] == 1
    assert_idle_and_clean(h, fakes)


def test_lost_mid_stream_with_no_retry_fails(fakes: SimpleNamespace) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0)],
        clients=ClientSpec(retry="none"),
        faults=[FaultSpec(kind="lose", instance=0, at_s=0.055)],
    )
    h.run()
    r = h.rec(1)
    assert not r.ok and r.reason == "instance_lost" and r.finish_s is None
    assert r.attempts == 1
    assert h.c["lost_tokens"] == 5
    assert_idle_and_clean(h, fakes)


def test_lost_twice_continuation_accumulates_delivered_tokens(fakes: SimpleNamespace) -> None:
    # 3 instances; i0 lost at 0.055 (5 tokens); round-robin sends the continuation to i2, lost at
    # 0.085 (3 more tokens); i1 finishes the last 2
    h = make_resilient(
        fakes,
        [spec(1, 0.0, prompt=100, out=10)],
        engines=3,
        controls=ControlSpec(continuation=True, retry_elsewhere=True),
        faults=[
            FaultSpec(kind="lose", instance=0, at_s=0.055),
            FaultSpec(kind="lose", instance=2, at_s=0.085),
        ],
    )
    h.run()
    r = h.rec(1)
    assert r.ok and r.attempts == 3
    s = h.submits_of(1)
    assert [x.instance for x in s] == ["i0", "i2", "i1"]
    assert [(x.spec.prompt_tokens, x.spec.output_tokens) for x in s] == [(100, 10), (105, 5), (108, 2)]
    assert r.finish_s == pytest.approx(0.085 + 2 * DT, abs=APPROX)
    assert h.c["streams_interrupted"] == 2  # counted per loss
    assert h.c["continuations"] == 2 and h.c["lost_tokens"] == 0
    assert_idle_and_clean(h, fakes)


# -- client timeouts: cancel or leave a zombie ---------------------------------------------------


def _timeout_case(fakes: SimpleNamespace, cancel: bool) -> RHarness:
    # i0 is 10x slow: alone, the request would take 1.0 s there; the client gives up at 0.5 s and
    # retries on i1 (0.1 s)
    return make_resilient(
        fakes,
        [spec(1, 0.0, out=10)],
        clients=ClientSpec(timeout_s=0.5, retry="naive"),
        controls=ControlSpec(cancel_on_timeout=cancel, retry_elsewhere=True),
        faults=[FaultSpec(kind="slow", instance=0, at_s=0.0, factor=10)],
    )


def test_timeout_with_cancel_frees_the_abandoned_attempt(fakes: SimpleNamespace) -> None:
    h = _timeout_case(fakes, cancel=True)
    seen: list[tuple[float, int]] = []
    h.loop.schedule(0.5 + 1e-6, lambda t, _: seen.append((t, len(h.engines[0].running))))
    h.run()
    r = h.rec(1)
    assert r.ok and r.attempts == 2 and r.instance_id == "i1"
    assert r.finish_s == pytest.approx(0.5 + 10 * DT, abs=APPROX)
    assert len(seen) == 1 and seen[0][1] == 0  # nothing left on i0 right after the timeout
    assert h.c["timeouts"] == 1 and h.c["cancelled_attempts"] == 1
    assert h.c["zombie_completions"] == 0
    assert h.engines[0].record.busy_s == pytest.approx(0.5, abs=APPROX)
    assert_idle_and_clean(h, fakes)


def test_timeout_without_cancel_leaves_a_zombie(fakes: SimpleNamespace) -> None:
    h = _timeout_case(fakes, cancel=False)
    h.run()
    r = h.rec(1)
    assert r.ok and r.attempts == 2 and r.instance_id == "i1"
    assert r.finish_s == pytest.approx(0.6, abs=APPROX)  # the retry's result, not the zombie's
    assert r.first_token_s == pytest.approx(0.5 + DT, abs=APPROX)
    assert h.c["timeouts"] == 1 and h.c["cancelled_attempts"] == 0
    assert h.c["zombie_completions"] == 1
    assert h.engines[0].record.busy_s == pytest.approx(1.0, abs=APPROX)  # the zombie ran to the end
    assert_idle_and_clean(h, fakes)


def test_retry_none_fails_with_timeout(fakes: SimpleNamespace) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0, out=10)],
        clients=ClientSpec(timeout_s=0.05, retry="none"),
        controls=ControlSpec(cancel_on_timeout=True),
    )
    h.run()
    r = h.rec(1)
    assert not r.ok and r.reason == "timeout" and r.finish_s is None
    assert r.attempts == 1 and h.c["attempts"] == 1 and h.c["retries"] == 0
    assert h.c["timeouts"] == 1
    assert_idle_and_clean(h, fakes)


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5])
def test_max_attempts_caps_attempts(fakes: SimpleNamespace, max_attempts: int) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0, out=10)],
        clients=ClientSpec(timeout_s=0.05, retry="naive", max_attempts=max_attempts),
        controls=ControlSpec(cancel_on_timeout=True),
    )
    h.run()
    r = h.rec(1)
    assert not r.ok and r.reason == "timeout"
    assert r.attempts == max_attempts == h.c["attempts"] == h.c["timeouts"]
    assert h.c["retries"] == max_attempts - 1
    assert h.c["cancelled_attempts"] == max_attempts
    assert_idle_and_clean(h, fakes)


def test_backoff_delays_within_jittered_cap(fakes: SimpleNamespace) -> None:
    base, cap, timeout = 0.2, 0.5, 0.05
    for seed in range(5):
        h = make_resilient(
            fakes,
            [spec(1, 0.0, out=10)],
            clients=ClientSpec(
                timeout_s=timeout, retry="backoff", max_attempts=6, backoff_base_s=base, backoff_max_s=cap
            ),
            controls=ControlSpec(cancel_on_timeout=True),
            seed=seed,
        )
        h.run()
        times = [s.t for s in h.submits_of(1)]
        assert len(times) == 6
        delays = [b - (a + timeout) for a, b in itertools.pairwise(times)]
        for i, d in enumerate(delays, start=1):
            assert 0.0 <= d <= min(cap, base * 2 ** (i - 1)) + APPROX, (seed, i, d)
        assert h.rec(1).reason == "timeout"
        assert_idle_and_clean(h, fakes)


# -- slow, drain ---------------------------------------------------------------------------------


def test_slow_fault_multiplies_step_times_in_its_window_only(fakes: SimpleNamespace) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0), spec(2, 1.2), spec(3, 1.95), spec(4, 2.5)],
        engines=1,
        faults=[FaultSpec(kind="slow", instance=0, at_s=1.0, duration_s=1.0, factor=3)],
    )
    h.run()
    assert h.rec(1).finish_s == pytest.approx(0.0 + 10 * DT, abs=APPROX)  # before
    assert h.rec(2).finish_s == pytest.approx(1.2 + 10 * 3 * DT, abs=APPROX)  # inside
    assert h.rec(2).first_token_s == pytest.approx(1.2 + 3 * DT, abs=APPROX)
    # straddles the end: prefill (1.98) and one decode step (2.01) at 3x, then 8 steps at 1x
    assert h.rec(3).finish_s == pytest.approx(1.95 + 2 * 3 * DT + 8 * DT, abs=1e-6)
    assert h.rec(4).finish_s == pytest.approx(2.5 + 10 * DT, abs=APPROX)  # after
    assert h.engines[0].slow == 1.0
    assert_idle_and_clean(h, fakes)


@pytest.mark.parametrize("continuation", [False, True])
def test_drain_stops_routing_then_loses_what_is_left(fakes: SimpleNamespace, continuation: bool) -> None:
    # round-robin: 1 -> i0 (short), 2 -> i1, 3 -> i0 (long). i0 drains at 0.02 with 0.2 s notice.
    specs = [spec(1, 0.0, out=10), spec(2, 0.001, out=10), spec(3, 0.002, out=100)]
    specs += [spec(10 + j, 0.03 + 0.01 * j, out=5) for j in range(8)]
    h = make_resilient(
        fakes,
        specs,
        clients=ClientSpec(retry="none"),
        controls=ControlSpec(continuation=continuation),
        faults=[FaultSpec(kind="drain", instance=0, at_s=0.02, notice_s=0.2)],
    )
    h.run()
    assert [s.instance for s in h.submits if s.t >= 0.02] == ["i1"] * (len(h.submits) - 3)
    assert all(h.rec(10 + j).ok and h.rec(10 + j).instance_id == "i1" for j in range(8))
    r1 = h.rec(1)
    assert r1.ok and r1.instance_id == "i0" and r1.finish_s is not None and r1.finish_s < 0.22
    assert not r1.interrupted
    r3 = h.rec(3)
    assert r3.interrupted
    assert h.c["streams_interrupted"] == 1
    assert h.submits_of(3)[0].instance == "i0"
    if continuation:
        assert r3.ok and r3.attempts == 2 and r3.instance_id == "i1"
        _, cont = h.submits_of(3)
        assert cont.t == pytest.approx(0.22, abs=APPROX)
        delivered = cont.spec.prompt_tokens - 100
        assert 0 < delivered < 100 and cont.spec.output_tokens == 100 - delivered
        assert h.c["streams_completed_after_loss"] == 1 and h.c["lost_tokens"] == 0
    else:
        assert not r3.ok and r3.reason == "instance_lost" and r3.attempts == 1
        assert h.c["lost_tokens"] > 0 and h.c["streams_completed_after_loss"] == 0
    assert not h.engines[0].ready  # no replacement configured
    assert_idle_and_clean(h, fakes)


def test_lose_with_replacement_serves_again(fakes: SimpleNamespace) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0), spec(2, 1.0), spec(3, 1.001), spec(4, 1.002)],
        controls=ControlSpec(continuation=True),
        faults=[FaultSpec(kind="lose", instance=0, at_s=0.5, replace_after_s=0.3)],
    )
    h.run()
    assert h.engines[0].ready
    assert {s.instance for s in h.submits if s.t >= 0.8} == {"i0", "i1"}
    assert all(r.ok for r in h.fleet.records)
    assert_idle_and_clean(h, fakes)


# -- retry budget and breakers -------------------------------------------------------------------

ZERO_BUDGET = {"ratio": 0.0, "min_per_s": 0.0, "min_tokens_per_s": 0.0}


def test_zero_retry_budget_denies_retries(fakes: SimpleNamespace) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0), spec(2, 0.001)],
        clients=ClientSpec(timeout_s=0.05, retry="naive"),
        controls=ControlSpec(cancel_on_timeout=True, retry_budget=ZERO_BUDGET),
    )
    h.run()
    for rid in (1, 2):
        r = h.rec(rid)
        assert not r.ok and r.reason == "timeout_retry_denied" and r.attempts == 1
    assert h.c["retries"] == 0 and h.c["attempts"] == 2
    assert_idle_and_clean(h, fakes)


def test_zero_retry_budget_denies_continuations(fakes: SimpleNamespace) -> None:
    h = make_resilient(
        fakes,
        [spec(1, 0.0)],
        controls=ControlSpec(continuation=True, retry_budget=ZERO_BUDGET),
        faults=[FaultSpec(kind="lose", instance=0, at_s=0.055)],
    )
    h.run()
    r = h.rec(1)
    assert not r.ok and r.reason == "instance_lost_retry_denied" and r.attempts == 1
    assert r.interrupted and h.c["continuations"] == 0
    assert h.c["streams_completed_after_loss"] == 0
    assert_idle_and_clean(h, fakes)


def test_breaker_takes_a_timing_out_instance_out_of_routing(fakes: SimpleNamespace) -> None:
    # i0 is 100x slow; every attempt there times out. After 2 consecutive failures its breaker
    # opens (long cooldown) and nothing more is routed there.
    specs = [spec(j, 1.0 * j, out=10) for j in range(12)]
    h = make_resilient(
        fakes,
        specs,
        engines=3,
        clients=ClientSpec(timeout_s=0.5, retry="naive"),
        controls=ControlSpec(
            cancel_on_timeout=True,
            retry_elsewhere=True,
            breaker={"consecutive_failures": 2, "cooldown_s": 1000, "max_cooldown_s": 1000},
        ),
        faults=[FaultSpec(kind="slow", instance=0, at_s=0.0, factor=100)],
    )
    h.run()
    on_i0 = [s for s in h.submits if s.instance == "i0"]
    assert len(on_i0) == 2  # requests 0 and 3 under round-robin, then never again
    opened_at = on_i0[-1].t + 0.5
    assert all(s.instance != "i0" for s in h.submits if s.t >= opened_at)
    assert all(r.ok for r in h.fleet.records)
    assert isinstance(h.path.hooks, CoreControls)
    assert h.path.hooks.events == {"breaker_to_open_consecutive_failures": 1}
    assert_idle_and_clean(h, fakes)


class RecordingHooks(ControlHooks):
    def __init__(self) -> None:
        self.dispatched: list[str] = []
        self.results: list[tuple[str, bool]] = []

    def on_dispatch(self, instance_id: str, *, now: float) -> None:
        self.dispatched.append(instance_id)

    def on_result(self, instance_id: str, ok: bool, latency_s: float | None, *, now: float) -> None:
        self.results.append((instance_id, ok))


def test_each_attempt_reports_one_result_to_the_breaker(fakes: SimpleNamespace) -> None:
    hooks = RecordingHooks()
    h = _timeout_case_with_hooks(fakes, hooks)
    h.run()
    assert h.c["zombie_completions"] == 1
    assert len(hooks.results) == len(hooks.dispatched) == 2
    assert hooks.results == [("i0", False), ("i1", True)]


def _timeout_case_with_hooks(
    fakes: SimpleNamespace, hooks: ControlHooks | None = None, router: str | object = "round-robin"
) -> RHarness:
    return make_resilient(
        fakes,
        [spec(1, 0.0, out=10)],
        clients=ClientSpec(timeout_s=0.5, retry="naive"),
        controls=ControlSpec(retry_elsewhere=True),
        faults=[FaultSpec(kind="slow", instance=0, at_s=0.0, factor=10)],
        hooks=hooks,
        router=router,
    )


def test_zombie_completion_is_reported_for_its_own_instance(fakes: SimpleNamespace) -> None:
    rr = fakes.RoundRobin()
    h = _timeout_case_with_hooks(fakes, RecordingHooks(), router=rr)
    h.run()
    assert h.c["zombie_completions"] == 1
    assert sorted(rr.routed) == [("1", "i0"), ("1", "i1")]
    assert sorted(rr.finished) == [("1", "i0"), ("1", "i1")]


def _abort_mid_run_case(fakes: SimpleNamespace, model: object | None = None) -> RHarness:
    # 1 decodes alone on i0; 2 arrives at 0.035 and joins; at 0.055 the client of 1 gives up and
    # the attempt is cancelled in the middle of a two-sequence decode run (0.05 -> 0.07)
    return make_resilient(
        fakes,
        [spec(1, 0.0, out=10), spec(2, 0.035, out=3), spec(3, 1.0, prompt=100, out=5)],
        engines=1,
        clients=ClientSpec(timeout_s=0.055, retry="none"),
        controls=ControlSpec(cancel_on_timeout=True),
        model=model,
    )


def test_abort_mid_run_cancels_the_attempt(fakes: SimpleNamespace) -> None:
    h = _abort_mid_run_case(fakes)
    h.run()
    assert h.rec(1).reason == "timeout" and h.c["cancelled_attempts"] == 1
    assert h.rec(2).ok and h.rec(2).finish_s == pytest.approx(0.07, abs=APPROX)
    assert h.rec(3).ok and h.rec(3).finish_s == pytest.approx(1.0 + 5 * DT, abs=APPROX)
    assert_idle_and_clean(h, fakes)


def test_abort_mid_run_leaves_no_phantom_context(fakes: SimpleNamespace) -> None:
    h = _abort_mid_run_case(fakes)
    h.run()
    assert h.engines[0].sum_ctx == 0
    # visible in time: with a KV-read term, request 3 (alone on an idle engine) must take exactly
    # what it takes on a fresh engine
    kv_model = fakes.LinearModel(DT, 0.0, decode_kv_s_per_token=1e-6)
    slow = _abort_mid_run_case(fakes, model=kv_model)
    slow.run()
    fresh = make_resilient(fakes, [spec(3, 1.0, prompt=100, out=5)], engines=1, model=kv_model)
    fresh.run()
    assert slow.rec(3).finish_s == pytest.approx(fresh.rec(3).finish_s, abs=1e-9)


def test_fault_on_a_missing_instance_is_rejected(fakes: SimpleNamespace) -> None:
    with pytest.raises(ValueError, match=r"faults\[0\]: instance 5"):
        make_resilient(fakes, [], faults=[FaultSpec(kind="lose", instance=5, at_s=1.0)])


# -- property: every logical request ends once, engines end clean ---------------------------------

faults_st = st.lists(
    st.builds(
        FaultSpec,
        kind=st.sampled_from(["slow", "lose", "drain"]),
        instance=st.integers(0, 2),
        at_s=st.floats(0.0, 1.0),
        duration_s=st.one_of(st.none(), st.floats(0.01, 1.0)),
        factor=st.floats(0.5, 20.0),
        notice_s=st.floats(0.0, 0.5),
        replace_after_s=st.one_of(st.none(), st.floats(0.0, 0.5)),
    ),
    max_size=3,
)
specs_st = st.lists(
    st.tuples(st.floats(0.0, 1.0), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=12
).map(lambda xs: [RequestSpec(i, t, p, o) for i, (t, p, o) in enumerate(sorted(xs))])
clients_st = st.builds(
    ClientSpec,
    timeout_s=st.one_of(st.none(), st.floats(0.03, 0.6)),
    retry=st.sampled_from(["none", "naive", "backoff"]),
    max_attempts=st.integers(1, 4),
    backoff_base_s=st.floats(0.01, 0.2),
    backoff_max_s=st.floats(0.01, 0.5),
    retry_on_error=st.booleans(),
)
controls_st = st.builds(
    ControlSpec,
    cancel_on_timeout=st.booleans(),
    continuation=st.booleans(),
    retry_elsewhere=st.booleans(),
    breaker=st.one_of(
        st.none(), st.just({"consecutive_failures": 2, "cooldown_s": 0.2, "max_cooldown_s": 1.0})
    ),
    retry_budget=st.one_of(st.none(), st.just({"ratio": 0.5, "min_per_s": 2.0}), st.just(ZERO_BUDGET)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=specs_st,
    faults=faults_st,
    clients=clients_st,
    controls=controls_st,
    router=st.sampled_from(["round-robin", "least-requests"]),
)
def test_every_request_ends_once_and_engines_end_clean(
    fakes: SimpleNamespace,
    specs: list[RequestSpec],
    faults: list[FaultSpec],
    clients: ClientSpec,
    controls: ControlSpec,
    router: str,
) -> None:
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, kv_capacity_tokens=2048)
    h = make_resilient(
        fakes, specs, engines=3, clients=clients, controls=controls, faults=faults, config=cfg, router=router
    )
    h.run()
    recs = h.fleet.records
    assert sorted(r.request_id for r in recs) == [s.request_id for s in specs]
    ends = sorted(rid for rid, _, _ in h.fleet.workload.finished)  # type: ignore[attr-defined]
    assert ends == [s.request_id for s in specs]  # exactly one terminal outcome each
    for r in recs:
        assert r.attempts >= 1
        if r.ok:
            assert r.reason == ""
            assert r.first_token_s is not None and r.finish_s is not None
            assert r.arrival_s <= r.first_token_s <= r.finish_s
        else:
            assert r.reason and r.finish_s is None
        if not clients.timeout_s and all(f.kind == "slow" for f in faults):
            assert r.attempts == 1 and r.ok
    c = h.c
    assert all(v >= 0 for v in c.values()), c
    assert c["attempts"] == sum(r.attempts for r in recs)
    assert c["attempts"] == len(recs) + c["retries"] + c["continuations"]
    assert c["streams_completed_after_loss"] <= c["streams_interrupted"]
    assert c["streams_completed_after_loss"] <= sum(r.ok and r.interrupted for r in recs)
    assert c["cancelled_attempts"] <= c["timeouts"]
    if not controls.continuation:
        assert c["continuations"] == 0
    if controls.cancel_on_timeout:
        assert c["zombie_completions"] == 0
    assert all(g >= 0 for g in h.path.resume_gaps)
    assert_idle_and_clean(h, fakes)


# -- the shipped scenarios, shortened ------------------------------------------------------------


def _shortened(name: str, **edits: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    for key, value in edits.items():
        node: Any = raw
        *path, last = key.split(".")
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return raw


def test_cascade_controls_beat_naive_retries() -> None:
    # 150 s instead of 600; the 5x slowdown at 30 s for 60 s so that it fits
    raw = _shortened(
        "cascade.yaml",
        duration_s=150,
        **{"workload.duration_s": 150, "faults.0.at_s": 30, "faults.0.duration_s": 60},
    )
    out = run_scenario(parse_scenario(raw))
    ref, naive, ctl = (out[n].report for n in ("no-fault", "naive", "controlled"))
    assert ctl["goodput_rps"] >= naive["goodput_rps"]
    assert ctl["goodput_rps"] >= 0.9 * ref["goodput_rps"]
    assert naive["zombie_completions"] > 0
    assert ctl["zombie_completions"] == 0
    assert ctl["cancelled_attempts"] > 0
    for rep in (ref, naive, ctl):
        assert rep["goodput_timeline"] and all(len(p) == 2 for p in rep["goodput_timeline"])


def test_lost_gpu_continuation_completes_interrupted_streams() -> None:
    raw = _shortened(
        "lost-gpu.yaml",
        duration_s=150,
        **{"workload.duration_s": 100, "faults.0.at_s": 60, "faults.0.replace_after_s": 30},
    )
    out = run_scenario(parse_scenario(raw))
    restart, cont = out["restart"].report, out["continuation"].report
    assert cont["streams_interrupted"] > 0
    assert cont["streams_completed_after_loss"] >= 0.99 * cont["streams_interrupted"]
    assert cont["lost_tokens"] == 0 and cont["continuations"] > 0
    assert cont["resume_gap_p50_s"] is not None and cont["resume_gap_p50_s"] >= 0
    assert restart["lost_tokens"] > 0 and restart["continuations"] == 0
