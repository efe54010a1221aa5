"""The workflow rules as pure functions: a new workflow's first attempt is the empty summary's
transition (``apply_attempt(None, a)`` skips building that summary), and the ledger's running
totals are the sums ``add_task`` keeps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.economics import TaskOutcome, add_task
from tokenplane.ledger.records import AttemptRecord, WorkflowSummary
from tokenplane.ledger.rules import apply_attempt
from tokenplane.ledger.store import add_to_totals, totals_keys

_steps = st.one_of(st.none(), st.integers(1, 6))
_attempts = st.builds(
    AttemptRecord,
    request_id=st.sampled_from(["r1", "r2"]),
    workflow_id=st.just("wf"),
    tenant=st.just("acme"),
    instance_id=st.just("up-0"),
    tokens_in=st.integers(0, 5000),
    tokens_out=st.integers(0, 500),
    cost_usd=st.floats(0, 1, allow_nan=False),
    ok=st.booleans(),
    reason=st.sampled_from(["ok", "timeout", ""]),
    t=st.floats(0, 1e6, allow_nan=False),
    model=st.sampled_from(["", "llama"]),
    step=_steps,
    total_steps=_steps,
    terminal=st.booleans(),
)


def _empty(a: AttemptRecord) -> WorkflowSummary:
    return WorkflowSummary(
        workflow_id=a.workflow_id, tenant=a.tenant, outcome=TaskOutcome.OPEN, first_t=a.t, last_t=a.t
    )


@given(st.lists(_attempts, min_size=1, max_size=6))
def test_a_first_attempt_is_the_empty_summarys_transition(attempts: list[AttemptRecord]) -> None:
    fast = apply_attempt(None, attempts[0])
    assert fast == apply_attempt(_empty(attempts[0]), attempts[0])
    slow = fast
    for a in attempts[1:]:  # and the two agree from there on
        fast, slow = apply_attempt(fast, a), apply_attempt(slow, a)
    assert fast == slow


@given(st.lists(st.tuples(_attempts, st.sampled_from([1, -1])), max_size=8))
def test_running_totals_are_add_tasks_sums(writes: list[tuple[AttemptRecord, int]]) -> None:
    acc: dict = {}
    want: dict = {}
    for a, sign in writes:
        w = apply_attempt(None, a)
        add_to_totals(acc, w, sign)
        for key in totals_keys(w):
            add_task(want.setdefault(key, [0.0] * 6), w, sign)
    assert acc == want
