"""``tokenplane sweep``: a grid of scenario variants on local processes and on Ray (local mode)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tokenplane.cli import app
from tokenplane.sim.sweep import SweepError, load_sweep, mark_pareto, run_sweep, set_path

WIDE = {"COLUMNS": "240", "TERM": "dumb"}

BASE = {
    "name": "tiny",
    "seed": 3,
    "duration_s": 30,
    "sample_interval_s": 5,
    "fleet": {"instances": 1, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "synthetic",
        "rate_rps": 4,
        "duration_s": 30,
        "prompt": {"kind": "lognormal", "mean": 400, "cv": 0.5, "min": 10, "max": 2000},
        "output": {"kind": "lognormal", "mean": 60, "cv": 0.5, "min": 2, "max": 300},
    },
    "slo": {"ttft_s": 1.0, "tbt_s": 0.1},
    "runs": [{"name": "rr", "router": "round-robin"}, {"name": "lr", "router": "least-requests"}],
}


def _write(tmp_path: Path, sweep: dict[str, Any], base: dict[str, Any] = BASE) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"scenario": "base.yaml", **sweep}))
    return path


GRID = {
    "name": "grid",
    "reference": "rr",
    "axes": {"fleet.instances": [1, 3], "workload.rate_rps": [4, 12]},
    "heatmaps": [{"x": "fleet.instances", "y": "workload.rate_rps", "value": "goodput_rps"}],
}

COMPARED = ("fleet.instances", "workload.rate_rps", "run", "requests_total", "goodput_rps", "gpu_cost_usd")


def test_sweep_on_two_local_workers_writes_one_table_and_the_plots(tmp_path: Path) -> None:
    path = _write(tmp_path, GRID)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(out), "--workers", "2"], env=WIDE)
    assert res.exit_code == 0, res.output
    assert "sweep grid: 8 variants" in res.output
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    # grid order: the last axis fastest, each point's runs in the scenario's order
    assert [(r["fleet.instances"], r["workload.rate_rps"], r["run"]) for r in rows] == [
        (i, rate, run) for i in ("1", "3") for rate in ("4", "12") for run in ("rr", "lr")
    ]
    # the variants really differ: three instances cost three times one, more load serves more
    by = {(r["fleet.instances"], r["workload.rate_rps"], r["run"]): r for r in rows}
    assert float(by["3", "4", "rr"]["gpu_cost_usd"]) == pytest.approx(
        3 * float(by["1", "4", "rr"]["gpu_cost_usd"])
    )
    assert int(by["1", "12", "rr"]["requests_total"]) > 2 * int(by["1", "4", "rr"]["requests_total"])
    assert float(by["1", "4", "rr"]["goodput_vs_reference"]) == pytest.approx(1.0)
    # the variants ran in worker processes, not in the test's
    assert all(int(r["worker_pid"]) != os.getpid() for r in rows)
    # the best attainment among the cheapest variants is on the Pareto front, nothing else as cheap is
    cheapest = [r for r in rows if r["fleet.instances"] == "1"]
    best = max(float(r["slo_attainment"]) for r in cheapest)
    assert {r["pareto"] for r in cheapest if float(r["slo_attainment"]) == best} == {"True"}
    assert {r["pareto"] for r in rows if r not in cheapest or float(r["slo_attainment"]) < best} == {"False"}
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["workers"] == 2 and len(doc["rows"]) == 8
    for name in ("pareto.png", "heatmap-0-goodput-rps.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_the_same_sweep_under_ray_local_mode_gives_the_same_rows(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    spec = load_sweep(_write(tmp_path, GRID))
    local = run_sweep(spec, workers=1)
    on_ray = run_sweep(spec, workers=1, ray_address="local")
    assert on_ray.engine == "ray:local"
    assert [{k: r[k] for k in COMPARED} for r in on_ray.rows] == [
        {k: r[k] for k in COMPARED} for r in local.rows
    ]
    assert all(r["worker_pid"] != os.getpid() for r in on_ray.rows)


def test_set_path_reaches_list_items_and_runs_by_name() -> None:
    doc: dict[str, Any] = {"faults": [{"factor": 5}], "runs": [{"name": "a"}, {"name": "b", "router": "x"}]}
    set_path(doc, "faults.0.factor", 10)
    set_path(doc, "runs.b.router", "least-requests")
    set_path(doc, "clients.timeout_s", 7)
    assert doc == {
        "faults": [{"factor": 10}],
        "runs": [{"name": "a"}, {"name": "b", "router": "least-requests"}],
        "clients": {"timeout_s": 7},
    }
    with pytest.raises(SweepError, match="no run named 'c'"):
        set_path(doc, "runs.c.router", "x")
    with pytest.raises(SweepError, match="not an item"):
        set_path(doc, "faults.3.factor", 1)


def test_a_bad_value_fails_at_load_naming_the_variant(tmp_path: Path) -> None:
    path = _write(tmp_path, {"axes": {"fleet.instances": [2, 0]}})
    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "o")], env=WIDE)
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "variant fleet.instances=0" in text and "greater than 0" in text
    assert not (tmp_path / "o").exists()


def test_unknown_reference_run_and_heatmap_axis_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="run 'nope' is not in the scenario"):
        load_sweep(_write(tmp_path, {"reference": "nope", "axes": {"fleet.instances": [1]}}))
    bad = {"axes": {"fleet.instances": [1]}, "heatmaps": [{"x": "fleet.instances", "y": "seed"}]}
    with pytest.raises(SweepError, match="'seed' is not an axis"):
        load_sweep(_write(tmp_path, bad))


points = st.lists(
    st.tuples(st.integers(0, 20), st.integers(0, 20)).map(lambda p: {"c": p[0], "a": p[1]}), max_size=30
)


@given(points)
def test_pareto_front_is_exactly_the_undominated_variants(rows: list[dict[str, Any]]) -> None:
    mark_pareto(rows, "c", "a")

    def dominated(r: dict[str, Any]) -> bool:
        return any(
            o["c"] <= r["c"] and o["a"] >= r["a"] and (o["c"] < r["c"] or o["a"] > r["a"]) for o in rows
        )

    for r in rows:
        assert r["pareto"] is (not dominated(r))


def test_the_example_sweeps_load() -> None:
    from tokenplane.sim.sweep import expand

    root = Path(__file__).resolve().parents[2] / "examples" / "sweeps"
    cascade = load_sweep(root / "cascade-map.yaml")
    assert len(expand(cascade)) == 72 and cascade.reference == "no-fault"
    assert len(expand(load_sweep(root / "fleet-size.yaml"))) == 48
