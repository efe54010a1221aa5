"""The learning scaler in the twin: a wrong capacity prior is corrected from what the fleet does,
and on bursty traffic the scaler adds capacity before the SLO collapses."""

from __future__ import annotations

from typing import Any

import pytest

from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import parse_scenario

FLEET = {
    "instances": 8,
    "gpu": "H100",
    "model": "llama-3-8b",
    "engine": {"max_num_seqs": 8},
    "lifecycle": {"cold_start_s": 20.0, "warm_activation_s": 2.0},
}
SHORT = {"prompt": 200, "output": 40}


def _run(workload: dict[str, Any], autoscaler: dict[str, Any]) -> dict[str, Any]:
    doc = {
        "name": "learning",
        "seed": 2,
        "router": "least-requests",
        "fleet": FLEET,
        "workload": workload,
        "slo": {"ttft_s": 1.0, "tbt_s": 0.5},
        "autoscaler": {"decision_interval_s": 5, "arrival_bucket_s": 5, "slo_window_s": 20, **autoscaler},
    }
    (o,) = run_scenario(parse_scenario(doc)).values()
    return o.report


def test_measured_capacity_of_one_instance_is_what_the_scaler_learns() -> None:
    # What one instance sustains with a backlog: the true capacity, measured with a static fleet.
    overload = {"type": "synthetic", "rate_rps": 200, "duration_s": 60, **SHORT, "seed": 1}
    static = _run(overload, {"name": "static", "params": {"instances": 2}, "pool": {"capacity_rps": 1}})
    true_cap = static["requests_completed"] / static["duration_s"] / 2
    # A steady load of about 3 instances' worth, with priors 4x too low and 4x too high.
    steady = {"type": "synthetic", "rate_rps": 3 * true_cap * 0.8, "duration_s": 400, **SHORT, "seed": 3}
    for prior in (true_cap / 4, true_cap * 4):
        pool = {"capacity_rps": prior, "min_instances": 1}
        r = _run(steady, {"name": "tokenplane", "pool": pool, "initial_serving": 3})
        pool = r["pool"]
        assert pool["capacity_prior_share"] < 0.2  # the prior has given way to measurements
        assert pool["learned_capacity_rps"] == pytest.approx(true_cap, rel=0.35), (prior, true_cap)
        assert r["ttft_slo_attainment"] >= 0.9


def test_on_bursty_traffic_the_scaler_holds_headroom_it_measured() -> None:
    """On-off bursts of 4x the mean (about 16x the quiet rate) lasting a minute: the learning
    scaler scales up before the SLO collapses; without the burst memory it reacts too late."""
    bursty = {
        "type": "bursty",
        "rate_rps": 15,
        "cv": 4,
        "peak_ratio": 4,
        "burst_s": 60,
        "duration_s": 1200,
        **SHORT,
        "seed": 5,
    }
    pool = {"capacity_rps": 10, "min_instances": 1}
    learned = _run(bursty, {"name": "tokenplane", "pool": pool, "initial_serving": 2})
    blind = _run(
        bursty,
        {
            "name": "tokenplane",
            "pool": pool,
            "initial_serving": 2,
            "params": {"learn_burstiness": False},
        },
    )
    # It measured the bursts (a rise of many times the quiet level within a cold start) and kept
    # the capacity for them: the SLO holds where the same scaler without that memory misses it.
    assert learned["pool"]["headroom_cold_start"] > 4
    assert blind["pool"]["headroom_cold_start"] == 1.0
    assert learned["ttft_slo_attainment"] >= 0.95
    assert blind["ttft_slo_attainment"] < learned["ttft_slo_attainment"] - 0.04
    assert (
        learned["scale_actions"].get("activate_warm", 0) + learned["scale_actions"].get("start_cold", 0) > 0
    )
