from __future__ import annotations

from pathlib import Path

from tokenplane.sim.plots import RunData, plot_runs
from tokenplane.sim.records import InstanceRecord, InstanceSample, RequestRecord, TbtHistogram
from tokenplane.sim.report import Slo, build_run_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXPECTED = {
    "ttft_cdf.png",
    "latency_percentiles.png",
    "utilisation.png",
    "kv_usage.png",
    "goodput_timeline.png",
}


def _records(n: int) -> list[RequestRecord]:
    out = []
    for i in range(n):
        arrival = i * 0.1
        ttft = 0.05 + (i % 13) * 0.04
        out.append(
            RequestRecord(
                request_id=i,
                tenant="t",
                arrival_s=arrival,
                prompt_tokens=200,
                output_tokens=20,
                instance_id=f"i{i % 3}",
                scheduled_s=arrival + 0.01,
                first_token_s=arrival + ttft,
                finish_s=arrival + ttft + 1.0,
                prefix_hit_tokens=50,
                prefix_bound_tokens=100,
                ok=i % 10 != 0,
                reason="done" if i % 10 else "timeout",
                route_reason="prefix",
            )
        )
    return out


def _instances(count: int, duration: float) -> list[InstanceRecord]:
    out = []
    for k in range(count):
        samples = [
            InstanceSample(
                t_s=t * 1.0,
                busy_fraction=((t + k) % 10) / 10,
                kv_usage=((t * k) % 7) / 7,
                running=1,
                waiting=0,
            )
            for t in range(int(duration))
        ]
        out.append(
            InstanceRecord(f"i{k}", "H100", "m", 3.0, busy_s=duration / 2, alive_s=duration, samples=samples)
        )
    return out


def _run(records: list[RequestRecord], instances: list[InstanceRecord], duration: float) -> RunData:
    tbt = TbtHistogram()
    tbt.add(0.03, 100)
    report = build_run_report(records, instances, tbt, duration_s=duration, wall_seconds=0.1, slo=Slo())
    return RunData(records=records, instances=instances, report=report)


def _check_pngs(paths: list[Path], out: Path) -> None:
    assert {p.name for p in paths} == EXPECTED
    for p in paths:
        assert p.parent == out
        data = p.read_bytes()
        assert len(data) > 100
        assert data[:8] == PNG_MAGIC


def test_plots_two_runs_including_empty(tmp_path: Path) -> None:
    busy = _run(_records(500), _instances(3, 60.0), 60.0)
    failed = [
        RequestRecord(
            request_id=i, tenant="t", arrival_s=float(i), prompt_tokens=10, output_tokens=5, reason="rejected"
        )
        for i in range(5)
    ]
    empty = _run(failed, [InstanceRecord("j0", "A100", "m", 1.0)], 10.0)
    out = tmp_path / "plots"
    paths = plot_runs(out, {"busy": busy, "empty": empty})
    _check_pngs(paths, out)


def test_plots_many_instances_and_no_runs(tmp_path: Path) -> None:
    many = _run(_records(200), _instances(20, 30.0), 30.0)
    paths = plot_runs(tmp_path / "many", {"many": many})
    _check_pngs(paths, tmp_path / "many")
    paths = plot_runs(tmp_path / "none", {})
    _check_pngs(paths, tmp_path / "none")


def test_plots_without_report(tmp_path: Path) -> None:
    data = RunData(records=_records(50), instances=_instances(2, 10.0))
    paths = plot_runs(tmp_path, {"bare": data})
    _check_pngs(paths, tmp_path)
