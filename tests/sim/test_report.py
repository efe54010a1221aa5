from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from tokenplane.sim.progress import progress_bar
from tokenplane.sim.records import InstanceRecord, InstanceSample, RequestRecord, TbtHistogram
from tokenplane.sim.report import (
    WALL_CLOCK_FIELDS,
    Slo,
    build_run_report,
    goodput_timeline,
    percentile,
    print_summary,
    summary_table,
    write_report,
)

REQUIRED_KEYS = {
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
    "requests_total",
    "requests_failed",
    "ttft_mean_s",
    "ttft_p90_s",
    "tpot_mean_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "queue_p50_s",
    "queue_p99_s",
    "e2e_p99_s",
    "e2e_mean_s",
    "slo_attainment",
    "slo",
    "gpu_cost_usd",
    "gpu_hours",
    "cost_per_request_usd",
    "preemptions",
    "duration_s",
    "utilisation",
    "utilisation_max",
    "utilisation_mean",
    "kv_usage_mean",
    "failure_reasons",
    "route_reasons",
}


def ok_record(
    rid: int,
    *,
    arrival: float,
    ttft: float,
    decode: float,
    prompt: int = 100,
    output: int = 11,
    hit: int = 0,
    bound: int = 0,
    route: str = "prefix",
    preemptions: int = 0,
) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        tenant="t",
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=output,
        instance_id="i0",
        scheduled_s=arrival + ttft / 2,
        first_token_s=arrival + ttft,
        finish_s=arrival + ttft + decode,
        prefix_hit_tokens=hit,
        prefix_bound_tokens=bound,
        preemptions=preemptions,
        ok=True,
        reason="done",
        route_reason=route,
    )


def failed_record(rid: int, reason: str, *, route: str = "") -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        tenant="t",
        arrival_s=1.0,
        prompt_tokens=1000,
        output_tokens=50,
        prefix_hit_tokens=999,
        prefix_bound_tokens=999,
        ok=False,
        reason=reason,
        route_reason=route,
    )


def instances() -> list[InstanceRecord]:
    return [
        InstanceRecord(
            "i0",
            "H100",
            "m",
            price_per_hour=4.0,
            busy_s=1800.0,
            alive_s=3600.0,
            samples=[InstanceSample(1.0, 0.5, 0.2, 1, 0), InstanceSample(2.0, 0.7, 0.4, 2, 1)],
        ),
        InstanceRecord("i1", "A100", "m", price_per_hour=2.0, busy_s=900.0, alive_s=1800.0),
    ]


def four_records() -> list[RequestRecord]:
    # TTFTs 0.1, 0.2, 0.3, 4.0; TPOT = decode / 10.
    return [
        ok_record(0, arrival=0.0, ttft=0.1, decode=0.5, hit=50, bound=80, route="prefix"),  # tpot 0.05
        ok_record(1, arrival=1.0, ttft=0.2, decode=0.5, hit=0, bound=100, route="load"),  # tpot 0.05
        ok_record(2, arrival=2.0, ttft=0.3, decode=2.0, hit=100, bound=100, route="prefix"),  # tpot 0.2
        ok_record(3, arrival=3.0, ttft=4.0, decode=0.5, hit=0, bound=0, route="load", preemptions=2),
    ]


def hist() -> TbtHistogram:
    h = TbtHistogram()
    h.add(0.02, 90)
    h.add(0.5, 10)
    return h


def make_report(records: list[RequestRecord] | None = None, **kw: object) -> dict[str, object]:
    recs = (
        [*four_records(), failed_record(10, "timeout"), failed_record(11, "")] if records is None else records
    )
    kwargs: dict[str, object] = {"duration_s": 10.0, "wall_seconds": 0.5, "slo": Slo(ttft_s=2.0, tbt_s=0.1)}
    kwargs.update(kw)
    return build_run_report(recs, instances(), hist(), **kwargs)  # type: ignore[arg-type]


def test_percentile_rule_linear_interpolation() -> None:
    values = [0.1, 0.2, 0.3, 4.0]
    assert percentile(values, 50) == pytest.approx(0.25)
    # position 3 * 0.99 = 2.97 -> 0.3 + 0.97 * 3.7
    assert percentile(values, 99) == pytest.approx(0.3 + 0.97 * 3.7)
    assert percentile(values, 0) == 0.1
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12), min_size=1),
    st.floats(min_value=0, max_value=100),
    st.floats(min_value=0, max_value=100),
)
def test_percentile_monotone_and_bounded(values: list[float], q1: float, q2: float) -> None:
    values = sorted(values)
    lo, hi = sorted((q1, q2))
    p_lo = percentile(values, lo)
    p_hi = percentile(values, hi)
    assert p_lo is not None and p_hi is not None
    assert values[0] <= p_lo <= p_hi <= values[-1]


