from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.sim.workloads.agentic import AGENTIC_PRESETS, AgenticWorkload
from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.dists import IntDist, LengthDist

Latency = Callable[[RequestSpec], float]


def drive(
    w: AgenticWorkload,
    latency: Latency = lambda s: 0.5 + 0.001 * s.output_tokens,
    fail: Callable[[RequestSpec], bool] = lambda s: False,
) -> list[tuple[RequestSpec, float]]:
    """A tiny closed-loop fleet: each call takes ``latency(spec)``; returns (spec, finish) in finish order."""
    heap: list[tuple[float, int, RequestSpec]] = []
    first = list(w.arrivals())
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(first))
    for s in first:
        heapq.heappush(heap, (s.arrival_s + latency(s), s.request_id, s))
    done: list[tuple[RequestSpec, float]] = []
    while heap:
        finish, _, spec = heapq.heappop(heap)
        done.append((spec, finish))
        for f in w.on_finished(spec, finish, not fail(spec)):
            assert f.arrival_s >= finish
            heapq.heappush(heap, (f.arrival_s + latency(f), f.request_id, f))
    assert w.in_flight == 0
    return done


def simple(**kw: object) -> AgenticWorkload:
    params: dict[str, object] = {
        "users": 1,
        "tasks_per_user": 1,
        "steps_per_task": 5,
        "system_prompt_tokens": 100,
        "first_prompt_tokens": LengthDist.fixed(50),
        "tool_result_tokens": LengthDist.fixed(30),
        "output_tokens": LengthDist.fixed(20),
        "think_time_s": LengthDist.fixed(1.0),
        "seed": 1,
    }
    params.update(kw)
    return AgenticWorkload(**params)  # type: ignore[arg-type]


def by_workflow(done: list[tuple[RequestSpec, float]]) -> dict[str, list[RequestSpec]]:
    out: dict[str, list[RequestSpec]] = defaultdict(list)
    for spec, _ in sorted(done, key=lambda d: d[0].request_id):
        assert spec.workflow is not None
        out[spec.workflow.workflow_id].append(spec)
    return dict(out)


def test_prompt_growth_and_workflow_context() -> None:
    done = drive(simple())
    specs = [s for s, _ in done]
    assert [s.prompt_tokens for s in specs] == [150, 200, 250, 300, 350]
    assert [s.workflow.step for s in specs if s.workflow] == [1, 2, 3, 4, 5]
    assert {(s.workflow.workflow_id, s.workflow.total_steps) for s in specs if s.workflow} == {("u0-t0", 5)}
    assert {s.tenant for s in specs} == {"agents"}
    # Each step arrives one think time (1 s) after the previous one finished.
    for (_, fin), (nxt, _) in pairwise(done):
        assert nxt.arrival_s == pytest.approx(fin + 1.0)


def test_prefix_hashes_grow_and_partial_blocks_get_new_ids() -> None:
    specs = [s for s, _ in drive(simple())]
    for prev, nxt in pairwise(specs):
        assert len(nxt.block_hashes) == nxt.prompt_tokens // 16
        assert nxt.block_hashes[: len(prev.block_hashes)] == prev.block_hashes
    # Step 1: 150 tokens = 9 full blocks; block 9 (tokens 144..159) is partial and unhashed. Step 2
    # extends it, so it is hashed then with an id no earlier step used.
    s1, s2 = specs[0], specs[1]
    assert len(s1.block_hashes) == 9
    assert s2.block_hashes[9] not in s1.block_hashes
    all_ids = [h for s in specs for h in s.block_hashes[len(specs[0].block_hashes) :]]
    assert len(set(specs[-1].block_hashes)) == len(specs[-1].block_hashes)
    assert set(all_ids) <= set(specs[-1].block_hashes)


