"""``run_scenario`` / ``simulate`` end to end on small synthetic scenarios (real engines, real routers)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tokenplane.sim.catalog import Catalog, CatalogError, UnknownHardware, kv_capacity_tokens
from tokenplane.sim.runner import engine_config, run_scenario, simulate
from tokenplane.sim.scenario import EngineSettings, FleetSettings, RunSettings, SloSettings, parse_scenario
from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.factory import WorkloadConfigError

N = 300


def _synthetic(**extra: Any) -> dict[str, Any]:
    w: dict[str, Any] = {
        "type": "synthetic",
        "rate_rps": 30,
        "num_requests": N,
        "prompt": {"kind": "lognormal", "mean": 300, "cv": 0.5, "min": 1},
        "output": {"kind": "lognormal", "mean": 50, "cv": 0.5, "min": 1},
    }
    w.update(extra)
    return w


def _scenario(runs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "runner-test",
        "seed": 1,
        "fleet": {"instances": 4, "gpu": "H100", "model": "llama-3-8b"},
        "workload": _synthetic(),
        "runs": runs,
    }
    doc.update(extra)
    return doc


def _drop_wall_clock(report: dict[str, Any]) -> str:
    from tokenplane.sim.report import WALL_CLOCK_FIELDS

    return json.dumps({k: v for k, v in report.items() if k not in WALL_CLOCK_FIELDS}, sort_keys=True)


def test_every_request_is_accounted_for() -> None:
    sc = parse_scenario(_scenario([{"router": "round-robin"}, {"router": "power-of-two"}]))
    outcomes = run_scenario(sc)
    assert list(outcomes) == ["round-robin", "power-of-two"]
    for name, o in outcomes.items():
        records = o.result.records
        assert sorted(r.request_id for r in records) == list(range(N)), name
        ids = {i.instance_id for i in o.result.instances}
        assert len(ids) == 4
        for r in records:
            assert r.ok, (name, r)
            assert r.instance_id in ids
            assert r.arrival_s <= r.scheduled_s <= r.first_token_s <= r.finish_s
        rep = o.report
        assert rep["requests_total"] == rep["requests_completed"] == N
        assert rep["requests_failed"] == 0
        assert rep["output_tokens"] == sum(r.output_tokens for r in records)
        assert rep["prompt_tokens"] == sum(r.prompt_tokens for r in records)
        assert rep["duration_s"] == pytest.approx(max(r.finish_s for r in records))
        assert sum(rep["route_reasons"].values()) == N
        assert rep["router"] == name
        assert rep["instances"] == 4 and rep["gpu"] == "H100" and rep["engine"] == "continuous"
        assert o.settings.name == name


def test_round_robin_spreads_requests_evenly() -> None:
    (o,) = run_scenario(parse_scenario(_scenario([{"router": "round-robin"}]))).values()
    counts: dict[str, int] = {}
    for r in o.result.records:
        counts[r.instance_id] = counts.get(r.instance_id, 0) + 1
    assert sorted(counts.values()) == [N // 4] * 4


def test_run_scenario_is_deterministic() -> None:
    sc = parse_scenario(_scenario([{"router": "random"}, {"router": "power-of-two"}]))
    a = run_scenario(sc)
    b = run_scenario(sc)
    for name in a:
        assert _drop_wall_clock(a[name].report) == _drop_wall_clock(b[name].report)


def test_seed_changes_the_workload() -> None:
    sc = parse_scenario(_scenario([{"name": "s1", "seed": 1}, {"name": "s2", "seed": 2}]))
    out = run_scenario(sc)
    assert out["s1"].report["prompt_tokens"] != out["s2"].report["prompt_tokens"]


def test_prefix_affinity_hits_at_least_as_much_as_round_robin() -> None:
    workload = _synthetic(shared_prefix_tokens=2048, prefix_groups=8)
    sc = parse_scenario(
        _scenario(
            [{"router": "round-robin"}, {"router": "prefix-affinity"}],
            workload=workload,
            fleet={"instances": 6},
        )
    )
    out = run_scenario(sc)
    rr, pa = out["round-robin"].report, out["prefix-affinity"].report
    assert rr["requests_completed"] == pa["requests_completed"] == N
    # Same workload, so the same upper bound on reuse.
    assert rr["prefix_hit_bound"] == pa["prefix_hit_bound"]
    assert 0.5 < pa["prefix_hit_bound"] < 1
    assert pa["prefix_hit_ratio"] >= rr["prefix_hit_ratio"]
    assert pa["prefix_hit_ratio"] > rr["prefix_hit_ratio"]  # 8 groups over 6 instances: RR misses more
    assert pa["prefix_hit_ratio"] <= pa["prefix_hit_bound"] + 1e-12


def test_no_shared_prefix_means_no_hits() -> None:
    (o,) = run_scenario(parse_scenario(_scenario([{"router": "prefix-affinity"}]))).values()
    assert o.report["prefix_hit_ratio"] == 0
    assert o.report["prefix_hit_bound"] == 0


def test_static_batching_has_lower_throughput_under_saturation() -> None:
    workload = _synthetic(
        rate_rps=200,
        num_requests=400,
        prompt={"kind": "lognormal", "mean": 800, "cv": 0.5, "min": 1, "max": 3000},
        output={"kind": "lognormal", "mean": 200, "cv": 0.5, "min": 1, "max": 1000},
    )
    sc = parse_scenario(
        _scenario(
            [{"name": "static", "fleet": {"engine": {"kind": "static"}}}, {"name": "continuous"}],
            workload=workload,
            fleet={"instances": 1, "engine": {"max_model_len": 4096}},
        )
    )
    out = run_scenario(sc)
    static, cont = out["static"].report, out["continuous"].report
    assert static["engine"] == "static" and cont["engine"] == "continuous"
    assert static["requests_completed"] == cont["requests_completed"] == 400
    assert static["output_tokens"] == cont["output_tokens"]
    assert static["output_tokens_per_s"] < cont["output_tokens_per_s"]
    assert static["output_tokens_per_s"] < 0.5 * cont["output_tokens_per_s"]


def _run(gpu: str = "H100", model: str = "llama-3-8b", **engine: Any) -> RunSettings:
    return RunSettings(
        name="r",
        seed=0,
        router="round-robin",
        fleet=FleetSettings(instances=1, gpu=gpu, model=model, engine=EngineSettings(**engine)),
        workload={},
        slo=SloSettings(),
    )


def test_engine_config_takes_kv_capacity_from_the_catalogue() -> None:
    cat = Catalog.default()
    fleet = FleetSettings(gpu="RTX4090", model="llama-3.1-8b")
    expected = kv_capacity_tokens(cat.gpu("RTX4090"), cat.model("llama-3.1-8b"), 1, 0.9)
    assert 30_000 < expected < 50_000
    cfg = engine_config(fleet, cat)
    assert cfg.kv_capacity_tokens == expected
    lower = FleetSettings(
        gpu="RTX4090", model="llama-3.1-8b", engine=EngineSettings(gpu_memory_utilization=0.8)
    )
    assert engine_config(lower, cat).kv_capacity_tokens < expected
    given = FleetSettings(gpu="RTX4090", model="llama-3.1-8b", engine=EngineSettings(kv_capacity_tokens=1234))
    assert engine_config(given, cat).kv_capacity_tokens == 1234


def test_engine_config_copies_the_engine_settings() -> None:
    fleet = FleetSettings(
        engine=EngineSettings(
            max_num_seqs=7,
            max_num_batched_tokens=512,
            block_size=32,
            enable_prefix_caching=False,
            max_model_len=2048,
            static_batch_size=3,
            kv_capacity_tokens=9999,
        )
    )
    cfg = engine_config(fleet, Catalog.default())
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.block_size) == (7, 512, 32)
    assert (cfg.enable_prefix_caching, cfg.max_model_len, cfg.static_batch_size) == (False, 2048, 3)
    assert cfg.kv_capacity_tokens == 9999


def test_model_that_does_not_fit_is_an_error() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        engine_config(FleetSettings(gpu="RTX4090", model="llama-3-70b"), Catalog.default())


def test_catalogue_kv_capacity_bounds_what_fits(fakes: SimpleNamespace) -> None:
    cat = Catalog.default()
    cap = engine_config(FleetSettings(gpu="RTX4090", model="llama-3.1-8b"), cat).kv_capacity_tokens
    cap_blocks = cap // 16 * 16  # the engine holds whole blocks
    specs = [
        RequestSpec(0, 0.0, cap_blocks - 10, 10),  # exactly fills the cache
        RequestSpec(1, 1.0, cap_blocks - 9, 10),  # one token too many
    ]
    result = simulate(_run("RTX4090", "llama-3.1-8b"), catalog=cat, workload=fakes.ListWorkload(specs))
    by_id = {r.request_id: r for r in result.records}
    assert by_id[0].ok
    assert not by_id[1].ok and by_id[1].reason == "too_long"


def test_scenario_catalogue_overrides_are_used() -> None:
    base = _scenario([{"name": "default"}], fleet={"instances": 1}, workload=_synthetic(num_requests=20))
    over = {**base, "catalog": {"gpus": {"H100": {"price_per_hour": 100.0}}}}
    cheap = run_scenario(parse_scenario(base))["default"].report
    dear = run_scenario(parse_scenario(over))["default"].report
    assert dear["gpu_cost_usd"] > 10 * cheap["gpu_cost_usd"]
    assert dear["ttft_p50_s"] == cheap["ttft_p50_s"]  # only the price changed
    with pytest.raises(CatalogError, match="hbm_gib"):
        run_scenario(parse_scenario({**base, "catalog": {"gpus": {"H100": {"hbm_gib": -1}}}}))


def test_price_override_scales_cost() -> None:
    base = _scenario(
        [{"name": "a", "fleet": {"price_per_hour": 1.0}}, {"name": "b", "fleet": {"price_per_hour": 3.0}}],
        workload=_synthetic(num_requests=20),
    )
    out = run_scenario(parse_scenario(base))
    a, b = out["a"].report, out["b"].report
    assert b["gpu_cost_usd"] == pytest.approx(3 * a["gpu_cost_usd"])
    assert b["cost_per_million_tokens"] == pytest.approx(3 * a["cost_per_million_tokens"])


def test_duration_cuts_the_run() -> None:
    sc = parse_scenario(_scenario([{"name": "cut", "duration_s": 2.0}]))
    o = run_scenario(sc)["cut"]
    assert o.result.duration_s == 2.0
    assert o.report["requests_completed"] < N
    assert all(r.finish_s is None or r.finish_s <= 2.0 for r in o.result.records)


def test_unknown_hardware_and_router_raise() -> None:
    with pytest.raises(UnknownHardware, match="H999"):
        run_scenario(parse_scenario(_scenario([{"name": "x"}], fleet={"gpu": "H999"})))
    with pytest.raises(ValueError, match="unknown router"):
        run_scenario(parse_scenario(_scenario([{"router": "nope"}])))


def test_trace_workload_without_the_trace_names_it(tmp_path: Path) -> None:
    sc = parse_scenario(
        _scenario([{"name": "m"}], workload={"type": "mooncake", "path": "mooncake/conversation_trace.jsonl"})
    )
    with pytest.raises(WorkloadConfigError, match=r"conversation_trace\.jsonl"):
        run_scenario(sc, traces=tmp_path)


def test_progress_callback_is_asked_per_run() -> None:
    asked: list[str] = []

    def progress(name: str) -> None:
        asked.append(name)
        return None

    run_scenario(parse_scenario(_scenario([{"name": "a"}, {"name": "b"}])), progress=progress)
    assert asked == ["a", "b"]


def test_precise_kv_routes_on_the_engines_caches() -> None:
    # scenario key routing: {precise_kv: true} fills cached_prefix_tokens from the engines
    workload = _synthetic(shared_prefix_tokens=2048, prefix_groups=8)
    runs = [
        {"name": "index", "router": "prefix-affinity"},
        {"name": "precise", "router": "prefix-affinity", "routing": {"precise_kv": True}},
    ]
    out = run_scenario(parse_scenario(_scenario(runs, workload=workload, fleet={"instances": 6})))
    index, precise = out["index"], out["precise"]
    reasons = {r.route_reason for r in precise.result.records}
    assert "kv_cache_match" in reasons and "prefix_match" not in reasons
    assert "kv_cache_match" not in {r.route_reason for r in index.result.records}
    assert precise.report["requests_completed"] == N
    assert precise.report["prefix_hit_ratio"] > 0.5 * index.report["prefix_hit_ratio"]


def test_precise_kv_is_validated() -> None:
    from tokenplane.sim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="precise"):
        parse_scenario(_scenario([{"router": "prefix-affinity", "routing": {"precise_kv": "maybe"}}]))