def test_report_has_all_keys_and_is_json() -> None:
    report = make_report()
    assert report.keys() >= REQUIRED_KEYS
    assert "wall_seconds" in WALL_CLOCK_FIELDS
    json.dumps(report, allow_nan=False)


def test_latency_and_throughput_hand_computed() -> None:
    report = make_report()
    assert report["requests_total"] == 6
    assert report["requests_completed"] == 4
    assert report["requests_failed"] == 2
    assert report["ttft_p50_s"] == pytest.approx(0.25)
    assert report["ttft_p99_s"] == pytest.approx(0.3 + 0.97 * 3.7)
    assert report["ttft_mean_s"] == pytest.approx((0.1 + 0.2 + 0.3 + 4.0) / 4)
    assert report["tpot_p50_s"] == pytest.approx(0.05)
    assert report["tpot_mean_s"] == pytest.approx((0.05 + 0.05 + 0.2 + 0.05) / 4)
    # e2e = ttft + decode: 0.6, 0.7, 2.3, 4.5
    assert report["e2e_p50_s"] == pytest.approx(1.5)
    assert report["queue_p50_s"] == pytest.approx(0.125)
    assert report["throughput_rps"] == pytest.approx(0.4)
    assert report["output_tokens_per_s"] == pytest.approx(4 * 11 / 10.0)
    assert report["preemptions"] == 2
    assert report["failure_reasons"] == {"timeout": 1, "unknown": 1}
    assert report["route_reasons"] == {"load": 2, "prefix": 2, "unrouted": 2}
    # Histogram: 90 % of the weight near 0.02 s, 10 % near 0.5 s (2 %-wide buckets).
    assert report["tbt_p50_s"] == pytest.approx(0.02, rel=0.02)
    assert report["tbt_p99_s"] == pytest.approx(0.5, rel=0.02)


def test_goodput_counts_only_slo_meeting_ok_requests() -> None:
    report = make_report()
    # Record 0 and 1 meet the SLO; 2 misses TPOT, 3 misses TTFT, failures never meet it.
    assert report["goodput_rps"] == pytest.approx(0.2)
    assert report["slo_met"] == 2
    assert report["slo_attainment"] == pytest.approx(2 / 6)
    assert report["slo"] == {"ttft_s": 2.0, "tbt_s": 0.1}
    loose = make_report(slo=Slo(ttft_s=10.0, tbt_s=1.0))
    assert loose["goodput_rps"] == pytest.approx(0.4)


def test_slo_single_token_request_has_no_tpot() -> None:
    r = ok_record(0, arrival=0.0, ttft=0.5, decode=0.0, output=1)
    assert r.tpot_s is None
    assert Slo().met(r)
    report = make_report([r])
    assert report["goodput_rps"] == pytest.approx(0.1)
    assert report["tpot_p50_s"] is None


def test_prefix_ratios_are_token_weighted_over_completed() -> None:
    recs = [
        ok_record(0, arrival=0.0, ttft=0.1, decode=0.1, prompt=100, hit=100, bound=100),
        ok_record(1, arrival=0.0, ttft=0.1, decode=0.1, prompt=900, hit=0, bound=450),
        failed_record(2, "rejected"),
    ]
    report = make_report(recs)
    assert report["prefix_hit_ratio"] == pytest.approx(100 / 1000)
    assert report["prefix_hit_bound"] == pytest.approx(550 / 1000)


def test_cost_from_two_instances() -> None:
    report = make_report()
    # i0: 1 h x $4, i1: 0.5 h x $2 -> $5 over 1.5 GPU-hours.
    assert report["gpu_cost_usd"] == pytest.approx(5.0)
    assert report["gpu_hours"] == pytest.approx(1.5)
    tokens = 4 * (100 + 11)
    assert report["cost_per_million_tokens"] == pytest.approx(5.0 / (tokens / 1e6))
    assert report["cost_per_request_usd"] == pytest.approx(5.0 / 4)
    assert report["utilisation"] == {"i0": 0.5, "i1": 0.5}
    assert report["utilisation_max"] == 0.5
    assert report["utilisation_mean"] == 0.5
    assert report["kv_usage_mean"] == {"i0": pytest.approx(0.3), "i1": None}


