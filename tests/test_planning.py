"""Capacity planning: the closed form against a hand calculation, and a small twin-backed plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenplane.planning import PlanError, load_plan_spec, parse_plan_spec, plan, required_token_throughput

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plan.yaml"


def test_required_token_throughput_matches_hand_calculation() -> None:
    # 1,000 users x 12 calls/h x (1,500 + 300) tokens = 3.33 calls/s x 1,800 = 6,000 tokens/s.
    assert required_token_throughput(1_000, 12, 1_500, 300) == pytest.approx(6_000, rel=0.10)
    assert required_token_throughput(1_000, 12, 1_500, 300) == pytest.approx(6_000, rel=1e-12)


def test_example_spec_loads() -> None:
    spec = load_plan_spec(EXAMPLE)
    assert spec.users == 1_000
    assert spec.request_rate_rps == pytest.approx(1_000 * 12 / 3600)
    assert spec.mean_tokens_per_call == pytest.approx(1_800)
    assert [g.gpu for g in spec.gpus][:3] == ["h100", "a100", "l40s"]


def test_plan_states_gpu_count_cost_and_writes_the_plot(tmp_path: Path) -> None:
    spec = parse_plan_spec(
        {
            "name": "hand-check",
            "users": 1_000,
            "calls_per_user_per_hour": 12,
            "steps_per_task": 4,
            "prompt_tokens": {"kind": "lognormal", "mean": 1500, "cv": 0.5, "min": 1},
            "output_tokens": {"kind": "lognormal", "mean": 300, "cv": 0.5, "min": 1},
            "slo": {"ttft_s": 1.0, "tbt_s": 0.05, "attainment": 0.95},
            "gpus": ["a100", {"gpu": "l40s", "price_per_hour": 0.9}],
            "search": {"probe_duration_s": 120, "verify_duration_s": 120, "bisect_steps": 4},
        }
    )
    result = plan(spec, out_dir=tmp_path)
    # The closed form, within 10 % of the hand calculation.
    assert result.required_tokens_per_s == pytest.approx(6_000, rel=0.10)
    assert result.request_rate_rps == pytest.approx(3.333, rel=0.01)
    assert result.tasks_per_hour == pytest.approx(3_000)
    # A fleet was chosen, stated as GPU type, count and cost.
    assert result.feasible
    assert result.gpu_type in {"a100", "l40s"}
    assert result.gpus is not None and result.gpus >= 1
    chosen = next(g for g in result.per_gpu if g.gpu == result.gpu_type)
    assert result.cost_per_hour == pytest.approx(result.gpus * chosen.price_per_hour)
    # It is the cheapest verified fleet among the GPU types.
    for g in result.per_gpu:
        if g.chosen is not None:
            assert result.cost_per_hour <= g.chosen.cost_per_hour + 1e-9
        # Every fleet the twin verified below the chosen size missed the SLOs.
        if g.chosen is not None:
            assert all(not p.meets_slo for p in g.points if p.instances < g.chosen.instances)
    assert result.headroom is not None and result.headroom >= 0
    assert result.slo_attainment is not None and result.slo_attainment >= 0.95
    assert result.cost_per_successful_task is not None
    assert result.cost_per_successful_task == pytest.approx(
        result.cost_per_hour / (result.tasks_per_hour * result.slo_attainment**4)
    )
    # Capacity is a sensible figure: a single A100 serves a few such calls per second.
    a100 = next(g for g in result.per_gpu if g.gpu == "a100")
    assert a100.capacity_rps is not None and 0.5 < a100.capacity_rps < 50
    assert a100.closed_form_instances is not None and a100.closed_form_instances >= 1
    # Outputs on disk.
    assert result.plot == tmp_path / "plan.png"
    assert result.plot.stat().st_size > 1_000
    data = json.loads((tmp_path / "plan.json").read_text())
    assert {"gpus", "gpu_type", "cost_per_hour", "cost_per_successful_task"} <= set(data)
    assert data["gpus"] == result.gpus
    assert "x a100" in result.summary() or "x l40s" in result.summary()


def test_infeasible_gpu_is_reported_not_chosen(tmp_path: Path) -> None:
    # A 70B model in BF16 does not fit on one 24 GiB card.
    spec = parse_plan_spec(
        {
            "model": "llama-3-70b",
            "users": 10,
            "calls_per_user_per_hour": 6,
            "prompt_tokens": 500,
            "output_tokens": 100,
            "gpus": ["rtx4090"],
        }
    )
    result = plan(spec)
    assert not result.feasible
    assert "does not fit" in result.per_gpu[0].note
    assert "no GPU type" in result.summary()
    assert result.plot is None


@pytest.mark.parametrize(
    "raw",
    [
        {"users": 0, "calls_per_user_per_hour": 1, "prompt_tokens": 1, "output_tokens": 1},
        {"users": 1, "calls_per_user_per_hour": 1, "prompt_tokens": 1},
        {"users": 1, "calls_per_user_per_hour": 1, "prompt_tokens": 1, "output_tokens": 1, "gpus": []},
        {"users": 1, "calls_per_user_per_hour": 1, "prompt_tokens": 1, "output_tokens": 1, "typo": 1},
        [1, 2],
    ],
)
def test_invalid_spec_fails_with_the_field(raw: object) -> None:
    with pytest.raises(PlanError):
        parse_plan_spec(raw)


def test_unknown_gpu_is_a_plan_error() -> None:
    spec = parse_plan_spec(
        {"users": 1, "calls_per_user_per_hour": 1, "prompt_tokens": 1, "output_tokens": 1, "gpus": ["tpu9"]}
    )
    with pytest.raises(PlanError, match="tpu9"):
        plan(spec)
