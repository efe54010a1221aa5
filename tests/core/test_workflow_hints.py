"""Workflow hints from headers, metadata, vLLM and Dynamo shapes; errors as values."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.views import WorkflowContext
from tokenplane.core.workflow_hints import HintError, WorkflowHints, parse_workflow_hints

NOW = 1_000.0


def ok(headers: dict[str, str] | None = None, body: dict[str, Any] | None = None, **kw: Any) -> WorkflowHints:
    r = parse_workflow_hints(headers or {}, body, now=NOW, **kw)
    assert isinstance(r, WorkflowHints), r
    assert r.ok
    return r


def err(headers: dict[str, str] | None = None, body: dict[str, Any] | None = None, **kw: Any) -> HintError:
    r = parse_workflow_hints(headers or {}, body, now=NOW, **kw)
    assert isinstance(r, HintError), r
    assert not r.ok
    assert r.status == 400
    return r


def test_no_hints() -> None:
    r = ok({}, {"model": "m", "messages": []}, base_priority=1)
    assert r.workflow is None
    assert r.priority == 1
    assert r.requested_priority is None


def test_headers_request_r_at_step_3_of_5() -> None:
    r = ok(
        {
            "X-Tokenplane-Workflow-Id": "task-42",
            "x-tokenplane-step": "3",
            "x-tokenplane-total-steps": "5",
            "x-tokenplane-deadline-s": "30.5",
        }
    )
    assert r.workflow == WorkflowContext(workflow_id="task-42", step=3, total_steps=5, deadline_s=NOW + 30.5)


def test_metadata_with_numbers_or_strings() -> None:
    r = ok({}, {"metadata": {"workflow_id": "w", "step": 2, "total_steps": "4", "deadline_s": 10}})
    assert r.workflow == WorkflowContext(workflow_id="w", step=2, total_steps=4, deadline_s=NOW + 10)


def test_headers_win_over_metadata_field_by_field() -> None:
    r = ok({"x-tokenplane-step": "2"}, {"metadata": {"workflow_id": "w", "step": "1", "total_steps": "3"}})
    assert r.workflow == WorkflowContext(workflow_id="w", step=2, total_steps=3)


@pytest.mark.parametrize("encode", [False, True])
def test_vllm_agentic_context_object_or_json_string(encode: bool) -> None:
    ctx = {"session_id": "agent-run", "step_index": 4, "expected_steps": 6, "priority": -1}
    body = {"vllm_xargs": {"agentic_context": json.dumps(ctx) if encode else ctx}}
    r = ok({}, body)
    assert r.workflow == WorkflowContext(workflow_id="agent-run", step=4, total_steps=6)
    assert r.priority == -1


def test_dynamo_agent_hints_and_context() -> None:
    body = {
        "nvext": {
            "agent_hints": {
                "priority": 5,
                "osl": 1024,
                "latency_sensitivity": 1.2,
                "speculative_prefill": True,
            },
            "agent_context": {
                "session_type_id": "deep_research",
                "session_id": "run-42",
                "trajectory_id": "x",
            },
        }
    }
    r = ok({}, body)
    assert r.workflow == WorkflowContext(workflow_id="run-42")
    assert r.expected_output_tokens == 1024
    assert r.requested_priority == 5
    assert r.priority == 0  # the tenant does not allow raising
    assert r.priority_capped


def test_metadata_beats_vllm_beats_dynamo() -> None:
    body = {
        "metadata": {"workflow_id": "from-metadata"},
        "vllm_xargs": {"agentic_context": {"workflow_id": "from-vllm", "step": 2, "priority": 0}},
        "nvext": {"agent_hints": {"priority": 3}, "agent_context": {"session_id": "from-dynamo"}},
    }
    r = ok({}, body, allow_priority_raise=True)
    assert r.workflow is not None
    assert r.workflow.workflow_id == "from-metadata"
    assert r.workflow.step == 2
    assert r.requested_priority == 0


@pytest.mark.parametrize(
    ("requested", "base", "allow", "cap", "expected", "capped"),
    [
        (-1, 0, False, None, -1, False),  # lowering is always allowed
        (1, 0, False, None, 0, True),  # raising needs the tenant's permission
        (1, 0, True, None, 1, False),
        (5, 0, True, 2, 2, True),  # ... and stops at the tenant's cap
        (5, 3, True, 1, 3, True),  # a cap below the base never lowers the base
        (0, 0, False, None, 0, False),
    ],
)
def test_priority_rule(
    requested: int, base: int, allow: bool, cap: int | None, expected: int, capped: bool
) -> None:
    r = ok(
        {"x-tokenplane-priority": str(requested)},
        base_priority=base,
        allow_priority_raise=allow,
        max_priority=cap,
    )
    assert (r.priority, r.priority_capped, r.requested_priority) == (expected, capped, requested)


@pytest.mark.parametrize(
    ("headers", "body", "field"),
    [
        ({"x-tokenplane-workflow-id": "w", "x-tokenplane-step": "0"}, None, "x-tokenplane-step"),
        ({"x-tokenplane-workflow-id": "w", "x-tokenplane-step": "two"}, None, "x-tokenplane-step"),
        ({"x-tokenplane-workflow-id": "w", "x-tokenplane-step": "2.5"}, None, "x-tokenplane-step"),
        (
            {"x-tokenplane-workflow-id": "w", "x-tokenplane-step": "6", "x-tokenplane-total-steps": "5"},
            None,
            "x-tokenplane-total-steps",
        ),
        ({"x-tokenplane-workflow-id": "w", "x-tokenplane-deadline-s": "-3"}, None, "x-tokenplane-deadline-s"),
        (
            {"x-tokenplane-workflow-id": "w", "x-tokenplane-deadline-s": "nan"},
            None,
            "x-tokenplane-deadline-s",
        ),
        (
            {"x-tokenplane-workflow-id": "w", "x-tokenplane-deadline-s": "inf"},
            None,
            "x-tokenplane-deadline-s",
        ),
        ({"x-tokenplane-workflow-id": "   "}, None, "x-tokenplane-workflow-id"),
        ({"x-tokenplane-workflow-id": "a\nb"}, None, "x-tokenplane-workflow-id"),
        ({"x-tokenplane-workflow-id": "x" * 300}, None, "x-tokenplane-workflow-id"),
        ({"x-tokenplane-step": "2"}, None, "x-tokenplane-step"),  # a step needs a workflow
        ({"x-tokenplane-priority": "high"}, None, "x-tokenplane-priority"),
        ({"x-tokenplane-priority": "99999"}, None, "x-tokenplane-priority"),
        ({}, {"metadata": "nope"}, "metadata"),
        ({}, {"metadata": {"workflow_id": 7}}, "metadata.workflow_id"),
        ({}, {"metadata": {"workflow_id": "w", "step": True}}, "metadata.step"),
        ({}, {"vllm_xargs": {"agentic_context": "{not json"}}, "vllm_xargs.agentic_context"),
        ({}, {"vllm_xargs": {"agentic_context": "[1, 2]"}}, "vllm_xargs.agentic_context"),
        ({}, {"nvext": {"agent_hints": {"osl": 0}}}, "nvext.agent_hints.osl"),
        ({}, {"nvext": {"agent_hints": [1]}}, "nvext.agent_hints"),
    ],
)
def test_invalid_hints_are_error_values(
    headers: dict[str, str], body: dict[str, Any] | None, field: str
) -> None:
    e = err(headers, body)
    assert e.field == field
    assert e.message
    assert field in str(e)


@given(
    headers=st.dictionaries(
        st.sampled_from(
            [
                "x-tokenplane-workflow-id",
                "x-tokenplane-step",
                "x-tokenplane-total-steps",
                "x-tokenplane-deadline-s",
                "x-tokenplane-priority",
            ]
        ),
        st.text(max_size=12),
    ),
    metadata=st.dictionaries(
        st.sampled_from(["workflow_id", "step", "total_steps", "deadline_s", "priority"]),
        st.one_of(st.text(max_size=8), st.integers(), st.floats(), st.booleans(), st.none()),
    ),
)
def test_never_raises_and_results_are_consistent(headers: dict[str, str], metadata: dict[str, Any]) -> None:
    r = parse_workflow_hints(headers, {"metadata": metadata}, now=NOW, base_priority=0)
    if isinstance(r, WorkflowHints):
        if r.workflow is not None:
            assert r.workflow.step >= 1
            assert r.workflow.total_steps is None or r.workflow.step <= r.workflow.total_steps
            assert r.workflow.deadline_s is None or r.workflow.deadline_s > NOW
        assert r.priority <= 0
    else:
        assert r.message


@pytest.mark.parametrize("raw", ["5e-324", "1e-323", "0.0005", "0"])
def test_a_deadline_under_a_millisecond_is_refused_as_bad_input(raw: str) -> None:
    """A subnormal deadline added to a clock changes nothing: it must be a 400, not a 503 later."""
    e = err({"x-tokenplane-workflow-id": "w", "x-tokenplane-deadline-s": raw})
    assert e.field == "x-tokenplane-deadline-s" and ">= 0.001" in e.message
    assert ok({"x-tokenplane-workflow-id": "w", "x-tokenplane-deadline-s": "0.001"}).workflow is not None
