"""``tokenplane rehearse``: the twin and the live stack (real gateway and emulator processes, the
official openai client) on the same small workload, a few seconds of real time each."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from child_processes import stop_with_sigterm
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tokenplane.cli import app
from tokenplane.core.prompt_hash import approx_tokens, block_hashes
from tokenplane.rehearse.command import rehearse
from tokenplane.rehearse.errors import RehearsalError
from tokenplane.rehearse.prompts import prompt_text
from tokenplane.rehearse.sizing import pick_run, rehearsal_run
from tokenplane.sim.scenario import parse_scenario
from tokenplane.sim.workloads.base import RequestSpec

AGENTIC = {
    "name": "tiny-agents",
    "seed": 3,
    "fleet": {"instances": 2, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "agentic",
        "users": 3,
        "tasks_per_user": 1,
        "steps_per_task": 3,
        "system_prompt_tokens": 400,
        "first_prompt_tokens": {"kind": "lognormal", "mean": 300, "cv": 0.5, "min": 50, "max": 1000},
        "tool_result_tokens": {"kind": "lognormal", "mean": 150, "cv": 0.5, "min": 10, "max": 1000},
        "output_tokens": {"kind": "lognormal", "mean": 30, "cv": 0.5, "min": 5, "max": 100},
        "think_time_s": {"kind": "lognormal", "mean": 0.2, "cv": 0.5, "max": 1},
        "user_start_spread_s": 0.5,
    },
    "slo": {"ttft_s": 2.0, "tbt_s": 0.2},
    "runs": [{"name": "rr", "router": "round-robin"}, {"name": "affinity", "router": "prefix-affinity"}],
}

SLOWED = {
    "name": "tiny-slow",
    "seed": 4,
    "duration_s": 18,
    "fleet": {"instances": 2, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "synthetic",
        "rate_rps": 12,
        "duration_s": 12,
        "prompt": {"kind": "lognormal", "mean": 300, "cv": 0.5, "min": 10, "max": 1000},
        "output": {"kind": "lognormal", "mean": 20, "cv": 0.5, "min": 2, "max": 60},
    },
    "slo": {"ttft_s": 2.0, "tbt_s": 0.2},
    "faults": [{"kind": "slow", "instance": 0, "at_s": 3, "duration_s": 3, "factor": 4}],
    "runs": [{"name": "least", "router": "least-requests"}],
}


def _check_sides(result: dict[str, Any], runs: int) -> None:
    twin, live, diff = result["twin"], result["live"], result["rel_diff"]
    for side in (twin, live):
        assert side["requests_total"] == runs and side["requests_completed"] == runs, side["failure_reasons"]
        assert side["ttft_p50_s"] > 0 and side["tbt_p50_s"] > 0 and side["throughput_rps"] > 0
        assert sum(side["route_reasons"].values()) == runs
    for key in ("ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s", "throughput_rps", "prefix_hit_ratio"):
        assert key in diff
    assert diff["throughput_rps"] == pytest.approx(
        (live["throughput_rps"] - twin["throughput_rps"]) / twin["throughput_rps"]
    )
    assert diff["ttft_p50_s"] is not None and diff["throughput_rps"] is not None
    assert len(diff["goodput_timeline"]) == min(len(twin["goodput_timeline"]), len(live["goodput_timeline"]))


def test_agentic_run_is_the_same_workload_on_both_sides(tmp_path: Path) -> None:
    sc = parse_scenario(AGENTIC)
    result = rehearse(sc, run_name="affinity", scale=1.0, workdir=tmp_path)
    assert result["run"]["name"] == "affinity"
    _check_sides(result, runs=9)
    twin, live = result["twin"], result["live"]
    # the same prompts: same token totals; the same prefix structure: the same bound on hits
    assert live["prompt_tokens"] == twin["prompt_tokens"] and live["output_tokens"] == twin["output_tokens"]
    assert live["prefix_hit_bound"] == twin["prefix_hit_bound"] > 0.3
    # affinity keeps each task on one instance: later steps hit their own prefix live too
    assert live["prefix_hit_ratio"] > 0.3
    assert result["rel_diff"]["prefix_hit_ratio_points"] == pytest.approx(
        100 * (live["prefix_hit_ratio"] - twin["prefix_hit_ratio"])
    )
    # the request path: measured by the probe on the idle stack (16 requests: a multiple of the 2
    # instances), its requests kept out of the routing reasons (checked above: 9 decisions)
    path = result["path"]
    probe = path["probe"]
    assert path["source"].startswith("calibration probe") and probe["requests"] == 16
    assert (
        probe["client_ttft_median_s"] > probe["gateway_ttft_median_s"] > probe["instance_ttft_median_s"] > 0
    )
    assert 0 < path["first_chunk_s"] < 0.5
    assert path["first_chunk_s"] == live["path_probe"]["first_chunk_s"]
    # the twin charged it: every request's TTFT includes it
    assert twin["ttft_p50_s"] > path["twin_without"]["ttft_p50_s"]
    assert path["rel_diff_without"]["ttft_p50_s"] == pytest.approx(
        (live["ttft_p50_s"] - path["twin_without"]["ttft_p50_s"]) / path["twin_without"]["ttft_p50_s"]
    )


def test_cli_json_with_a_slow_fault_through_the_admin_endpoint(tmp_path: Path) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(SLOWED))
    args = ["rehearse", str(path), "--scale", "0.5", "--duration", "4", "--json", "--path-s", "0.01"]
    proc = CliRunner().invoke(app, args)
    assert proc.exit_code == 0, proc.output[-3000:]
    doc = json.loads(proc.stdout)
    assert {"twin", "live", "rel_diff"} <= set(doc)
    # --duration 4 compresses the 12 s arrival span, the 18 s run and the fault by a third
    assert doc["run"]["faults"][0]["at_s"] == pytest.approx(1.0)
    assert doc["twin"]["duration_s"] == doc["live"]["duration_s"] == pytest.approx(6.0)
    assert [f.split(" ", 1)[1] for f in doc["live"]["faults_applied"]] == [
        "slow x4 h100-0",
        "slow cleared h100-0",
    ]
    _check_sides(doc, runs=doc["twin"]["requests_total"])
    assert doc["twin"]["requests_total"] > 10
    # a given path: no probe; open loop, so the twin's median TTFT is the fleet's plus the path
    assert doc["path"]["probe"] is None and "path_probe" not in doc["live"]
    assert doc["path"]["first_chunk_s"] == 0.01
    assert doc["twin"]["ttft_p50_s"] - doc["path"]["twin_without"]["ttft_p50_s"] == pytest.approx(
        0.01, abs=0.004
    )


def test_refusals_say_why() -> None:
    sc = parse_scenario(AGENTIC)
    with pytest.raises(RehearsalError, match="no run 'nope'"):
        pick_run(sc, "nope")
    with pytest.raises(RehearsalError, match="open-loop"):
        rehearsal_run(sc.runs[0], duration=10)
    drained = parse_scenario({**SLOWED, "faults": [{"kind": "drain", "instance": 0, "at_s": 1}]})
    with pytest.raises(RehearsalError, match="drain faults"):
        rehearsal_run(drained.runs[0])
    with pytest.raises(RehearsalError, match="must be >= 1"):
        rehearsal_run(parse_scenario(SLOWED).runs[0], instances=0)
    with pytest.raises(RehearsalError, match="names instance 1 of 1"):
        second = [{"kind": "slow", "instance": 1, "at_s": 1}]
        rehearsal_run(parse_scenario({**SLOWED, "faults": second}).runs[0], instances=1)


@settings(max_examples=60, deadline=None)
@given(
    shared=st.integers(0, 6),
    a_extra=st.integers(0, 6),
    b_extra=st.integers(0, 6),
    a_tail=st.integers(0, 15),
    b_tail=st.integers(0, 15),
)
def test_prompts_share_exactly_the_blocks_the_twin_shares(
    shared: int, a_extra: int, b_extra: int, a_tail: int, b_tail: int
) -> None:
    """The emulator's and the gateway's block hashes of two live prompts agree on exactly the
    leading blocks whose twin ids agree, and each prompt counts the spec's tokens."""
    common = tuple(range(100, 100 + shared))
    a_ids = common + tuple(range(1000, 1000 + a_extra))
    b_ids = common + tuple(range(2000, 2000 + b_extra))
    a = RequestSpec(1, 0.0, 16 * len(a_ids) + a_tail or 1, 1, a_ids, 16)
    b = RequestSpec(2, 0.0, 16 * len(b_ids) + b_tail or 1, 1, b_ids, 16)
    ta, tb = prompt_text(a), prompt_text(b)
    assert approx_tokens(ta) == a.prompt_tokens and approx_tokens(tb) == b.prompt_tokens
    ha, hb = block_hashes(ta), block_hashes(tb)
    assert len(ha) == len(a_ids) and len(hb) == len(b_ids)
    same = 0
    for x, y in zip(ha, hb, strict=False):
        if x != y:
            break
        same += 1
    assert same == shared


def test_a_rehearsal_stopped_by_sigterm_stops_its_live_stack(tmp_path: Path) -> None:
    """The live side's emulators and gateway run in sessions of their own; SIGTERM used to end the
    command and leave them running."""
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(SLOWED))
    cmd = [sys.executable, "-m", "tokenplane", "rehearse", str(path), "--duration", "60", "--path-s", "0.01"]
    stopped = stop_with_sigterm(cmd, children_at_least=3)  # two emulators and the gateway
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "stopped by SIGTERM" in stopped.stderr
    assert stopped.left == []
