"""The self-contained HTML report: runs, embedded plots, nothing fetched from elsewhere."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from tokenplane.sim.html_report import write_html_report
from tokenplane.sim.plots import RunData, plot_runs
from tokenplane.sim.records import InstanceRecord, InstanceSample, RequestRecord, TbtHistogram
from tokenplane.sim.report import Slo, build_run_report


def _records(n: int, shift: float) -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=i,
            tenant="t",
            arrival_s=i * 0.1,
            prompt_tokens=100,
            output_tokens=10,
            instance_id=f"i{i % 2}",
            scheduled_s=i * 0.1 + 0.01,
            first_token_s=i * 0.1 + shift + (i % 7) * 0.02,
            finish_s=i * 0.1 + shift + 0.5,
            ok=i % 9 != 0,
            reason="done" if i % 9 else "timeout",
            route_reason="prefix",
        )
        for i in range(n)
    ]


def _instances(duration: int) -> list[InstanceRecord]:
    return [
        InstanceRecord(
            f"i{k}",
            "H100",
            "m",
            3.0,
            busy_s=duration / 2,
            alive_s=duration,
            samples=[
                InstanceSample(t_s=float(t), busy_fraction=0.5, kv_usage=0.3, running=1, waiting=0)
                for t in range(duration)
            ],
        )
        for k in range(2)
    ]


def _run(shift: float) -> tuple[RunData, dict]:
    records, instances = _records(120, shift), _instances(13)
    report = build_run_report(
        records,
        instances,
        TbtHistogram(),
        duration_s=13.0,
        wall_seconds=0.1,
        slo=Slo(),
        extra={"gpu_hours": 0.5},
    )
    return RunData(records, instances, report), report


def test_self_contained_report(tmp_path: Path) -> None:
    data, runs = {}, {}
    for name, shift in (("static-peak", 0.05), ("hpa", 0.3), ("tokenplane", 0.1)):
        data[name], runs[name] = _run(shift)
    images = plot_runs(tmp_path / "plots", data)
    assert images

    path = write_html_report(
        tmp_path, runs, images, scenario={"name": "autoscale-servegen", "source": "x.yaml"}
    )
    assert path == tmp_path / "report.html" and path.is_file()
    text = path.read_text(encoding="utf-8")

    assert "autoscale-servegen" in text
    for name in runs:
        assert name in text
    assert text.count("data:image/png;base64,") == len(images)
    for image in images:  # each PNG embedded byte for byte
        assert base64.b64encode(image.read_bytes()).decode("ascii") in text
    assert "http://" not in text and "https://" not in text
    assert not re.search(r"<(script|link|iframe)\b", text, re.I)
    assert not re.search(r'\bsrc="(?!data:)', text)
    # Summary table: headline fields, formatted.
    assert "TTFT p99" in text and "GPU-hours" in text and "0.50" in text
    assert f"{runs['hpa']['ttft_p99_s'] * 1000:.1f} ms" in text


def test_escapes_and_skips_non_png(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.png"
    bogus.write_text("not a png")
    runs = {"<b>run</b>": {"requests_total": 3, "fleet_timeline": [[0, 1, 0], [60, 2, 1]]}}
    path = write_html_report(tmp_path / "out", runs, [bogus, tmp_path / "missing.png"], scenario="s & t")
    text = path.read_text(encoding="utf-8")
    assert "&lt;b&gt;run&lt;/b&gt;" in text and "<b>run</b>" not in text
    assert "s &amp; t" in text
    assert "data:image/png" not in text
    assert "2 items" in text  # a list field summarised by its size
