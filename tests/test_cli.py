"""The ``tokenplane`` command line, driven through its public interface (CliRunner and a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tokenplane.cli import app
from tokenplane.sim.report import WALL_CLOCK_FIELDS

# Wide enough that rich neither wraps error messages nor truncates run names in the summary table.
WIDE = {"COLUMNS": "400", "LINES": "100"}

REQUIRED_KEYS = (
    "ttft_p50_s",
    "ttft_p99_s",
    "tbt_p50_s",
    "tbt_p99_s",
    "e2e_p50_s",
    "throughput_rps",
    "output_tokens_per_s",
    "goodput_rps",
    "prefix_hit_ratio",
    "prefix_hit_bound",
    "cost_per_million_tokens",
    "requests_completed",
    "wall_seconds",
)

PNG_FILES = (
    "ttft_cdf.png",
    "latency_percentiles.png",
    "utilisation.png",
    "kv_usage.png",
    "goodput_timeline.png",
)

SMALL: dict[str, Any] = {
    "name": "small",
    "seed": 3,
    "fleet": {"instances": 2, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "synthetic",
        "rate_rps": 20,
        "num_requests": 200,
        "prompt": {"kind": "lognormal", "mean": 400, "cv": 0.5, "min": 1},
        "output": {"kind": "lognormal", "mean": 80, "cv": 0.5, "min": 1},
        "shared_prefix_tokens": 256,
        "prefix_groups": 4,
    },
    "runs": [
        {"name": "rr", "router": "round-robin"},
        {"name": "pa", "router": {"name": "prefix-affinity"}},
    ],
}


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "small.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=WIDE)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


def _without_wall_clock(doc: dict[str, Any]) -> str:
    for run in doc["runs"].values():
        for key in WALL_CLOCK_FIELDS:
            run.pop(key, None)
    return json.dumps(doc, indent=2, sort_keys=True)


# -- simulate ------------------------------------------------------------------------------------


def test_simulate_writes_report_plots_and_summary(tmp_path: Path) -> None:
    scenario = _write(tmp_path, SMALL)
    out = tmp_path / "out"
    result = _invoke("simulate", str(scenario), "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    doc = _report(out)
    assert set(doc["runs"]) == {"rr", "pa"}
    for name, run in doc["runs"].items():
        missing = [k for k in REQUIRED_KEYS if k not in run]
        assert not missing, f"{name} lacks {missing}"
        assert run["requests_completed"] == 200
        assert run["requests_total"] == 200
        assert run["throughput_rps"] > 0
        assert run["output_tokens_per_s"] > 0
        assert 0 <= run["prefix_hit_ratio"] <= run["prefix_hit_bound"] <= 1
        assert run["cost_per_million_tokens"] > 0
        assert run["ttft_p50_s"] <= run["ttft_p99_s"]
        assert run["tbt_p50_s"] <= run["tbt_p99_s"]
    assert doc["scenario"] == {"name": "small", "source": str(scenario)}
    for png in PNG_FILES:
        path = out / png
        assert path.is_file(), png
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rr" in result.stdout and "pa" in result.stdout
    assert "tokenplane twin runs" in result.stdout
    assert str(out / "report.json") in _flat(result.stdout)


def test_simulate_is_deterministic_apart_from_wall_clock(tmp_path: Path) -> None:
    scenario = _write(tmp_path, SMALL)
    texts = []
    for out in (tmp_path / "a", tmp_path / "b"):
        result = _invoke("simulate", str(scenario), "--out", str(out), "--no-progress", "--no-plots")
        assert result.exit_code == 0, result.output
        texts.append(_without_wall_clock(_report(out)))
        assert not list(out.glob("*.png")), "--no-plots must not write plots"
    assert texts[0] == texts[1]


def test_policy_override_gives_one_run_named_after_the_policy(tmp_path: Path) -> None:
    scenario = _write(tmp_path, SMALL)
    out = tmp_path / "out"
    result = _invoke(
        "simulate",
        str(scenario),
        "--out",
        str(out),
        "--policy",
        "least-requests",
        "--no-progress",
        "--no-plots",
    )
    assert result.exit_code == 0, result.output
    runs = _report(out)["runs"]
    assert list(runs) == ["least-requests"]
    assert runs["least-requests"]["router"] == "least-requests"
    assert runs["least-requests"]["requests_completed"] == 200
    assert "least-requests" in result.stdout


def test_run_option_selects_runs(tmp_path: Path) -> None:
    scenario = _write(tmp_path, SMALL)
    out = tmp_path / "out"
    result = _invoke(
        "simulate", str(scenario), "--out", str(out), "--run", "pa", "--no-progress", "--no-plots"
    )
    assert result.exit_code == 0, result.output
    runs = _report(out)["runs"]
    assert list(runs) == ["pa"]
    assert runs["pa"]["router"] == {"name": "prefix-affinity"}


def test_unknown_run_is_a_usage_error(tmp_path: Path) -> None:
    scenario = _write(tmp_path, SMALL)
    out = tmp_path / "out"
    result = _invoke("simulate", str(scenario), "--out", str(out), "--run", "nope", "--no-progress")
    assert result.exit_code == 2
    msg = _flat(result.stderr)
    assert "unknown run" in msg and "nope" in msg
    assert "'rr'" in msg and "'pa'" in msg
    assert not (out / "report.json").exists()


def test_typo_key_names_the_field(tmp_path: Path) -> None:
    scenario = _write(tmp_path, {"fleet": {"instnaces": 2}}, "typo.yaml")
    result = _invoke("simulate", str(scenario), "--out", str(tmp_path / "out"), "--no-progress")
    assert result.exit_code == 2
    msg = _flat(result.stderr)
    assert "fleet.instnaces" in msg
    assert str(scenario) in msg


def test_missing_scenario_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist.yaml"
    result = _invoke("simulate", str(missing), "--out", str(tmp_path / "out"), "--no-progress")
    assert result.exit_code == 2
    assert str(missing) in _flat(result.stderr)
    assert "Traceback" not in result.output


def test_unknown_router_lists_known_routers(tmp_path: Path) -> None:
    doc = {**SMALL, "runs": [{"name": "x", "router": "round-robbin"}]}
    result = _invoke("simulate", str(_write(tmp_path, doc)), "--out", str(tmp_path / "out"), "--no-progress")
    assert result.exit_code == 2
    msg = _flat(result.stderr)
    assert "round-robbin" in msg
    for known in ("round-robin", "least-requests", "prefix-affinity", "power-of-two"):
        assert known in msg


def test_unknown_policy_option_lists_known_routers(tmp_path: Path) -> None:
    result = _invoke(
        "simulate", str(_write(tmp_path, SMALL)), "--out", str(tmp_path / "out"), "--policy", "bogus"
    )
    assert result.exit_code == 2
    msg = _flat(result.stderr)
    assert "bogus" in msg and "round-robin" in msg


def test_unknown_gpu_is_a_usage_error(tmp_path: Path) -> None:
    doc = {**SMALL, "fleet": {**SMALL["fleet"], "gpu": "H999"}}
    result = _invoke("simulate", str(_write(tmp_path, doc)), "--out", str(tmp_path / "out"), "--no-progress")
    assert result.exit_code == 2
    msg = _flat(result.stderr)
    assert "H999" in msg and "h100" in msg.lower()
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_bad_workload_field_is_a_usage_error(tmp_path: Path) -> None:
    doc = {**SMALL, "workload": {**SMALL["workload"], "rate_rsp": 3}}
    result = _invoke("simulate", str(_write(tmp_path, doc)), "--out", str(tmp_path / "out"), "--no-progress")
    assert result.exit_code == 2
    assert "rate_rsp" in _flat(result.stderr)


def test_missing_trace_under_traces_option_names_it(tmp_path: Path) -> None:
    empty = tmp_path / "no-traces"
    empty.mkdir()
    doc = {**SMALL, "workload": {"type": "mooncake", "path": "mooncake/conversation_trace.jsonl"}}
    result = _invoke(
        "simulate", str(_write(tmp_path, doc)), "--out", str(tmp_path / "out"), "--traces", str(empty)
    )
    assert result.exit_code == 2
    msg = _flat(result.stderr)
    assert "conversation_trace.jsonl" in msg and str(empty) in msg


def test_simulate_without_scenario_runs_the_embedded_default(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _invoke("simulate", "--out", str(out), "--no-progress", "--no-plots")
    assert result.exit_code == 0, result.output
    doc = _report(out)
    assert doc["scenario"]["name"] == "default-agentic"
    assert set(doc["runs"]) == {"round-robin", "least-requests", "prefix-affinity"}
    for run in doc["runs"].values():
        assert all(k in run for k in REQUIRED_KEYS)
        assert run["requests_completed"] > 0
    assert "default-agentic" in result.stdout


def test_example_scenario_prints_a_loadable_default() -> None:
    # The command is being renamed from scenario-schema to example-scenario; accept either.
    names = {c.name for c in app.registered_commands}
    name = "example-scenario" if "example-scenario" in names else "scenario-schema"
    result = _invoke(name)
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["name"] == "default-agentic"


def _console_script() -> list[str]:
    exe = Path(sys.executable).with_name("tokenplane")
    if exe.is_file():
        return [str(exe)]
    return [sys.executable, "-c", "from tokenplane.cli import app; app()"]


def test_console_script_in_a_real_process(tmp_path: Path) -> None:
    _write(tmp_path, SMALL)
    proc = subprocess.run(
        [*_console_script(), "simulate", "small.yaml", "--out", "tmp", "--no-progress"],
        cwd=tmp_path,
        env={**os.environ, **WIDE},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "tmp" / "report.json").read_text())
    assert set(doc["runs"]) == {"rr", "pa"}
    assert all(k in run for run in doc["runs"].values() for k in REQUIRED_KEYS)
    assert all((tmp_path / "tmp" / png).is_file() for png in PNG_FILES)
    assert "rr" in proc.stdout and "pa" in proc.stdout


def test_console_script_error_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*_console_script(), "simulate", "nowhere.yaml", "--out", "tmp"],
        cwd=tmp_path,
        env={**os.environ, **WIDE},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "nowhere.yaml" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- validate ------------------------------------------------------------------------------------


def _measurement(folder: Path, n: int = 30) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for i in range(n):
        queued = 5000.0 + 0.2 * i
        first = queued + 0.04 + 0.002 * (i % 5)
        out_toks = 40 + 7 * (i % 9)
        lines.append(
            json.dumps(
                {
                    "request_id": f"r-{i}",
                    "input_toks": 200 + 37 * (i % 11),
                    "output_toks": out_toks,
                    "queued_ts": queued,
                    "scheduled_ts": queued + 0.001,
                    "first_token_ts": first,
                    "last_token_ts": first + 0.008 * (out_toks - 1),
                }
            )
        )
    (folder / "requests.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "meta.json").write_text(
        json.dumps(
            {
                "model": "meta-llama/Llama-3.1-8B",
                "engine_kwargs": {"max_num_seqs": 128, "max_num_batched_tokens": 2048},
                "kv_cache": {"num_gpu_blocks": 20000, "block_size": 16},
            }
        )
    )
    (folder / "config.json").write_text(
        json.dumps(
            {"nodes": [{"instances": [{"hardware": "H100", "model_name": "meta-llama/Llama-3.1-8B"}]}]}
        )
    )
    return folder


def test_validate_json_on_a_generated_measurement(tmp_path: Path) -> None:
    folder = _measurement(tmp_path / "H100_llama")
    result = _invoke("validate", "--measurements", str(folder), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc) == ["runs"]
    (run,) = doc["runs"]
    assert run["name"] == "H100_llama"
    assert run["gpu"] == "H100"
    assert run["model"] == "meta-llama/Llama-3.1-8B"
    assert run["requests"] == 30
    assert run["requests_completed"] == 30
    for key in ("ttft_mean_rel_error", "tpot_mean_rel_error"):
        assert isinstance(run[key], float), key
    assert run["tpot_mean_measured_s"] == pytest.approx(0.008)
    assert run["ttft_mean_measured_s"] == pytest.approx(0.044, rel=1e-6)
    assert run["ttft_mean_simulated_s"] > 0 and run["tpot_mean_simulated_s"] > 0


def test_validate_table_output(tmp_path: Path) -> None:
    folder = _measurement(tmp_path / "H100_llama")
    result = _invoke("validate", "--measurements", str(folder))
    assert result.exit_code == 0, result.output
    assert "H100_llama" in result.stdout and "TTFT mean" in result.stdout


def test_validate_folder_without_requests_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _invoke("validate", "--measurements", str(empty), "--json")
    assert result.exit_code == 2
    msg = _flat(result.stderr)
    assert "requests.jsonl" in msg and str(empty) in msg
    assert result.stdout == ""


def test_validate_unknown_hardware_is_a_usage_error(tmp_path: Path) -> None:
    folder = _measurement(tmp_path / "m")
    (folder / "config.json").write_text(
        json.dumps({"nodes": [{"instances": [{"hardware": "TPU-v9", "model_name": "llama-3-8b"}]}]})
    )
    result = _invoke("validate", "--measurements", str(folder), "--json")
    assert result.exit_code == 2
    assert "TPU-v9" in _flat(result.stderr)


def test_policy_applies_to_the_selected_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _invoke(
        "simulate", str(_write(tmp_path, SMALL)), "--out", str(out), "--run", "pa", "--policy", "random",
        "--no-progress", "--no-plots",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = _report(out)["runs"]
    assert list(runs) == ["random"]
    assert runs["random"]["router"] == "random"


def test_out_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    result = _invoke("simulate", str(_write(tmp_path, SMALL)), "--out", str(afile), "--no-progress")
    assert result.exit_code == 2
    assert str(afile) in _flat(result.stderr)
