"""Streamed records: bounded memory, the same report as kept records, sketches within their stated error."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.records import Distribution, LogHistogram, RecordStream, RequestRecord
from tokenplane.sim.report import WALL_CLOCK_FIELDS, RunAggregate, Slo, build_run_report, percentile
from tokenplane.sim.runner import run_scenario, simulate
from tokenplane.sim.scenario import parse_scenario
from tokenplane.sim.workloads.factory import build_workload

SCENARIO: dict[str, Any] = {
    "name": "stream",
    "seed": 4,
    "fleet": {"instances": 3, "gpu": "H100", "model": "llama-3-8b"},
    "workload": {
        "type": "synthetic",
        "rate_rps": 40,
        "num_requests": 2000,
        "prompt": {"kind": "lognormal", "mean": 600, "cv": 1.0, "min": 1, "max": 8000},
        "output": {"kind": "lognormal", "mean": 80, "cv": 1.0, "min": 1, "max": 1000},
    },
    "slo": {"ttft_s": 0.5, "tbt_s": 0.05},
    "runs": [{"name": "lr", "router": "least-requests"}],
}
# What a streamed run leaves out (it needs every record at the end) and the wall clock.
LEFT_OUT = {"economics", "records", *WALL_CLOCK_FIELDS}


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in LEFT_OUT and not k.startswith(("cost_", "waste"))}


def test_a_streamed_run_reports_exactly_what_a_kept_run_reports() -> None:
    sc = parse_scenario(SCENARIO)
    kept = run_scenario(sc)["lr"]
    streamed = run_scenario(sc, stream_records=True)["lr"]
    assert streamed.result.records == [] and streamed.report["records"] == "streamed"
    assert streamed.report["requests_total"] == 2000
    a, b = _comparable(kept.report), _comparable(streamed.report)
    # only the per-request cost attribution (tasks, cost per task) is left out
    assert set(a) - set(b) <= {"tasks_completed", "tasks_failed", "tasks_abandoned_midway", "tasks_open"} | {
        "task_cost_usd",
        "success_per_dollar",
    }
    assert set(b) <= set(a)
    assert json.dumps(b, sort_keys=True) == json.dumps({k: a[k] for k in b}, sort_keys=True)


def test_past_the_exact_limit_percentiles_are_within_half_a_percent_and_records_go_to_a_file() -> None:
    sc = parse_scenario(SCENARIO)
    run = sc.runs[0]
    cat = Catalog.default()
    slo = Slo(ttft_s=0.5, tbt_s=0.05)
    kept = simulate(run, catalog=cat, workload=build_workload(run.workload, traces=None, seed=run.seed))
    exact = build_run_report(
        kept.records, kept.instances, kept.tbt, duration_s=kept.duration_s, wall_seconds=1, slo=slo
    )
    agg = RunAggregate(slo, exact_limit=100)
    out = io.BytesIO()
    res = simulate(
        run,
        catalog=cat,
        workload=build_workload(run.workload, traces=None, seed=run.seed),
        aggregate=agg,
        records_out=out,
    )
    sketch = build_run_report(
        [], res.instances, res.tbt, duration_s=res.duration_s, wall_seconds=1, slo=slo, aggregate=agg
    )
    assert not agg.exact and sketch["percentiles"].startswith("log-bucketed")
    for key in ("requests_total", "requests_completed", "slo_met", "prompt_tokens", "output_tokens"):
        assert sketch[key] == exact[key], key
    for key in (
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p90_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "queue_p99_s",
    ):
        assert math.isclose(sketch[key], exact[key], rel_tol=0.02, abs_tol=1e-9), (
            key,
            sketch[key],
            exact[key],
        )
    for key in ("ttft_mean_s", "e2e_mean_s"):
        assert math.isclose(sketch[key], exact[key], rel_tol=1e-9), key
    lines = out.getvalue().splitlines()
    assert len(lines) == 2000
    decoded = [msgspec.json.decode(line, type=RequestRecord) for line in lines]
    assert sorted(r.request_id for r in decoded) == list(range(2000))
    assert sum(r.ok for r in decoded) == exact["requests_completed"]


def test_the_stream_holds_only_records_in_flight() -> None:
    handed: list[int] = []
    stream = RecordStream(lambda batch: handed.extend(r.request_id for r in batch), batch=8)
    open_max = 0
    records: list[RequestRecord] = []
    for i in range(100):
        records.append(RequestRecord(i, "t", float(i), 10, 5))
        stream.append(records[-1])
        if i >= 3:  # three requests in flight at a time: the one that arrived three before is done
            records[i - 3].ok = True
        open_max = max(open_max, sum(1 for _ in stream))
    stream.close()
    assert len(stream) == 100 and sorted(handed) == list(range(100))
    assert open_max <= 8


values = st.lists(st.floats(1e-4, 1e4, allow_nan=False), min_size=1, max_size=300)


@settings(max_examples=60)
@given(values, st.floats(0, 100))
def test_sketch_percentile_is_within_half_a_percent_of_the_lower_rank(xs: list[float], q: float) -> None:
    d = Distribution(limit=0)
    d.extend(xs)
    assert not d.exact and len(d) == len(xs)
    s = sorted(xs)
    lower = s[math.floor((len(s) - 1) * q / 100)]
    got = d.percentile(q)
    assert got is not None and abs(got - lower) <= 0.00502 * lower
    assert s[0] <= got <= s[-1]


@given(values)
def test_exact_distribution_is_the_report_percentile(xs: list[float]) -> None:
    d = Distribution()
    d.extend(xs)
    assert d.exact and d.percentile(90) == percentile(sorted(xs), 90)


@given(values, values)
def test_log_histograms_merge(xs: list[float], ys: list[float]) -> None:
    a, b, both = LogHistogram(), LogHistogram(), LogHistogram()
    for x in xs:
        a.add(x)
        both.add(x)
    for y in ys:
        b.add(y)
        both.add(y)
    a.merge(b)
    assert a == both
