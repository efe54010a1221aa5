"""Validation against vLLM measurement folders: loading, comparison math, and the real shared runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.validation import (
    MeasuredRequest,
    Measurement,
    ValidationError,
    compare,
    load_measurement,
    measurement_folders,
    replay,
    validate_runs,
)
from tokenplane.sim.workloads.traces import ENV_VAR, traces_dir

CONFIG = {"nodes": [{"instances": [{"hardware": "H100", "model_name": "meta-llama/Llama-3.1-8B"}]}]}
META = {
    "model": "meta-llama/Llama-3.1-8B",
    "engine_kwargs": {"max_num_seqs": 64, "max_num_batched_tokens": 1024, "tensor_parallel_size": 1},
    "kv_cache": {"num_gpu_blocks": 5000, "block_size": 32, "gpu_memory_utilization": 0.8},
}


def _record(q: float, p: int, o: int, first: float, last: float) -> dict[str, Any]:
    return {"input_toks": p, "output_toks": o, "queued_ts": q, "first_token_ts": first, "last_token_ts": last}


def _folder(
    root: Path,
    records: list[dict[str, Any]] | str,
    *,
    meta: dict[str, Any] | None = META,
    config: dict[str, Any] | None = CONFIG,
    name: str = "run",
) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    text = records if isinstance(records, str) else "".join(json.dumps(r) + "\n" for r in records)
    (folder / "requests.jsonl").write_text(text)
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_load_measurement_derives_ttft_tpot_and_relative_arrivals(tmp_path: Path) -> None:
    # Written out of order: the loader sorts by queued_ts.
    folder = _folder(
        tmp_path,
        [
            _record(102.5, 300, 11, 103.0, 104.0),  # ttft 0.5, tpot 1.0/10
            _record(100.0, 100, 5, 100.2, 100.6),  # ttft 0.2, tpot 0.4/4
            _record(101.0, 200, 1, 101.3, 101.3),  # one output token: no TPOT
        ],
    )
    m = load_measurement(folder)
    assert m.name == "run"
    assert m.gpu == "H100"
    assert m.model == "meta-llama/Llama-3.1-8B"
    assert (m.tp, m.max_num_seqs, m.max_num_batched_tokens) == (1, 64, 1024)
    assert m.block_size == 32
    assert m.kv_capacity_tokens == 5000 * 32
    assert m.gpu_memory_utilization == 0.8
    assert m.enable_prefix_caching is True
    r0, r1, r2 = m.requests
    assert [r.arrival_s for r in m.requests] == pytest.approx([0.0, 1.0, 2.5])
    assert [r.prompt_tokens for r in m.requests] == [100, 200, 300]
    assert [r.output_tokens for r in m.requests] == [5, 1, 11]
    assert r0.ttft_s == pytest.approx(0.2)
    assert r0.tpot_s == pytest.approx(0.1)
    assert r1.ttft_s == pytest.approx(0.3)
    assert r1.tpot_s is None
    assert r2.ttft_s == pytest.approx(0.5)
    assert r2.tpot_s == pytest.approx(0.1)


def test_load_measurement_defaults_without_kv_info(tmp_path: Path) -> None:
    meta = {"model": "llama-3-8b", "engine_kwargs": {}}
    config = {"nodes": [{"instances": [{"hardware": "RTX4090", "npu_mem": {"mem_util": 0.85}}]}]}
    folder = _folder(tmp_path, [_record(5.0, 10, 2, 5.1, 5.2)], meta=meta, config=config)
    m = load_measurement(folder)
    assert m.model == "llama-3-8b"  # from meta.json when config.json names none
    assert m.kv_capacity_tokens is None
    assert m.block_size == 16
    assert (m.max_num_seqs, m.max_num_batched_tokens, m.tp) == (256, 2048, 1)
    assert m.gpu_memory_utilization == 0.85


def test_load_measurement_hardware_from_meta(tmp_path: Path) -> None:
    meta = {"model": "meta-llama/Llama-3.1-8B", "hardware": {"device_name": "NVIDIA GeForce RTX 4090"}}
    m = load_measurement(_folder(tmp_path, [_record(0.0, 10, 2, 0.1, 0.2)], meta=meta, config=None))
    assert m.gpu == "NVIDIA GeForce RTX 4090"
    assert Catalog.default().gpu(m.gpu).name == "rtx4090"


def test_load_measurement_skips_blank_lines(tmp_path: Path) -> None:
    text = json.dumps(_record(0.0, 10, 2, 0.1, 0.2)) + "\n\n   \n" + json.dumps(_record(1.0, 10, 2, 1.1, 1.2))
    assert len(load_measurement(_folder(tmp_path, text)).requests) == 2


@pytest.mark.parametrize(
    ("second_line", "what"),
    [
        ('{"input_toks": 10, "output_toks": 2, "queued_ts": 1.0, "first_token_ts": 1.1}', "last_token_ts"),
        ("not json", "bad record"),
        (
            '{"input_toks": "ten", "output_toks": 2, "queued_ts": 1, "first_token_ts": 1, "last_token_ts":1}',
            "ten",
        ),
        (
            '{"input_toks": 10, "output_toks": 2, "queued_ts": null, "first_token_ts": 1, "last_token_ts":1}',
            "bad",
        ),
        ("[1, 2, 3]", "bad record"),
    ],
)
def test_bad_record_names_file_and_line(tmp_path: Path, second_line: str, what: str) -> None:
    text = json.dumps(_record(0.0, 10, 2, 0.1, 0.2)) + "\n" + second_line + "\n"
    folder = _folder(tmp_path, text)
    with pytest.raises(ValidationError) as info:
        load_measurement(folder)
    msg = str(info.value)
    assert f"{folder / 'requests.jsonl'}:2: bad record" in msg
    assert what in msg


def test_missing_or_empty_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"no requests\.jsonl"):
        load_measurement(tmp_path)
    with pytest.raises(ValidationError, match="empty"):
        load_measurement(_folder(tmp_path, "\n", name="empty"))
    with pytest.raises(ValidationError, match="no hardware or model"):
        load_measurement(_folder(tmp_path, [_record(0, 1, 1, 0, 0)], meta={}, config={}, name="anon"))
    bad = _folder(tmp_path, [_record(0, 1, 1, 0, 0)], meta=None, name="badmeta")
    (bad / "meta.json").write_text("{not json")
    with pytest.raises(ValidationError, match=r"meta\.json: invalid JSON"):
        load_measurement(bad)


def _measurement(requests: tuple[MeasuredRequest, ...]) -> Measurement:
    return Measurement(
        name="hand",
        gpu="H100",
        model="llama-3-8b",
        tp=1,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        block_size=16,
        kv_capacity_tokens=100_000,
        gpu_memory_utilization=0.9,
        enable_prefix_caching=True,
        requests=requests,
    )


def _sim(rid: int, arrival: float, first: float, finish: float, out: int, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        tenant="default",
        arrival_s=arrival,
        prompt_tokens=10,
        output_tokens=out,
        first_token_s=first,
        finish_s=finish,
        ok=ok,
    )


def test_compare_math_on_hand_made_records() -> None:
    m = _measurement(
        (
            MeasuredRequest(0.0, 10, 3, ttft_s=0.1, tpot_s=0.02),
            MeasuredRequest(1.0, 10, 3, ttft_s=0.3, tpot_s=0.04),
            MeasuredRequest(2.0, 10, 1, ttft_s=0.2, tpot_s=None),
        )
    )
    records = [
        _sim(0, 0.0, 0.12, 0.12 + 2 * 0.03, 3),  # ttft 0.12, tpot 0.03
        _sim(1, 1.0, 1.36, 1.36 + 2 * 0.03, 3),  # ttft 0.36, tpot 0.03
        _sim(2, 2.0, 2.18, 2.18, 1),  # ttft 0.18, no tpot
    ]
    out = compare(m, records)
    assert out["name"] == "hand" and out["gpu"] == "H100" and out["model"] == "llama-3-8b"
    assert out["requests"] == 3 and out["requests_completed"] == 3
    assert out["ttft_mean_measured_s"] == pytest.approx(0.2)
    assert out["ttft_mean_simulated_s"] == pytest.approx(0.22)
    assert out["ttft_mean_rel_error"] == pytest.approx(0.1)
    assert out["ttft_p50_measured_s"] == pytest.approx(0.2)
    assert out["ttft_p50_simulated_s"] == pytest.approx(0.18)
    assert out["ttft_p50_rel_error"] == pytest.approx(-0.1)
    assert out["ttft_p90_measured_s"] == pytest.approx(0.28)  # 0.2 + 0.8 * (0.3 - 0.2)
    assert out["ttft_p99_simulated_s"] == pytest.approx(0.18 + 0.98 * (0.36 - 0.18))
    assert out["tpot_mean_measured_s"] == pytest.approx(0.03)
    assert out["tpot_mean_simulated_s"] == pytest.approx(0.03)
    assert out["tpot_mean_rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert out["tpot_p50_measured_s"] == pytest.approx(0.03)
    assert out["tpot_p90_measured_s"] == pytest.approx(0.038)
    assert out["tpot_p90_rel_error"] == pytest.approx(0.03 / 0.038 - 1)
    for metric in ("ttft", "tpot"):
        for stat in ("mean", "p50", "p90", "p99"):
            for suffix in ("measured_s", "simulated_s", "rel_error"):
                assert f"{metric}_{stat}_{suffix}" in out


def test_compare_counts_failures_and_handles_missing_values() -> None:
    m = _measurement((MeasuredRequest(0.0, 10, 1, ttft_s=0.0, tpot_s=None),))
    failed = RequestRecord(request_id=0, tenant="default", arrival_s=0.0, prompt_tokens=10, output_tokens=1)
    out = compare(m, [failed])
    assert out["requests_completed"] == 0
    assert out["ttft_mean_measured_s"] == 0.0
    assert out["ttft_mean_simulated_s"] is None
    assert out["ttft_mean_rel_error"] is None  # nothing simulated, and a zero measurement
    assert out["tpot_mean_measured_s"] is None and out["tpot_mean_rel_error"] is None


def test_replay_and_validate_runs_on_a_generated_folder(tmp_path: Path) -> None:
    records = []
    for i in range(30):
        q = 50.0 + 0.25 * i
        o = 20 + i
        records.append(_record(q, 256 + 16 * i, o, q + 0.05, q + 0.05 + 0.01 * (o - 1)))
    folder = _folder(tmp_path, records, name="gen")
    m = load_measurement(folder)
    sim = replay(m, Catalog.default())
    assert len(sim) == 30 and all(r.ok for r in sim)
    assert sorted(r.arrival_s for r in sim) == pytest.approx([r.arrival_s for r in m.requests])
    assert sorted(r.output_tokens for r in sim) == sorted(r.output_tokens for r in m.requests)
    (res,) = validate_runs([folder])
    assert res["name"] == "gen" and res["requests"] == 30 and res["requests_completed"] == 30
    assert res["tpot_mean_measured_s"] == pytest.approx(0.01)
    assert res["ttft_mean_measured_s"] == pytest.approx(0.05)
    assert res["tpot_mean_simulated_s"] > 0


def test_replay_unknown_hardware_is_a_validation_error(tmp_path: Path) -> None:
    config = {"nodes": [{"instances": [{"hardware": "TPU-v9", "model_name": "llama-3-8b"}]}]}
    folder = _folder(tmp_path, [_record(0.0, 10, 2, 0.1, 0.2)], config=config)
    with pytest.raises(ValidationError, match=r"TPU-v9.*catalogue"):
        validate_runs([folder])


def test_measurement_folders_needs_a_traces_folder(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="vllm-measurements"):
        measurement_folders(tmp_path)
    (tmp_path / "vllm-measurements" / "b").mkdir(parents=True)
    (tmp_path / "vllm-measurements" / "a").mkdir()
    (tmp_path / "vllm-measurements" / "README").write_text("x")
    assert [p.name for p in measurement_folders(tmp_path)] == ["a", "b"]


@pytest.mark.traces
def test_real_vllm_runs_are_reproduced() -> None:
    folder = traces_dir()
    if folder is None or not (folder / "vllm-measurements").is_dir():
        pytest.skip(
            f"public traces with vllm-measurements/ not found: set {ENV_VAR} or provide ../shared/traces"
        )
    results = validate_runs(None)
    assert results, "no measurement folders"
    for res in results:
        assert res["requests_completed"] == res["requests"], res["name"]
        assert abs(res["tpot_mean_rel_error"]) <= 0.05, (res["name"], res["tpot_mean_rel_error"])
        assert abs(res["ttft_mean_rel_error"]) <= 0.15, (res["name"], res["ttft_mean_rel_error"])


@pytest.mark.parametrize(
    "meta",
    [
        [],
        {"model": "llama-3-8b", "hardware": {"device_name": "H100"}, "engine_kwargs": {"max_num_seqs": "x"}},
    ],
    ids=["list", "non-numeric"],
)
def test_malformed_meta_is_a_validation_error(tmp_path: Path, meta: Any) -> None:
    folder = _folder(tmp_path, [_record(0.0, 10, 2, 0.1, 0.2)], meta=None, config=None)
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValidationError, match=r"meta\.json"):
        load_measurement(folder)


@pytest.mark.parametrize(
    ("resolved", "expected"),
    [
        (None, True),  # not recorded: vLLM's default
        ({"scheduler_config": {"scheduler_reserve_full_isl": False}}, False),
        ({"scheduler_config": {"scheduler_reserve_full_isl": True}}, True),
        ("<SchedulerConfig>", True),  # not an object: ignored
    ],
)
def test_load_measurement_reads_the_full_prompt_admission_gate(
    tmp_path: Path, resolved: Any, expected: bool
) -> None:
    meta = {**META, **({"resolved_config": resolved} if resolved is not None else {})}
    m = load_measurement(_folder(tmp_path, [_record(0.0, 10, 2, 0.1, 0.2)], meta=meta))
    assert m.reserve_full_prompt is expected