def test_empty_run_gives_nones_not_errors() -> None:
    report = build_run_report([], [], TbtHistogram(), duration_s=0.0, wall_seconds=0.0, slo=Slo())
    assert report["requests_total"] == 0
    for key in ("ttft_p50_s", "tbt_p99_s", "throughput_rps", "prefix_hit_ratio", "cost_per_million_tokens"):
        assert report[key] is None
    json.dumps(report, allow_nan=False)


def test_extra_and_timeline_merged() -> None:
    report = make_report(extra={"policy": "prefix", "seed": 7}, timeline_bucket_s=5.0)
    assert report["policy"] == "prefix"
    assert report["seed"] == 7
    # SLO-meeting finishes at 0.6 and 1.7 s -> bucket 0; duration 10 s -> two buckets.
    assert report["goodput_timeline"] == [[0.0, 0.4], [5.0, 0.0]]


def test_goodput_timeline_buckets() -> None:
    recs = four_records()
    points = goodput_timeline(recs, Slo(), bucket_s=1.0)
    assert points == [(0.0, 1.0), (1.0, 1.0)]
    loose = goodput_timeline(recs, Slo(ttft_s=10, tbt_s=1), bucket_s=1.0, duration_s=10.0)
    assert len(loose) == 10
    assert sum(g for _, g in loose) == 4.0
    with pytest.raises(ValueError):
        goodput_timeline(recs, Slo(), bucket_s=0.0)


def test_json_is_byte_identical_for_same_inputs(tmp_path: Path) -> None:
    runs_a = {"a": make_report(), "b": make_report(slo=Slo(ttft_s=1.0))}
    runs_b = {"b": make_report(slo=Slo(ttft_s=1.0)), "a": make_report()}
    path_a = write_report(tmp_path / "x", runs_a, scenario={"name": "s", "seed": 1})
    path_b = write_report(tmp_path / "y", runs_b, scenario={"seed": 1, "name": "s"})
    assert path_a.read_bytes() == path_b.read_bytes()
    # Record order does not change float sums either.
    shuffled = list(reversed(four_records()))
    assert json.dumps(make_report(shuffled), sort_keys=True) == json.dumps(
        make_report(four_records()), sort_keys=True
    )


def test_write_report_creates_folder(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "er"
    path = write_report(out, {"run": make_report()})
    assert path == out / "report.json"
    doc = json.loads(path.read_text())
    assert set(doc) == {"runs", "scenario"}
    assert doc["scenario"] is None
    assert doc["runs"]["run"]["requests_total"] == 6
    for field in WALL_CLOCK_FIELDS:
        doc["runs"]["run"].pop(field, None)


def test_summary_table_renders() -> None:
    runs = {
        "prefix": make_report(),
        "empty": build_run_report([], [], TbtHistogram(), duration_s=0.0, wall_seconds=0.0, slo=Slo()),
    }
    console = Console(file=io.StringIO(), width=250, record=True)
    console.print(summary_table(runs))
    text = console.export_text()
    assert "prefix" in text and "empty" in text
    assert "4/6" in text
    buf = io.StringIO()
    print_summary(runs, console=Console(file=buf, width=250))
    assert "TTFT p50" in buf.getvalue()


def test_large_report_is_fast() -> None:
    n = 200_000
    recs = [
        ok_record(i, arrival=i * 0.001, ttft=0.05 + (i % 97) * 0.001, decode=0.5, hit=i % 100, bound=100)
        for i in range(n)
    ]
    start = time.perf_counter()
    report = make_report(recs)
    elapsed = time.perf_counter() - start
    assert report["requests_completed"] == n
    assert elapsed < 3.0


def test_progress_bar_disabled_and_non_tty_are_noops() -> None:
    with progress_bar(100.0, enabled=False) as bar:
        bar.update(1.0)
    with progress_bar(100.0, enabled=True, console=Console(file=io.StringIO())) as bar:
        bar.update(1.0)


def test_progress_bar_on_terminal() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with progress_bar(100.0, enabled=True, console=console) as bar:
        for t in range(0, 101, 10):
            bar.update(float(t))
    assert "sim s" in buf.getvalue()
    with progress_bar(None, enabled=True, console=console) as bar:
        bar.update(5.0)
