"""A user's catalogue file (``--catalog FILE``): a model given only as a Hugging Face config.json and a
GPU given by datasheet figures, through ``simulate``, ``validate`` and ``plan``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tokenplane.cli import app
from tokenplane.sim.catalog import (
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_MEM_EFFICIENCY,
    H100_COMPUTE_EFFICIENCY,
    H100_LAYER_OVERHEAD_S,
    H100_MEM_EFFICIENCY,
    Catalog,
    CatalogError,
)
from tokenplane.sim.memory_tech import mem_efficiency_prior
from tokenplane.sim.perf_model import StepTimeModel
from tokenplane.sim.scenario import load_scenario
from tokenplane.sim.workloads.traces import ENV_VAR, traces_dir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
WIDE = {"COLUMNS": "250", "TERMINAL_WIDTH": "250"}

# Llama-3.1-8B's published config.json fields (shape only), written by the tests.
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# H100 SXM datasheet: 80 GB HBM3 at 3.35 TB/s, 989 dense BF16 TFLOPS, NVLink 4 at 900 GB/s.
H100_DATASHEET = (
    "    replace: true\n    hbm_gib: 80\n    hbm_bw_gbps: 3350\n    bf16_tflops: 989\n"
    "    price_per_hour: 2.99\n    interconnect: nvlink\n    interconnect_gbps: 900\n"
)


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=WIDE)


def _catalogue(tmp_path: Path, gpus: str = "", model_name: str = "my-llama") -> Path:
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "llama.json").write_text(json.dumps(LLAMA_31_8B))
    path = tmp_path / "catalog.yaml"
    path.write_text(
        f"models:\n  {model_name}:\n    hf_config: configs/llama.json\n" + (f"gpus:\n{gpus}" if gpus else "")
    )
    return path


def test_datasheet_gpu_gets_the_documented_mean_efficiencies(tmp_path: Path) -> None:
    cat = Catalog.from_yaml(_catalogue(tmp_path, gpus="  h100:\n" + H100_DATASHEET))
    g = cat.gpu("NVIDIA H100 80GB HBM3")  # the built-in's aliases still lead to it
    assert (g.mem_efficiency, g.compute_efficiency) == (DEFAULT_MEM_EFFICIENCY, DEFAULT_COMPUTE_EFFICIENCY)
    assert g.interconnect == "nvlink"
    merged = Catalog.from_yaml(_write(tmp_path / "m.yaml", "gpus:\n  h100:\n    price_per_hour: 1.0\n"))
    assert merged.gpu("h100").mem_efficiency == H100_MEM_EFFICIENCY  # without replace: merged


def test_h100_by_datasheet_with_its_fitted_efficiencies_is_the_builtin(tmp_path: Path) -> None:
    text = (
        "  my-h100:\n"
        + H100_DATASHEET.replace("    replace: true\n", "")
        + f"    mem_efficiency: {H100_MEM_EFFICIENCY}\n    compute_efficiency: {H100_COMPUTE_EFFICIENCY}\n"
        + f"    layer_overhead_s: {H100_LAYER_OVERHEAD_S}\n    step_overhead_s: 0\n"
    )
    cat = Catalog.from_yaml(_catalogue(tmp_path, gpus=text))
    builtin = Catalog.default()
    for tp in (1, 2):
        mine = StepTimeModel(cat.gpu("my-h100"), cat.model("my-llama"), tp)
        ref = StepTimeModel(builtin.gpu("h100"), builtin.model("llama-3.1-8b"), tp)
        for n, ctx in ((1, 2000), (64, 100_000), (2048, 0)):
            assert mine.step_time(n, ctx, ctx) == pytest.approx(ref.step_time(n, ctx, ctx), rel=1e-9)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "gpus:\n  g:\n    hbm_gib: 80\n    hbm_bw_gbps: 1\n    bf16_tflops: 1\n    price_per_hour: 1\n"
            "    interconnect: infiniband\n",
            "gpus.g.interconnect",
        ),
        ("gpus:\n  h100:\n    replace: yes please\n", "gpus.h100.replace"),
        ("gpus:\n  h100:\n    replace: true\n    hbm_gib: 80\n", "gpus.h100.hbm_bw_gbps"),
        (
            "models:\n  m:\n    params_b: 1\n    layers: 2\n    hidden: 8\n    intermediate: 8\n"
            "    heads: 1\n"
            "    kv_heads: 1\n    head_dim: 8\n    vocab: 8\n    experts: 4\n    moe_layers: 2\n"
            "    experts_per_token: 5\n    expert_intermediate: 8\n",
            "experts_per_token",
        ),
    ],
)
def test_bad_entries_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(CatalogError, match=needle.replace(".", r"\.")):
        Catalog.from_yaml(_write(tmp_path / "bad.yaml", text))


def test_simulate_runs_the_moe_example_with_its_catalogue(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _invoke(
        "simulate",
        str(EXAMPLES / "moe.yaml"),
        "--catalog",
        str(EXAMPLES / "catalog-moe.yaml"),
        "--out",
        str(out),
        "--no-plots",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    runs = json.loads((out / "report.json").read_text())["runs"]
    assert set(runs) == {"mixtral-nvlink", "mixtral-pcie", "deepseek-v2-lite", "mixtral-tp4", "mixtral-ep4"}
    for name, run in runs.items():
        assert run["requests_completed"] == run["requests_total"] > 0, name
    # Same fleet and requests: the PCIe H100s (less bandwidth, all-reduces over PCIe) are slower.
    assert runs["mixtral-pcie"]["tpot_mean_s"] > runs["mixtral-nvlink"]["tpot_mean_s"]
    # One Mixtral on 4 GPUs is faster per token than on 2 (TP2 above), with or without EP.
    assert runs["mixtral-ep4"]["tpot_mean_s"] < runs["mixtral-nvlink"]["tpot_mean_s"]
    assert runs["mixtral-tp4"]["tpot_mean_s"] < runs["mixtral-nvlink"]["tpot_mean_s"]
    ep = load_scenario(EXAMPLES / "moe.yaml").runs[-1].fleet.resolved_groups()[0]
    assert ep.expert_parallel and ep.tp == 4
    # Without the catalogue the models are unknown, and the error says so.
    bare = _invoke("simulate", str(EXAMPLES / "moe.yaml"), "--out", str(tmp_path / "o2"), "--no-progress")
    assert bare.exit_code == 2 and "unknown model 'mixtral-8x7b'" in bare.output
    broken = _invoke("simulate", str(EXAMPLES / "moe.yaml"), "--catalog", str(tmp_path / "none.yaml"))
    assert broken.exit_code == 2 and "cannot read catalogue file" in broken.output


def _measurement(root: Path, model: str, gpu: str) -> Path:
    folder = root / "run"
    folder.mkdir()
    lines = []
    for i in range(20):
        q = i * 0.2
        lines.append(
            {
                "input_toks": 300,
                "output_toks": 40,
                "queued_ts": q,
                "first_token_ts": q + 0.05,
                "last_token_ts": q + 0.05 + 39 * 0.012,
            }
        )
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "meta.json").write_text(json.dumps({"model": model, "hardware": {"device_name": gpu}}))
    return folder


def test_validate_takes_a_config_json_model_and_a_datasheet_gpu(tmp_path: Path) -> None:
    folder = _measurement(tmp_path, "acme/Llama-Clone-8B", "Acme X1")
    bare = _invoke("validate", "--measurements", str(folder), "--json")
    assert bare.exit_code == 2 and "--catalog FILE" in bare.output
    gpu = "  acme-x1:\n" + H100_DATASHEET.replace("    replace: true\n", "")
    catalogue = _catalogue(tmp_path, gpus=gpu, model_name="acme/llama-clone-8b")
    result = _invoke("validate", "--catalog", str(catalogue), "--measurements", str(folder), "--json")
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["runs"]
    assert run["requests_completed"] == 20
    # An 8B on an H100-class GPU: 20 light requests decode at ~6-8 ms a token.
    assert 0.004 < run["tpot_mean_simulated_s"] < 0.012


def test_plan_takes_the_catalogue(tmp_path: Path) -> None:
    gpu = "  acme-x1:\n" + H100_DATASHEET.replace("    replace: true\n", "")
    catalogue = _catalogue(tmp_path, gpus=gpu)
    spec = _write(
        tmp_path / "plan.yaml",
        "name: p\nmodel: my-llama\nusers: 50\ncalls_per_user_per_hour: 12\nsteps_per_task: 1\n"
        "prompt_tokens: {kind: lognormal, mean: 500, cv: 0.5, min: 1}\n"
        "output_tokens: {kind: lognormal, mean: 100, cv: 0.5, min: 1}\n"
        "slo: {ttft_s: 1.0, tbt_s: 0.05, attainment: 0.95}\ngpus: [acme-x1]\n"
        "search: {probe_duration_s: 30, verify_duration_s: 30, bisect_steps: 2}\n",
    )
    result = _invoke(
        "plan", str(spec), "--catalog", str(catalogue), "--out", str(tmp_path / "plan"), "--json"
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["gpu_type"] == "acmex1" and out["gpus"] >= 1


# The two shared vLLM runs are on an RTX 4090 and an RTX PRO 6000 (both Llama-3.1-8B).
RTXPRO6000_DATASHEET = (  # 96 GB GDDR7, 1597 GB/s (the run's config.json), ~504 dense BF16 TFLOPS
    "  rtxpro6000:\n    replace: true\n    hbm_gib: 96\n    hbm_bw_gbps: 1597\n    bf16_tflops: 504\n"
    "    price_per_hour: 1.79\n    interconnect: pcie\n    interconnect_gbps: 128\n"
)
RTX4090_DATASHEET = (  # 24 GB GDDR6X, 1008 GB/s, 165.2 dense BF16 TFLOPS (Ada whitepaper)
    "  rtx4090:\n    replace: true\n    hbm_gib: 24\n    hbm_bw_gbps: 1008\n    bf16_tflops: 165.2\n"
    "    price_per_hour: 0.69\n    interconnect: pcie\n    interconnect_gbps: 64\n"
    # No efficiencies: the priors of its memory type and of its published matmul figure
    # (sim/memory_tech.py, sim/matmul_prior.py) stand in for the H100/A100 means, which undersell
    # this consumer GPU (TPOT +20 % with them).
    "    memory_type: gddr6x\n    matmul_tflops: 167.21\n"
)


@pytest.mark.traces
@pytest.mark.parametrize("source", ["written-here", "example"])
def test_shared_vllm_runs_with_a_config_json_model_and_datasheet_gpus(tmp_path: Path, source: str) -> None:
    folder = traces_dir()
    if folder is None or not (folder / "vllm-measurements").is_dir():
        pytest.skip(
            f"public traces with vllm-measurements/ not found: set {ENV_VAR} or provide ../shared/traces"
        )
    runs = sorted(p for p in (folder / "vllm-measurements").iterdir() if p.is_dir())
    if source == "example":
        catalogue = EXAMPLES / "catalog-datasheet.yaml"
    else:
        catalogue = _catalogue(
            tmp_path, gpus=RTXPRO6000_DATASHEET + RTX4090_DATASHEET, model_name="meta-llama/Llama-3.1-8B"
        )
    cat = Catalog.from_yaml(catalogue)
    # Datasheet + documented means; the example states GDDR7, whose memory-type prior replaces the mean.
    expected = mem_efficiency_prior("gddr7") if source == "example" else DEFAULT_MEM_EFFICIENCY
    assert cat.gpu("rtxpro6000").mem_efficiency == pytest.approx(expected)
    assert cat.model("meta-llama/Llama-3.1-8B").params_b == pytest.approx(8.03, rel=1e-3)
    args = ["validate", "--catalog", str(catalogue), "--json"]
    for run in runs:
        args += ["--measurements", str(run)]
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    results = json.loads(result.output)["runs"]
    assert len(results) == len(runs) >= 2
    for res in results:
        assert res["requests_completed"] == res["requests"], res["name"]
        assert abs(res["tpot_mean_rel_error"]) <= 0.05, (res["name"], res["tpot_mean_rel_error"])
        assert abs(res["ttft_mean_rel_error"]) <= 0.15, (res["name"], res["ttft_mean_rel_error"])


def test_readme_catalogue_example_loads() -> None:
    import re

    import yaml

    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (text,) = [b for b in blocks if "hf_config" in b]
    cat = Catalog.default().with_overrides(yaml.safe_load(text), base_dir=EXAMPLES)
    assert cat.model("mixtral-8x7b").experts == 8
    assert cat.gpu("h100-pcie").interconnect == "pcie"


def test_calibrate_fits_a_datasheet_gpu_on_a_users_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenplane.sim.calibrate import main

    folder = _measurement(tmp_path, "acme/Llama-Clone-8B", "Acme X1")
    gpu = "  acme-x1:\n" + H100_DATASHEET.replace("    replace: true\n", "")
    catalogue = _catalogue(tmp_path, gpus=gpu, model_name="acme/llama-clone-8b")
    assert main(["--traces", str(tmp_path), "--engine-fit", str(folder), "--catalog", str(catalogue)]) == 0
    out = capsys.readouterr().out
    assert "best (mem_efficiency, compute_efficiency) for acmex1" in out
    assert len([line for line in out.splitlines() if "TPOT" in line]) == 5


def test_an_autoscaled_scenario_on_a_catalogue_model_is_checked_with_the_catalogue(tmp_path: Path) -> None:
    scenario = _write(
        tmp_path / "as.yaml",
        "name: as\nrouter: least-requests\nfleet: {instances: 2, gpu: H100, model: my-llama}\n"
        "workload: {type: synthetic, rate_rps: 2, num_requests: 40}\n"
        "autoscaler: {name: static, params: {instances: 1}, pool: {capacity_rps: 4, min_instances: 1}}\n",
    )
    bare = _invoke("simulate", str(scenario), "--out", str(tmp_path / "o1"), "--no-progress", "--no-plots")
    assert bare.exit_code == 2 and "unknown model 'my-llama'" in bare.output  # an error, not a crash
    result = _invoke(
        "simulate",
        str(scenario),
        "--catalog",
        str(_catalogue(tmp_path)),
        "--out",
        str(tmp_path / "o2"),
        "--no-progress",
        "--no-plots",
    )
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "o2" / "report.json").read_text())["runs"]["least-requests"]
    assert run["requests_completed"] == 40 and run["model"] == "my-llama"
