from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from tokenplane.sim.workloads.agentic import AgenticWorkload
from tokenplane.sim.workloads.azure import AzureTrace
from tokenplane.sim.workloads.dists import IntDist, LengthDist
from tokenplane.sim.workloads.factory import WorkloadConfigError, build_workload
from tokenplane.sim.workloads.mooncake import MooncakeTrace
from tokenplane.sim.workloads.servegen import ServeGenWorkload
from tokenplane.sim.workloads.synthetic import SyntheticWorkload


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "conversation_trace.jsonl").write_text(
        json.dumps({"timestamp": 0, "input_length": 1200, "output_length": 5, "hash_ids": [1, 2, 3]}) + "\n"
    )
    (tmp_path / "azure-2023").mkdir()
    (tmp_path / "azure-2023" / "AzureLLMInferenceTrace_conv.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
    )
    sg = tmp_path / "servegen" / "reason" / "deepseek-r1"
    sg.mkdir(parents=True)
    (sg / "chunk-0-trace.csv").write_text("0,1.0,1.0,Gamma,1,1\n")
    (sg / "chunk-0-dataset.json").write_text(
        json.dumps({"0": {"input_tokens": "{10: 1.0}", "output_tokens": "{5: 1.0}"}})
    )
    return tmp_path


def test_builds_traces(traces: Path) -> None:
    moon = build_workload({"type": "mooncake", "time_scale": 0.5, "limit": 1}, traces=traces, seed=0)
    assert isinstance(moon, MooncakeTrace) and moon.time_scale == 0.5
    assert next(iter(moon.arrivals())).block_hashes == (1, 2)
    absolute = build_workload(
        {"type": "mooncake", "path": str(traces / "mooncake" / "conversation_trace.jsonl")},
        traces=None,
        seed=0,
    )
    assert isinstance(absolute, MooncakeTrace)
    az = build_workload(
        {"type": "azure", "path": "azure-2023/AzureLLMInferenceTrace_conv.csv"}, traces=traces, seed=0
    )
    assert isinstance(az, AzureTrace)
    assert len(list(az.arrivals())) == 1
    sg = build_workload({"type": "servegen", "time_scale": 0.5, "duration_s": 100}, traces=traces, seed=1)
    assert isinstance(sg, ServeGenWorkload) and sg.seed == 1
    assert all(s.arrival_s <= 100 for s in sg.arrivals())


def test_builds_synthetic(traces: Path) -> None:
    w = build_workload(
        {
            "type": "synthetic",
            "rate_rps": 10,
            "num_requests": 1000,
            "process": "gamma",
            "cv": 2,
            "prompt": {"kind": "lognormal", "mean": 1000, "cv": 1},
            "output": 128,
            "shared_prefix_tokens": 64,
        },
        traces=None,
        seed=9,
    )
    assert isinstance(w, SyntheticWorkload)
    assert w.seed == 9 and w.prompt == LengthDist.lognormal(1000, 1.0) and w.output == LengthDist.fixed(128)
    assert len(list(w.arrivals())) == 1000
    own_seed = build_workload({"type": "synthetic", "rate_rps": 1, "seed": 3}, traces=None, seed=9)
    assert isinstance(own_seed, SyntheticWorkload) and own_seed.seed == 3
    assert len(list(islice(own_seed.arrivals(), 5))) == 5


def test_builds_agentic() -> None:
    w = build_workload(
        {"type": "agentic", "preset": "copilot", "users": 20, "steps_per_task": {"min": 2, "max": 4}},
        traces=None,
        seed=4,
    )
    assert isinstance(w, AgenticWorkload)
    assert w.users == 20 and w.steps_per_task == IntDist(2, 4) and w.seed == 4
    assert w.system_prompt_tokens == AgenticWorkload.preset("copilot").system_prompt_tokens
    bare = build_workload(
        {
            "type": "agentic",
            "users": 2,
            "steps_per_task": 3,
            "think_time_s": {"kind": "uniform", "lo": 1, "hi": 2},
        },
        traces=None,
        seed=0,
    )
    assert isinstance(bare, AgenticWorkload) and bare.steps_per_task == IntDist(3, 3)


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        ({"type": "synthetic", "rate_rsp": 1}, "rate_rsp"),
        ({"type": "synthetic", "rate_rps": -1}, "rate_rps"),
        ({"type": "synthetic", "rate_rps": 1, "process": "pareto"}, "process"),
        ({"type": "synthetic", "rate_rps": 1, "prompt": {"kind": "lognormal", "mena": 5}}, "mena"),
        ({"type": "synthetic", "rate_rps": 1, "cv": 2}, "cv"),
        ({"type": "synthetic", "rate_rps": 1, "prompt": {"kind": "uniform", "lo": 5, "hi": 1}}, "lo"),
        ({"type": "agentic", "preset": "copliot"}, "preset"),
        ({"type": "agentic", "steps_per_task": 3}, "users"),
        ({"type": "agentic", "users": 1, "steps_per_task": {"min": 3, "max": 1}}, "steps_per_task"),
        ({"type": "mooncake", "limt": 3}, "limt"),
        ({"type": "mooncake", "path": "nope.jsonl"}, "nope.jsonl"),
        ({"type": "poisson"}, "type"),
        ({"rate_rps": 1}, "type"),
    ],
)
def test_errors_name_the_field(traces: Path, cfg: dict[str, object], needle: str) -> None:
    with pytest.raises(WorkloadConfigError, match=needle):
        build_workload(cfg, traces=traces, seed=0)


def test_missing_traces_folder_is_a_clear_error() -> None:
    with pytest.raises(WorkloadConfigError, match="TOKENPLANE_TRACES"):
        build_workload({"type": "mooncake"}, traces=None, seed=0)
    with pytest.raises(WorkloadConfigError, match="mapping"):
        build_workload([1, 2], traces=None, seed=0)  # type: ignore[arg-type]
