"""Validate the twin against real vLLM runs: same arrivals, lengths and engine settings.

A measurement folder holds ``requests.jsonl`` (per request ``input_toks``, ``output_toks``,
``queued_ts``, ``first_token_ts``, ``last_token_ts`` on the engine's clock), ``meta.json`` (vLLM's
engine arguments, and where present the KV-cache size it allocated) and ``config.json`` (hardware
and model). The twin replays the requests on one instance of the named GPU and model with the
same ``max_num_seqs``, ``max_num_batched_tokens``, block size and KV capacity, and compares TTFT
(first token minus queued) and TPOT ((last − first) / (output − 1)) with what vLLM measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tokenplane.sim.catalog import Catalog, UnknownHardware
from tokenplane.sim.errors import ValidationError as ValidationError
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.report import percentile
from tokenplane.sim.runner import simulate
from tokenplane.sim.scenario import EngineSettings, FleetSettings, RunSettings, SloSettings
from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.traces import traces_dir

MEASUREMENTS_SUBDIR = "vllm-measurements"
STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True, slots=True)
class MeasuredRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float | None


@dataclass(frozen=True, slots=True)
class Measurement:
    name: str
    gpu: str
    model: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_capacity_tokens: int | None
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    requests: tuple[MeasuredRequest, ...]
    # vLLM's scheduler_reserve_full_isl from the resolved config when recorded, else its default.
    reserve_full_prompt: bool = True


class _ReplayWorkload:
    """The measured requests, as an open-loop workload."""

    def __init__(self, m: Measurement) -> None:
        self.name = f"replay:{m.name}"
        self._m = m

    def arrivals(self) -> Iterator[RequestSpec]:
        for i, r in enumerate(self._m.requests):
            yield RequestSpec(
                i, r.arrival_s, r.prompt_tokens, r.output_tokens, max_output_tokens=r.output_tokens
            )

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path}: invalid JSON: {exc}") from exc


def load_measurement(folder: Path) -> Measurement:
    if not (folder / "requests.jsonl").is_file():
        raise ValidationError(f"{folder}: no requests.jsonl (is this a vLLM measurement folder?)")
    meta = _read_json(folder / "meta.json") if (folder / "meta.json").is_file() else {}
    config = _read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if not isinstance(meta, dict) or not isinstance(config, dict):
        raise ValidationError(f"{folder}: meta.json and config.json must each hold a JSON object")
    kwargs = meta.get("engine_kwargs") or {}
    kv = meta.get("kv_cache") or {}
    if not isinstance(kwargs, dict) or not isinstance(kv, dict):
        raise ValidationError(f"{folder / 'meta.json'}: engine_kwargs and kv_cache must be objects")
    try:
        inst = config["nodes"][0]["instances"][0]
    except (KeyError, IndexError, TypeError):
        inst = {}
    gpu = inst.get("hardware") or (meta.get("hardware") or {}).get("device_name")
    model = inst.get("model_name") or meta.get("model") or kwargs.get("model")
    if not gpu or not model:
        raise ValidationError(f"{folder}: config.json/meta.json name no hardware or model")
    try:
        block_size = int(kv.get("block_size") or 16)
        kv_tokens = int(kv["num_gpu_blocks"]) * block_size if kv.get("num_gpu_blocks") else None
        util = float(kv.get("gpu_memory_utilization") or (inst.get("npu_mem") or {}).get("mem_util") or 0.9)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValidationError(f"{folder}: bad kv_cache or npu_mem setting: {exc}") from exc
    raw = []
    with (folder / "requests.jsonl").open() as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                raw.append(
                    (
                        float(r["queued_ts"]),
                        int(r["input_toks"]),
                        int(r["output_toks"]),
                        float(r["first_token_ts"]),
                        float(r["last_token_ts"]),
                    )
                )
            except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
                raise ValidationError(f"{folder / 'requests.jsonl'}:{n}: bad record: {exc}") from exc
    if not raw:
        raise ValidationError(f"{folder}: requests.jsonl is empty")
    raw.sort()
    t0 = raw[0][0]
    requests = tuple(
        MeasuredRequest(
            arrival_s=q - t0,
            prompt_tokens=p,
            output_tokens=max(1, o),
            ttft_s=first - q,
            tpot_s=(last - first) / (o - 1) if o > 1 else None,
        )
        for q, p, o, first, last in raw
    )
    try:
        return _measurement(folder, gpu, model, kwargs, inst, block_size, kv_tokens, util, kv, requests, meta)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{folder / 'meta.json'}: bad engine setting: {exc}") from exc


def _scheduler_config(meta: dict[str, Any]) -> dict[str, Any]:
    """vLLM's resolved scheduler config when the run recorded it (``resolved_config``), else empty."""
    resolved = meta.get("resolved_config")
    sched = resolved.get("scheduler_config") if isinstance(resolved, dict) else None
    return sched if isinstance(sched, dict) else {}