def test_system_prompt_blocks_shared_by_all_users_task_blocks_unique() -> None:
    w = simple(users=4, tasks_per_user=2, steps_per_task=3, user_start_spread_s=10.0)
    flows = by_workflow(drive(w))
    assert len(flows) == 8
    system = {f[0].block_hashes[:6] for f in flows.values()}
    assert len(system) == 1  # 100 tokens of system prompt = 6 full blocks, the same for everybody
    owned = [set(f[-1].block_hashes[6:]) for f in flows.values()]
    for a in range(len(owned)):
        for b in range(a + 1, len(owned)):
            assert owned[a].isdisjoint(owned[b])
    # The block straddling the end of the system prompt is task-owned.
    assert flows["u0-t0"][0].block_hashes[6] != flows["u1-t0"][0].block_hashes[6]


def test_users_start_spread_and_tasks_run_in_sequence() -> None:
    w = simple(users=5, tasks_per_user=3, steps_per_task=2, user_start_spread_s=100.0)
    first = list(w.arrivals())
    assert len(first) == 5
    assert all(0.0 <= s.arrival_s <= 100.0 for s in first)
    assert len({s.arrival_s for s in first}) == 5
    done = drive(w)
    assert len(done) == 5 * 3 * 2
    finish_of_task: dict[str, float] = {}
    for spec, fin in done:
        assert spec.workflow is not None
        user, task = spec.workflow.workflow_id.split("-")
        if task != "t0":
            prev = f"{user}-t{int(task[1:]) - 1}"
            assert spec.arrival_s >= finish_of_task[prev]
        finish_of_task[spec.workflow.workflow_id] = fin


def test_parallel_calls_wait_for_the_whole_step() -> None:
    w = simple(calls_per_step=3, output_tokens=LengthDist.uniform(10, 500))
    done = drive(w, latency=lambda s: 0.01 * s.output_tokens)
    steps: dict[int, list[tuple[RequestSpec, float]]] = defaultdict(list)
    for spec, fin in done:
        assert spec.workflow is not None
        steps[spec.workflow.step].append((spec, fin))
    assert sorted(steps) == [1, 2, 3, 4, 5]
    for k in range(1, 5):
        calls = steps[k]
        assert len(calls) == 3
        assert len({s.arrival_s for s, _ in calls}) == 1
        assert len({s.block_hashes for s, _ in calls}) == 1
        last_finish = max(f for _, f in calls)
        nxt = steps[k + 1][0][0]
        assert nxt.arrival_s == pytest.approx(last_finish + 1.0)
        first_call = min(calls, key=lambda c: c[0].request_id)[0]
        assert nxt.prompt_tokens == first_call.prompt_tokens + first_call.output_tokens + 30
    assert w.expected_calls_per_user() == 15


def test_failure_abandons_the_task() -> None:
    w = simple(tasks_per_user=2)

    def fail(s: RequestSpec) -> bool:
        return s.workflow is not None and s.workflow.workflow_id == "u0-t0" and s.workflow.step == 2

    done = drive(w, fail=fail)
    flows = by_workflow(done)
    assert [s.workflow.step for s in flows["u0-t0"] if s.workflow] == [1, 2]
    assert [s.workflow.step for s in flows["u0-t1"] if s.workflow] == [1, 2, 3, 4, 5]
    failed_finish = next(f for s, f in done if fail(s))
    assert flows["u0-t1"][0].arrival_s == pytest.approx(failed_finish + 1.0)


def test_context_cap_ends_tasks_early() -> None:
    w = simple(steps_per_task=100, max_context_tokens=1000)
    specs = [s for s, _ in drive(w)]
    assert all(s.prompt_tokens <= 1000 for s in specs)
    assert len(specs) == 1 + (1000 - 150) // 50  # 150, 200, ..., 1000
    clipped = simple(first_prompt_tokens=LengthDist.fixed(5000), max_context_tokens=1000)
    assert next(iter(clipped.arrivals())).prompt_tokens == 1000
    with pytest.raises(ValueError, match="max_context_tokens"):
        simple(max_context_tokens=100)


