"""The gateway benchmarks still run: the in-process one drives the real request path (every answer
it counts was a 200, or it exits with an error) and reports a CPU figure; ``gateway_overhead.py``
prints the JSON fields issue 3 names, with interleaved rounds against the bare proxy. Nothing is
timed against a bound here; the figures are the benchmarks' to print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gateway_inproc.py"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_gateway_inproc_serves_every_request_through_the_front(stream: bool) -> None:
    args = [sys.executable, str(BENCH), "--n", "200", "--warmup", "50", "--rounds", "1", "--json"]
    if stream:
        args += ["--stream", "--chunks", "8", "--concurrency", "16"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["kind"] == ("stream" if stream else "non-stream")
    assert out["cpu_ms_per_req"] > 0


def test_gateway_inproc_tokenizes_growing_conversations(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH.parents[1] / "tests" / "support"))
    from tiny_tokenizer import make_tokenizer_folder

    folder = make_tokenizer_folder(tmp_path / "tok")
    args = [sys.executable, str(BENCH), "--n", "48", "--warmup", "16", "--rounds", "1", "--json"]
    args += ["--conversations", "--tokenizer", str(folder), "--concurrency", "8"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["kind"].startswith("non-stream conversations tokenizer=") and out["cpu_ms_per_req"] > 0


def test_tokenizer_encoders_compares_every_encoder_with_tokenizers(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH.parents[1] / "tests" / "support"))
    from tiny_tokenizer import make_tokenizer_folder

    folder = make_tokenizer_folder(tmp_path / "tok")
    args = [sys.executable, str(BENCH.with_name("tokenizer_encoders.py")), "--tokenizer", str(folder)]
    proc = subprocess.run([*args, "--texts", "20", "--json"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert set(out) == {"paragraphs", "words", "unicode"}
    for row in out.values():
        assert {"hf", "tiktoken", "fastokens"} <= set(row)
        assert all(
            row[e]["mismatches"] == 0 and row[e]["us_per_text"] > 0 for e in ("hf", "tiktoken", "fastokens")
        )


OVERHEAD = BENCH.with_name("gateway_overhead.py")
ISSUE_KEYS = (
    "rps",
    "gateway_cpu_ms_per_req",
    "added_ttft_p50_ms",
    "added_ttft_p99_ms",
    "added_total_p50_ms",
    "added_total_p99_ms",
    "errors",
)


def test_gateway_overhead_json_has_the_issues_fields_and_interleaved_bare_rounds() -> None:
    """One short scenario of each kind, with 2 interleaved rounds against the bare proxy."""
    args = [sys.executable, str(OVERHEAD), "--scenarios", "ns-c32,s-c1", "--window", "0.5"]
    args += ["--warmup", "0.3", "--ab-rounds", "2", "--json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    for name in ("ns-c32", "s-c1"):
        s = out[name]
        assert all(k in s for k in ISSUE_KEYS), sorted(s)
        assert s["errors"] == 0 and s["rps"] > 0 and s["gateway_cpu_ms_per_req"] > 0
        assert s["ab_rounds"] == 2 and s["cpu_ratio_gateway_over_bare_median"] > 0
    assert out["summary"]["cpu_ratio_gateway_over_bare_c32_rounds_median"] > 0


SUITE = BENCH.with_name("autoscale_suite.py")


def test_autoscale_suite_compares_every_scaler_and_writes_scenarios_the_twin_runs(tmp_path: Path) -> None:
    """A short generated workload (no traces needed): the JSON shape the issue names, the static
    fleet found by the harness, and a scenario file carrying the SLO period, which the twin runs."""
    args = [sys.executable, str(SUITE), "--json", "--minutes", "3", "--only", "bursty-cv4"]
    args += ["--write-scenarios", str(tmp_path / "sc"), "--traces", str(tmp_path / "none")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout)["workloads"]["bursty-cv4"]
    for label in ("tokenplane", "hpa", "hpa-kv", "static-best"):
        assert row[label]["gpu_hours"] > 0 and 0 <= row[label]["slo_attainment"] <= 1
    assert row["static-best"]["meets"] and row["static-best"]["slo_attainment"] >= 0.95
    assert row["verdict"]["gpu_hours_vs_static_best"] == round(
        row["tokenplane"]["gpu_hours"] / row["static-best"]["gpu_hours"], 3
    )
    from tokenplane.sim.runner import run_scenario
    from tokenplane.sim.scenario import load_scenario

    scenario = tmp_path / "sc" / "bursty-cv4.yaml"
    runs = {r["name"]: r["autoscaler"] for r in yaml.safe_load(scenario.read_text())["runs"]}
    assert 170 <= runs["tokenplane"]["params"]["slo_period_s"] <= 180  # the last arrival, in 3 minutes
    outcomes = run_scenario(load_scenario(scenario))
    assert set(outcomes) == {"tokenplane", "hpa", "hpa-kv"}
    for label, outcome in outcomes.items():  # the file reproduces the suite's rows
        assert round(outcome.report["gpu_hours"], 4) == row[label]["gpu_hours"]
        assert round(outcome.report["ttft_slo_attainment"], 4) == row[label]["slo_attainment"]


def test_autoscale_suite_ablates_a_rule_and_opens_every_scaler_at_a_given_size(tmp_path: Path) -> None:
    """``--without RULE`` turns one of the tokenplane scaler's rules off in the scenario it writes
    (a name it does not turn on is refused), and ``--start N`` opens every scaler at N."""
    base = [sys.executable, str(SUITE), "--json", "--minutes", "2", "--only", "bursty-cv4"]
    base += ["--traces", str(tmp_path / "none")]
    proc = subprocess.run(
        [*base, "--without", "slo_defer", "--start", "2", "--write-scenarios", str(tmp_path / "sc")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = {
        r["name"]: r["autoscaler"]
        for r in yaml.safe_load((tmp_path / "sc" / "bursty-cv4.yaml").read_text())["runs"]
    }
    assert runs["tokenplane"]["params"]["slo_defer"] is False
    assert runs["tokenplane"]["params"]["slo_budget"] is True
    assert {a["initial_serving"] for a in runs.values()} == {2}
    bad = subprocess.run([*base, "--without", "slo_nonsense"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "slo_nonsense" in bad.stderr