def _measurement(
    folder: Path,
    gpu: Any,
    model: Any,
    kwargs: dict[str, Any],
    inst: dict[str, Any],
    block_size: int,
    kv_tokens: int | None,
    util: float,
    kv: dict[str, Any],
    requests: tuple[MeasuredRequest, ...],
    meta: dict[str, Any],
) -> Measurement:
    return Measurement(
        name=folder.name,
        gpu=str(gpu),
        model=str(model),
        tp=int(kwargs.get("tensor_parallel_size") or inst.get("tp_size") or 1),
        max_num_seqs=int(kwargs.get("max_num_seqs") or 256),
        max_num_batched_tokens=int(kwargs.get("max_num_batched_tokens") or 2048),
        block_size=block_size,
        kv_capacity_tokens=kv_tokens,
        gpu_memory_utilization=util,
        enable_prefix_caching=bool(kv.get("enable_prefix_caching", True)),
        requests=requests,
        reserve_full_prompt=bool(_scheduler_config(meta).get("scheduler_reserve_full_isl", True)),
    )


def replay(m: Measurement, catalog: Catalog) -> list[RequestRecord]:
    try:
        catalog.gpu(m.gpu)
        catalog.model(m.model)
    except UnknownHardware as exc:
        raise ValidationError(
            f"{m.name}: {exc}; add it in a catalogue file passed with --catalog FILE "
            "(a GPU by its datasheet figures, a model by its Hugging Face config.json)"
        ) from exc
    run = RunSettings(
        name=m.name,
        seed=0,
        router="round-robin",
        fleet=FleetSettings(
            instances=1,
            gpu=m.gpu,
            model=m.model,
            tp=m.tp,
            engine=EngineSettings(
                max_num_seqs=m.max_num_seqs,
                max_num_batched_tokens=m.max_num_batched_tokens,
                block_size=m.block_size,
                kv_capacity_tokens=m.kv_capacity_tokens,
                gpu_memory_utilization=m.gpu_memory_utilization,
                enable_prefix_caching=m.enable_prefix_caching,
                reserve_full_prompt=m.reserve_full_prompt,
            ),
        ),
        workload={},
        slo=SloSettings(),
    )
    return simulate(run, catalog=catalog, workload=_ReplayWorkload(m)).records


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    s = sorted(values)
    return {
        "mean": math.fsum(s) / len(s) if s else None,
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "p99": percentile(s, 99),
    }


def _rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def compare(m: Measurement, records: Sequence[RequestRecord]) -> dict[str, Any]:
    measured_ttft = _stats([r.ttft_s for r in m.requests])
    measured_tpot = _stats([r.tpot_s for r in m.requests if r.tpot_s is not None])
    sim_ttft = _stats([t for r in records if (t := r.ttft_s) is not None])
    sim_tpot = _stats([t for r in records if (t := r.tpot_s) is not None])
    out: dict[str, Any] = {
        "name": m.name,
        "gpu": m.gpu,
        "model": m.model,
        "requests": len(m.requests),
        "requests_completed": sum(1 for r in records if r.ok),
    }
    for metric, real, sim in (("ttft", measured_ttft, sim_ttft), ("tpot", measured_tpot, sim_tpot)):
        for stat in STATS:
            out[f"{metric}_{stat}_measured_s"] = real[stat]
            out[f"{metric}_{stat}_simulated_s"] = sim[stat]
            out[f"{metric}_{stat}_rel_error"] = _rel(sim[stat], real[stat])
    return out


def measurement_folders(traces: Path | None) -> list[Path]:
    folder = traces_dir(traces)
    if folder is None or not (folder / MEASUREMENTS_SUBDIR).is_dir():
        raise ValidationError(
            "no measurements given and no traces folder with vllm-measurements/ found; pass "
            "--measurements DIR or --traces DIR (or set TOKENPLANE_TRACES)"
        )
    return sorted(p for p in (folder / MEASUREMENTS_SUBDIR).iterdir() if p.is_dir())


def validate_runs(
    folders: Sequence[Path] | None, *, traces: Path | None = None, catalog: Catalog | None = None
) -> list[dict[str, Any]]:
    catalog = catalog or Catalog.default()
    paths = list(folders) if folders else measurement_folders(traces)
    results = []
    for path in paths:
        m = load_measurement(Path(path))
        results.append(compare(m, replay(m, catalog)))
    return results


def print_validation(results: Sequence[dict[str, Any]], console: Console) -> None:
    for res in results:
        table = Table(title=f"{res['name']}: {res['model']} on {res['gpu']} ({res['requests']} requests)")
        for col in ("metric", "measured ms", "simulated ms", "error"):
            table.add_column(col, justify="right" if col != "metric" else "left")
        for metric in ("ttft", "tpot"):
            for stat in STATS:
                real = res[f"{metric}_{stat}_measured_s"]
                sim = res[f"{metric}_{stat}_simulated_s"]
                err = res[f"{metric}_{stat}_rel_error"]
                table.add_row(
                    f"{metric.upper()} {stat}",
                    "-" if real is None else f"{real * 1000:.1f}",
                    "-" if sim is None else f"{sim * 1000:.1f}",
                    "-" if err is None else f"{err:+.1%}",
                )
        console.print(table)