def test_deterministic_by_seed_whatever_the_timing() -> None:
    def key(done: list[tuple[RequestSpec, float]]) -> dict[str, list[tuple[object, ...]]]:
        return {
            wf: [(s.prompt_tokens, s.output_tokens, s.block_hashes, s.workflow) for s in specs]
            for wf, specs in by_workflow(done).items()
        }

    def make(seed: int) -> AgenticWorkload:
        return AgenticWorkload.preset("copilot", users=3, tasks_per_user=2, seed=seed)

    a = drive(make(5))
    assert [(s, f) for s, f in a] == [(s, f) for s, f in drive(make(5))]
    slow = drive(make(5), latency=lambda s: 3.0 + 0.01 * s.prompt_tokens)
    assert key(a) == key(slow)
    assert key(a) != key(drive(make(6)))
    # arrivals() resets the state: the same object replays the same run.
    w = make(5)
    assert drive(w) == drive(w)


def test_unknown_spec_is_ignored() -> None:
    w = simple()
    list(w.arrivals())
    stranger = RequestSpec(request_id=999, arrival_s=0.0, prompt_tokens=1, output_tokens=1)
    assert w.on_finished(stranger, 1.0, True) == ()


@pytest.mark.parametrize("name", sorted(AGENTIC_PRESETS))
def test_presets(name: str) -> None:
    w = AgenticWorkload.preset(name, users=2, seed=3)
    assert w.name == f"agentic-{name}"
    if name == "autonomous":
        w = AgenticWorkload.preset(name, users=1, seed=3)
    done = drive(w, latency=lambda s: 0.2)
    flows = by_workflow(done)
    steps = w.steps_per_task
    for specs in flows.values():
        n = len(specs)
        assert specs[0].workflow is not None
        planned = specs[0].workflow.total_steps
        assert planned is not None and steps.min <= planned <= steps.max
        assert n <= planned
        if w.max_context_tokens is None or specs[-1].prompt_tokens < w.max_context_tokens - 2_000:
            assert n == planned or n < planned  # the cap may end it early
        if w.max_context_tokens is not None:
            assert all(s.prompt_tokens <= w.max_context_tokens for s in specs)
    assert len(done) <= w.users * w.expected_calls_per_user() * (steps.max / steps.mean_value())
    assert w.expected_calls() == w.users * w.expected_calls_per_user()


def test_preset_ranges_and_overrides() -> None:
    assert AgenticWorkload.preset("chat").steps_per_task == IntDist(1, 1)
    assert AgenticWorkload.preset("copilot").steps_per_task == IntDist(10, 20)
    research = AgenticWorkload.preset("research").steps_per_task
    assert research.min <= 50 <= research.max
    auto = AgenticWorkload.preset("autonomous")
    assert auto.steps_per_task.min >= 200 and auto.steps_per_task.max >= 1000
    assert auto.max_context_tokens is not None
    assert AgenticWorkload.preset("chat", users=7, steps_per_task=2).users == 7
    with pytest.raises(ValueError, match="unknown agentic preset"):
        AgenticWorkload.preset("nope")


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    system=st.integers(0, 200),
    block=st.integers(1, 64),
    calls=st.integers(1, 3),
    cap=st.one_of(st.none(), st.integers(300, 3000)),
)
def test_hash_properties(seed: int, system: int, block: int, calls: int, cap: int | None) -> None:
    w = AgenticWorkload(
        users=2,
        tasks_per_user=2,
        steps_per_task=IntDist(1, 6),
        calls_per_step=calls,
        system_prompt_tokens=system,
        first_prompt_tokens=LengthDist.lognormal(200, 1.0),
        tool_result_tokens=LengthDist.uniform(0, 100),
        output_tokens=LengthDist.lognormal(50, 1.0),
        think_time_s=LengthDist.lognormal(1.0, 1.0),
        user_start_spread_s=5.0,
        hash_block_tokens=block,
        seed=seed,
        max_context_tokens=cap,
    )
    for specs in by_workflow(drive(w)).values():
        for s in specs:
            assert len(s.block_hashes) == s.prompt_tokens // block
            assert s.block_hashes[: system // block] == tuple(range(system // block))
        for prev, nxt in pairwise(specs):
            assert nxt.prompt_tokens >= prev.prompt_tokens
            assert nxt.block_hashes[: len(prev.block_hashes)] == prev.block_hashes
