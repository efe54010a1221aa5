"""The request path's fixed cost (scenario ``request_path.first_chunk_s``): the twin charges it where a
request enters, so the client-side TTFT and end-to-end latency include it and TBT does not."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.sim.records import RequestRecord
from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import ScenarioError, parse_scenario

OPEN_LOOP: dict[str, Any] = {
    "name": "path-open",
    "seed": 5,
    "fleet": {"instances": 2, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "synthetic",
        "rate_rps": 20,
        "duration_s": 5,
        "prompt": {"kind": "lognormal", "mean": 600, "cv": 0.5, "min": 10, "max": 3000},
        "output": {"kind": "lognormal", "mean": 40, "cv": 0.5, "min": 2, "max": 200},
    },
    "slo": {"ttft_s": 1.0, "tbt_s": 0.1},
    "runs": [{"name": "least", "router": "least-requests"}],
}

AGENTIC: dict[str, Any] = {
    "name": "path-agents",
    "seed": 3,
    "fleet": {"instances": 2, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "agentic",
        "users": 3,
        "tasks_per_user": 1,
        "steps_per_task": 4,
        "system_prompt_tokens": 400,
        "first_prompt_tokens": {"kind": "lognormal", "mean": 300, "cv": 0.5, "min": 50, "max": 1000},
        "tool_result_tokens": {"kind": "lognormal", "mean": 150, "cv": 0.5, "min": 10, "max": 1000},
        "output_tokens": {"kind": "lognormal", "mean": 30, "cv": 0.5, "min": 5, "max": 100},
        "think_time_s": {"kind": "lognormal", "mean": 0.2, "cv": 0.5, "max": 1},
    },
    "slo": {"ttft_s": 2.0, "tbt_s": 0.2},
    "runs": [{"name": "rr", "router": "round-robin"}],
}


def _records(raw: dict[str, Any], path_s: float | None) -> list[RequestRecord]:
    doc = dict(raw)
    if path_s is not None:
        doc["request_path"] = {"first_chunk_s": path_s}
    sc = parse_scenario(doc)
    (outcome,) = run_scenario(sc).values()
    return sorted(outcome.result.records, key=lambda r: r.request_id)


def _ttft(r: RequestRecord) -> float:
    assert r.ttft_s is not None
    return r.ttft_s


def _e2e(r: RequestRecord) -> float:
    assert r.e2e_s is not None
    return r.e2e_s


@pytest.mark.parametrize("faults", [False, True])
@settings(max_examples=8, deadline=None)
@given(path_s=st.floats(0.0005, 0.05))
def test_open_loop_latencies_grow_by_exactly_the_path(faults: bool, path_s: float) -> None:
    """Open loop: every arrival reaches the fleet ``path_s`` later, so the fleet's own timeline
    is the same shifted, and each request's TTFT and E2E are the fleet's plus ``path_s`` (through
    the plain path and, with a fault and clients, through the resilient one)."""
    raw = dict(OPEN_LOOP)
    if faults:
        raw["clients"] = {"timeout_s": 60, "retry": "naive", "max_attempts": 2}
        raw["faults"] = [{"kind": "slow", "instance": 0, "at_s": 1, "duration_s": 2, "factor": 3}]
        # the fault lands on the fleet's clock: shift it with the arrivals so both runs see it alike
    base = _records(raw, None)
    if faults:
        raw["faults"] = [{**raw["faults"][0], "at_s": 1 + path_s}]
    paid = _records(raw, path_s)
    assert len(base) == len(paid) > 50
    for a, b in zip(base, paid, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s, abs=1e-9)  # the client's send time
        assert a.ok and b.ok and a.instance_id == b.instance_id
        assert _ttft(b) == pytest.approx(_ttft(a) + path_s, abs=1e-6)
        assert _e2e(b) == pytest.approx(_e2e(a) + path_s, abs=1e-6)
        assert b.tpot_s == pytest.approx(a.tpot_s, abs=1e-6)  # no per-token cost


def test_zero_is_the_default_and_changes_nothing() -> None:
    assert _records(OPEN_LOOP, None) == _records(OPEN_LOOP, 0.0)


def test_a_closed_loop_user_waits_for_the_path_before_the_next_step() -> None:
    """Agentic users: each step's TTFT includes the path, and the next step is sent no earlier than
    its client saw the previous answer end (which the path delays), so the run takes longer."""
    path_s = 0.05
    base, paid = _records(AGENTIC, None), _records(AGENTIC, path_s)
    assert len(base) == len(paid) == 12
    assert all(_ttft(r) >= path_s for r in paid)
    assert min(_ttft(r) for r in base) < path_s
    end_base = max(r.finish_s or 0.0 for r in base)
    end_paid = max(r.finish_s or 0.0 for r in paid)
    # four sequential steps per user, each at least ``path_s`` later than without the path
    assert end_paid >= end_base + 3 * path_s


def test_negative_path_is_refused_at_load() -> None:
    with pytest.raises(ScenarioError, match="request_path"):
        parse_scenario({**OPEN_LOOP, "request_path": {"first_chunk_s": -0.001}})
    with pytest.raises(ScenarioError, match=r"request_path\.per_chunk_s: Extra inputs"):
        parse_scenario({**OPEN_LOOP, "runs": [{"name": "x", "request_path": {"per_chunk_s": 1}}]})
