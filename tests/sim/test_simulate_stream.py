"""``tokenplane simulate --stream [--records FILE]``: the streaming aggregates from the command line
give the figures of the in-memory run, and the records file holds every request once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from tokenplane.cli import app

SCENARIO: dict[str, Any] = {
    "name": "streamed",
    "seed": 5,
    "fleet": {"instances": 2, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "synthetic",
        "rate_rps": 30,
        "num_requests": 300,
        "prompt": {"kind": "lognormal", "mean": 400, "cv": 0.5, "min": 1},
        "output": {"kind": "lognormal", "mean": 60, "cv": 0.5, "min": 1},
        "shared_prefix_tokens": 256,
        "prefix_groups": 4,
    },
    "runs": [{"name": "rr", "router": "round-robin"}, {"name": "pa", "router": "prefix-affinity"}],
}
SAME = ("requests_total", "requests_completed", "ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s")
SAME += ("throughput_rps", "goodput_rps", "prefix_hit_ratio", "route_reasons", "duration_s")


def _simulate(*args: str) -> Any:
    return CliRunner().invoke(app, ["simulate", *args], env={"COLUMNS": "300"})


def test_stream_gives_the_in_memory_figures_and_one_record_per_request(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    plain = _simulate(str(path), "--out", str(tmp_path / "plain"), "--no-plots")
    assert plain.exit_code == 0, plain.output
    records = tmp_path / "records.jsonl"
    streamed = _simulate(str(path), "--out", str(tmp_path / "s"), "--stream", "--records", str(records))
    assert streamed.exit_code == 0, streamed.output
    a = json.loads((tmp_path / "plain" / "report.json").read_text())["runs"]
    b = json.loads((tmp_path / "s" / "report.json").read_text())["runs"]
    for run in ("rr", "pa"):
        assert {k: b[run][k] for k in SAME} == {k: a[run][k] for k in SAME}
        assert b[run]["records"] == "streamed"
        lines = (tmp_path / f"records.{run}.jsonl").read_text().splitlines()
        ids = [json.loads(line)["request_id"] for line in lines]
        assert len(ids) == len(set(ids)) == a[run]["requests_total"] == 300
    assert not records.exists()  # several runs: one file per run, named after it
    assert "records.pa.jsonl" in " ".join(streamed.output.split())


def test_records_without_stream_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    result = _simulate(str(path), "--out", str(tmp_path / "o"), "--records", str(tmp_path / "r.jsonl"))
    assert result.exit_code == 2
    assert "--records needs --stream" in " ".join(result.output.split())
