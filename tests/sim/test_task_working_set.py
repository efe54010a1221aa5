"""The twin's working set of started tasks: what enters and leaves it, the growth it learns, and
that its sums always equal what its contexts hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.task_admission import KvWorkingSetLimit
from tokenplane.core.views import InstanceView, RequestInfo, WorkflowContext
from tokenplane.sim.task_working_set import WORKING_SET_STALE_S, TaskWorkingSet
from tokenplane.sim.workloads.base import RequestSpec

VIEWS = [InstanceView("i0", kv_capacity_tokens=10_000)]


def info(
    wf: str | None, step: int = 1, total: int | None = 3, prompt: int = 100, out: int = 100
) -> RequestInfo:
    workflow = None if wf is None else WorkflowContext(wf, step=step, total_steps=total)
    return RequestInfo(
        request_id=f"{wf}-{step}", model="m", prompt_tokens=prompt, max_output_tokens=out, workflow=workflow
    )


def spec(wf: str, step: int, total: int | None = 3, prompt: int = 100, out: int = 50) -> RequestSpec:
    return RequestSpec(0, 0.0, prompt, out, workflow=WorkflowContext(wf, step=step, total_steps=total))


def test_a_new_task_is_refused_when_the_started_ones_fill_the_budget_and_later_steps_never_are() -> None:
    ws = TaskWorkingSet(KvWorkingSetLimit(0.1), growth_alpha=0.5)  # a 1,000-token budget
    # the first task is admitted whatever its size: 400 now, 1,200 by step 3 (growth assumed 400)
    assert ws.refusal(info("a", prompt=300, out=100), VIEWS, 0.0) is None
    assert list(ws.contexts) == ["a"] and ws.working_set_tokens == 1200 and ws.context_now_tokens == 400
    assert ws.refusal(info("b"), VIEWS, 1.0) == "kv_working_set"
    assert "b" not in ws.contexts
    assert ws.refusal(info("a", step=2, prompt=600, out=100), VIEWS, 2.0) is None  # a started task
    assert ws.refusal(info(None), VIEWS, 3.0) is None  # no workflow: not the limit's business
    assert ws.max_working_set_tokens >= ws.working_set_tokens


def test_growth_is_learned_from_tasks_that_move_on() -> None:
    ws = TaskWorkingSet(KvWorkingSetLimit(10.0), growth_alpha=0.5)
    assert ws.growth is None
    ws.refusal(info("a", step=1, prompt=100, out=100), VIEWS, 0.0)
    ws.refusal(info("a", step=3, prompt=500, out=100), VIEWS, 1.0)  # +400 over two steps
    assert ws.growth == 200.0
    ws.refusal(info("b", step=1, prompt=100, out=100), VIEWS, 2.0)
    ws.refusal(info("b", step=2, prompt=500, out=100), VIEWS, 3.0)  # +400 in one step
    assert ws.growth == 200.0 + 0.5 * (400.0 - 200.0)


def test_a_task_leaves_when_it_fails_finishes_or_goes_stale() -> None:
    ws = TaskWorkingSet(KvWorkingSetLimit(10.0), growth_alpha=0.5)
    for wf in ("fails", "finishes", "moves", "stale"):
        ws.refusal(info(wf), VIEWS, 0.0 if wf == "stale" else 100.0)
    ws.on_end(spec("fails", 1), 101.0, ok=False)
    ws.on_end(spec("finishes", 3), 101.0, ok=True)
    ws.on_end(spec("moves", 1, prompt=100, out=40), 101.0, ok=True)  # the real output stays cached
    assert set(ws.contexts) == {"moves", "stale"}
    assert ws.contexts["moves"][0] == 140
    ws.refusal(info("other"), VIEWS, WORKING_SET_STALE_S + 0.5)
    assert "stale" not in ws.contexts


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]),
            st.integers(1, 4),
            st.integers(0, 3000),
            st.booleans(),
            st.booleans(),
        ),
        max_size=60,
    )
)
def test_the_sums_are_the_contexts_sums(events: list[tuple[str, int, int, bool, bool]]) -> None:
    ws = TaskWorkingSet(KvWorkingSetLimit(0.5), growth_alpha=0.2)
    now = 0.0
    for wf, step, prompt, ends, ok in events:
        now += 7.0
        if ends:
            ws.on_end(spec(wf, step, total=4, prompt=prompt), now, ok=ok)
        else:
            ws.refusal(info(wf, step=step, total=4, prompt=prompt), VIEWS, now)
        assert ws.context_now_tokens == sum(c[0] for c in ws.contexts.values())
        assert ws.working_set_tokens == sum(c[1] for c in ws.contexts.values())
        assert ws.max_working_set_tokens >= ws.working_set_tokens
        assert ws.max_context_tokens >= ws.context_now_tokens
        seen = [c[4] for c in ws.contexts.values()]
        assert seen == sorted(seen)  # least recently seen first: pruning stops at the first fresh one
