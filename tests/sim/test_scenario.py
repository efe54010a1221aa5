"""Scenario files: validation with field paths, deep-merged runs, default names, ``with_policy``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tokenplane.cli import default_scenario_text
from tokenplane.sim.scenario import (
    ScenarioError,
    deep_merge,
    load_scenario,
    parse_scenario,
    router_label,
    with_policy,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _base(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "t",
        "seed": 5,
        "fleet": {"instances": 3, "gpu": "H100", "engine": {"max_num_seqs": 64, "block_size": 32}},
        "workload": {"type": "synthetic", "rate_rps": 4, "num_requests": 10},
    }
    doc.update(extra)
    return doc


def test_deep_merge_merges_nested_mappings_and_copies() -> None:
    base = {"a": 1, "f": {"x": 1, "e": {"k": 1, "j": 2}}, "l": [1, 2]}
    over = {"f": {"e": {"k": 9}, "y": 2}, "l": [3]}
    merged = deep_merge(base, over)
    assert merged == {"a": 1, "f": {"x": 1, "y": 2, "e": {"k": 9, "j": 2}}, "l": [3]}
    merged["f"]["e"]["j"] = 100
    merged["l"].append(4)
    assert base == {"a": 1, "f": {"x": 1, "e": {"k": 1, "j": 2}}, "l": [1, 2]}
    assert over == {"f": {"e": {"k": 9}, "y": 2}, "l": [3]}


def test_deep_merge_replaces_a_mapping_with_a_scalar_and_back() -> None:
    assert deep_merge({"r": {"name": "x"}}, {"r": "y"}) == {"r": "y"}
    assert deep_merge({"r": "y"}, {"r": {"name": "x"}}) == {"r": {"name": "x"}}


def test_run_overrides_merge_into_nested_fleet_engine() -> None:
    sc = parse_scenario(
        _base(
            runs=[
                {"name": "static", "fleet": {"engine": {"kind": "static"}}},
                {"name": "big", "fleet": {"instances": 5, "engine": {"max_num_seqs": 8}}, "seed": 11},
            ]
        )
    )
    static, big = sc.runs
    assert static.fleet.engine.kind == "static"
    assert static.fleet.engine.max_num_seqs == 64  # inherited from the base engine
    assert static.fleet.engine.block_size == 32
    assert static.fleet.instances == 3
    assert static.seed == 5
    assert big.fleet.instances == 5
    assert big.fleet.gpu == "H100"
    assert big.fleet.engine.kind == "continuous"
    assert big.fleet.engine.max_num_seqs == 8
    assert big.fleet.engine.block_size == 32
    assert big.seed == 11


def test_workload_overrides_merge_and_keep_the_type() -> None:
    sc = parse_scenario(_base(runs=[{"name": "a"}, {"name": "b", "workload": {"rate_rps": 40}}]))
    a, b = sc.runs
    assert a.workload == {"type": "synthetic", "rate_rps": 4, "num_requests": 10}
    assert b.workload == {"type": "synthetic", "rate_rps": 40, "num_requests": 10}


def test_base_defaults_flow_into_every_run() -> None:
    sc = parse_scenario({"workload": {"type": "synthetic", "rate_rps": 1}})
    (run,) = sc.runs
    assert sc.name == "scenario"
    assert run.name == "round-robin"
    assert run.router == "round-robin"
    assert run.seed == 0
    assert run.fleet.instances == 4
    assert run.fleet.engine.kind == "continuous"
    assert run.slo.ttft_s == 2.0 and run.slo.tbt_s == 0.1
    assert run.sample_interval_s == 10.0
    assert run.duration_s is None


def test_slo_and_timing_overrides_per_run() -> None:
    sc = parse_scenario(
        _base(
            slo={"ttft_s": 1.0},
            duration_s=30,
            runs=[{"name": "a"}, {"name": "b", "slo": {"tbt_s": 0.05}, "duration_s": 60}],
        )
    )
    a, b = sc.runs
    assert (a.slo.ttft_s, a.slo.tbt_s, a.duration_s) == (1.0, 0.1, 30)
    assert (b.slo.ttft_s, b.slo.tbt_s, b.duration_s) == (1.0, 0.05, 60)


@pytest.mark.parametrize(
    ("router", "name"),
    [
        ("least-requests", "least-requests"),
        ({"name": "prefix-affinity"}, "prefix-affinity"),
        ({"name": "weighted", "params": {"scorers": [{"name": "kv-usage"}]}}, "weighted"),
    ],
)
def test_default_run_name_comes_from_the_router(router: Any, name: str) -> None:
    sc = parse_scenario(_base(router=router))
    assert [r.name for r in sc.runs] == [name]
    assert sc.runs[0].router == router
    sc = parse_scenario(_base(runs=[{"router": router}, {"seed": 9}]))
    assert [r.name for r in sc.runs] == [name, "round-robin"]


def test_router_label() -> None:
    assert router_label("random") == "random"
    assert router_label({"name": "weighted", "params": {}}) == "weighted"
    assert router_label({"params": {}}) == "router"
    assert router_label(None) == "router"


def test_duplicate_run_names_rejected() -> None:
    with pytest.raises(ScenarioError, match=r"runs\[1\].*duplicate run name 'a'"):
        parse_scenario(_base(runs=[{"name": "a"}, {"name": "a", "seed": 2}]))
    # Two unnamed runs with the same router collide on the derived name too.
    with pytest.raises(ScenarioError, match="duplicate run name 'round-robin'"):
        parse_scenario(_base(runs=[{"router": "round-robin"}, {"router": "round-robin", "seed": 1}]))


def test_unknown_run_keys_rejected() -> None:
    with pytest.raises(ScenarioError, match=r"runs\[0\]: unknown keys \['engine'\]"):
        parse_scenario(_base(runs=[{"name": "a", "engine": {"kind": "static"}}]))


def test_unknown_top_level_key_rejected() -> None:
    with pytest.raises(ScenarioError, match="rutes"):
        parse_scenario(_base(rutes=[]), source="x.yaml")


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (_base(fleet={"instances": 0}), "fleet.instances"),
        (_base(fleet={"instnaces": 2}), "fleet.instnaces"),
        (_base(fleet={"engine": {"max_num_seqs": -1}}), "fleet.engine.max_num_seqs"),
        (_base(fleet={"engine": {"kind": "dynamic"}}), "fleet.engine.kind"),
        (_base(fleet={"engine": {"gpu_memory_utilization": 1.5}}), "fleet.engine.gpu_memory_utilization"),
        (_base(slo={"ttft_s": 0}), "slo.ttft_s"),
        (_base(slo={"tbt": 0.1}), "slo.tbt"),
        (_base(runs=[{"name": "r", "fleet": {"tp": 0}}]), "fleet.tp"),
        (_base(sample_interval_s=0), "sample_interval_s"),
    ],
)
def test_bad_values_name_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, source="bad.yaml")
    msg = str(info.value)
    assert msg.startswith("bad.yaml: ")
    assert field in msg


def test_bad_value_in_a_run_names_the_run() -> None:
    with pytest.raises(ScenarioError, match=r"runs\[1\] \(slow\): fleet\.instances"):
        parse_scenario(_base(runs=[{"name": "ok"}, {"name": "slow", "fleet": {"instances": 0}}]))


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ScenarioError, match="mapping"):
        parse_scenario([1, 2], source="list.yaml")


def test_with_policy_keeps_the_first_run_only() -> None:
    sc = parse_scenario(
        _base(runs=[{"name": "a", "router": "random", "fleet": {"instances": 7}}, {"name": "b"}])
    )
    one = with_policy(sc, "least-tokens")
    assert [r.name for r in one.runs] == ["least-tokens"]
    (run,) = one.runs
    assert run.router == "least-tokens"
    assert run.fleet.instances == 7
    assert run.seed == sc.runs[0].seed
    assert run.workload == sc.runs[0].workload
    assert one.name == sc.name
    # The original is untouched.
    assert [r.name for r in sc.runs] == ["a", "b"]
    assert sc.runs[0].router == "random"


def test_load_scenario_reads_yaml_and_records_the_source(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_base(runs=[{"name": "x"}])))
    sc = load_scenario(path)
    assert sc.source == str(path)
    assert [r.name for r in sc.runs] == ["x"]


def test_load_scenario_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ScenarioError, match="cannot read") as info:
        load_scenario(missing)
    assert str(missing) in str(info.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("fleet: {instances: 2\n")
    with pytest.raises(ScenarioError, match="invalid YAML") as info:
        load_scenario(broken)
    assert str(broken) in str(info.value)


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ScenarioError, match="mapping"):
        load_scenario(empty)


def test_embedded_default_and_examples_parse() -> None:
    default = parse_scenario(yaml.safe_load(default_scenario_text()), source="<default>")
    assert [r.name for r in default.runs] == ["round-robin", "least-requests", "prefix-affinity"]
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if path.name == "plan.yaml":  # a capacity-planning spec (tokenplane plan), not a scenario
            continue
        if path.name.startswith("catalog-"):  # a catalogue file (--catalog), not a scenario
            continue
        sc = load_scenario(path)
        assert sc.runs, path
    batching = load_scenario(EXAMPLES / "batching.yaml")
    static, continuous = batching.runs[:2]
    assert static.fleet.engine.kind == "static"
    assert static.fleet.engine.max_model_len == 8192  # from the base engine
    assert continuous.fleet.engine.kind == "continuous"


@pytest.mark.parametrize(
    "override",
    [
        {"workload": {"type": "synthetic", "rate_rsp": 3}},
        {"workload": {"type": "synthetic", "rate_rps": 0}},
        {"router": "round-robbin"},
    ],
    ids=["workload-typo", "workload-bad-value", "router-typo"],
)
def test_run_workload_and_router_are_validated_at_load(override: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError, match=r"runs\[1\]"):
        parse_scenario(_base(runs=[{"name": "ok"}, {"name": "bad", **override}]))


def test_run_with_another_kind_of_workload_replaces_the_base_one() -> None:
    sc = parse_scenario(
        {
            "workload": {"type": "azure", "path": "azure.csv", "time_scale": 0.5},
            "runs": [
                {"name": "a"},
                {"name": "b", "workload": {"type": "synthetic", "rate_rps": 5, "num_requests": 10}},
                {"name": "c", "workload": {"time_scale": 2.0}},
            ],
        }
    )
    a, b, c = sc.runs
    assert a.workload == {"type": "azure", "path": "azure.csv", "time_scale": 0.5}
    assert b.workload == {"type": "synthetic", "rate_rps": 5, "num_requests": 10}
    assert c.workload == {"type": "azure", "path": "azure.csv", "time_scale": 2.0}


def test_autoscaler_utilisation_metric_is_validated() -> None:
    base = {"fleet": {"instances": 2}, "workload": {"type": "synthetic", "rate_rps": 1, "num_requests": 1}}
    run = {
        "name": "h",
        "autoscaler": {
            "name": "hpa",
            "utilisation_metric": "kv_usage",
            "pool": {"max_instances": 2, "capacity_rps": 1},
        },
    }
    sc = parse_scenario({**base, "runs": [run]})
    assert sc.runs[0].autoscaler is not None and sc.runs[0].autoscaler.utilisation_metric == "kv_usage"
    bad = {**run, "autoscaler": {**run["autoscaler"], "utilisation_metric": "cpu"}}
    with pytest.raises(ScenarioError, match="utilisation_metric"):
        parse_scenario({**base, "runs": [bad]})
