"""Prefill/decode disaggregation in the twin: transfer timing, KV-gated decode admission, failures
on both sides, and the example scenario (a short version)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.disagg import LINK_PRESETS, LinkSettings, transfer_seconds
from tokenplane.sim.disagg_report import comparisons, summary_lines
from tokenplane.sim.runner import run_scenario, simulate
from tokenplane.sim.scenario import ScenarioError, parse_scenario
from tokenplane.sim.workloads.base import RequestSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "disaggregation.yaml"
CATALOG = Catalog.default()
KV_BYTES = CATALOG.model("llama-3-8b").kv_bytes_per_token


def _doc(link: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "pd-test",
        "seed": 1,
        "fleet": {
            "gpu": "H100",
            "model": "llama-3-8b",
            "groups": [
                {"name": "prefill", "instances": 2, "role": "prefill"},
                {"name": "decode", "instances": 2, "role": "decode"},
            ],
        },
        "workload": {"type": "synthetic", "rate_rps": 5, "num_requests": 5},
        "disaggregation": {"pair": "pd-pair", "link": link or {}},
        "runs": [{"name": "pd"}],
    }
    doc.update(extra)
    return doc


def _run(
    specs: list[RequestSpec], fakes: SimpleNamespace, link: dict[str, Any] | None = None, **extra: Any
) -> Any:
    run = parse_scenario(_doc(link, **extra)).runs[0]
    wl = fakes.ListWorkload(specs)
    result = simulate(run, catalog=CATALOG, workload=wl)
    return result


def test_transfer_time_is_bytes_over_bandwidth_plus_latency() -> None:
    link = LinkSettings(bandwidth_gb_per_s=25.0, latency_s=0.002)
    assert transfer_seconds(10_000, 131072, link) == 10_000 * 131072 / 25e9 + 0.002
    ib = LinkSettings()
    assert (ib.bandwidth, ib.latency) == (
        LINK_PRESETS["infiniband-ndr"][0] * 1e9,
        LINK_PRESETS["infiniband-ndr"][1],
    )
    own = LinkSettings(preset="nvlink-h100", latency_s=0.0)
    assert (own.bandwidth, own.latency) == (450e9, 0.0)
    with pytest.raises(ValueError, match="unknown link preset"):
        LinkSettings(preset="carrier-pigeon")


def test_ttft_moves_by_exactly_the_transfer_time(fakes: SimpleNamespace) -> None:
    """The decode instance gets the request only when its KV has arrived: TTFT grows by exactly the
    change in transfer time, everything else being equal."""
    prompt = 8000
    specs = [RequestSpec(0, 0.0, prompt, 20)]
    ttft = {}
    for bw, lat in ((50.0, 0.0), (50.0, 0.5), (5.0, 0.5)):
        (rec,) = _run(specs, fakes, {"bandwidth_gb_per_s": bw, "latency_s": lat}).records
        assert rec.ok
        ttft[(bw, lat)] = rec.first_token_s - rec.arrival_s
    assert ttft[(50.0, 0.5)] - ttft[(50.0, 0.0)] == pytest.approx(0.5, rel=1e-9)
    extra = prompt * KV_BYTES * (1 / 5e9 - 1 / 50e9)
    assert ttft[(5.0, 0.5)] - ttft[(50.0, 0.5)] == pytest.approx(extra, rel=1e-9)
    # and the transfer happens after the prefill: TTFT exceeds the transfer alone
    assert ttft[(5.0, 0.5)] > transfer_seconds(
        prompt, KV_BYTES, LinkSettings(bandwidth_gb_per_s=5.0, latency_s=0.5)
    )


def test_decode_admission_waits_for_free_kv(fakes: SimpleNamespace) -> None:
    """One decode instance whose KV holds one prompt at a time: the second request's KV cannot be
    moved until the first has finished and freed its blocks."""
    fleet = {
        "gpu": "H100",
        "model": "llama-3-8b",
        "groups": [
            {"name": "prefill", "instances": 2, "role": "prefill"},
            {"name": "decode", "instances": 1, "role": "decode", "engine": {"kv_capacity_tokens": 6000}},
        ],
    }
    specs = [RequestSpec(0, 0.0, 4000, 50), RequestSpec(1, 0.0, 4000, 50)]
    result = _run(specs, fakes, fleet=fleet)
    a, b = sorted(result.records, key=lambda r: r.first_token_s)
    assert a.ok and b.ok
    assert b.first_token_s > a.finish_s  # gated until the first one's blocks were freed
    assert result.extra["disaggregation"]["kv_waits"] == 1
    assert result.extra["disaggregation"]["kv_transfers"] == 2


def _faulted(fakes: SimpleNamespace, faults: list[dict[str, Any]]) -> Any:
    specs = [RequestSpec(i, i * 0.005, 3000 + 100 * i, 400) for i in range(40)]
    return _run(specs, fakes, faults=faults)


@pytest.mark.parametrize(
    ("fault", "counter"),
    [
        ({"kind": "lose", "instance": 0, "at_s": 0.3, "replace_after_s": 5.0}, "reprefills_prefill_lost"),
        ({"kind": "lose", "instance": 2, "at_s": 2.0, "replace_after_s": 5.0}, "decode_lost_continued"),
        ({"kind": "lose", "instance": 3, "at_s": 0.5}, "decode_lost_continued"),
    ],
)
def test_failures_on_either_side_lose_no_request(
    fakes: SimpleNamespace, fault: dict[str, Any], counter: str
) -> None:
    result = _faulted(fakes, [fault])
    assert len(result.records) == 40
    assert all(r.ok for r in result.records), [r.reason for r in result.records if not r.ok]
    pd = result.extra["disaggregation"]
    assert pd[counter] > 0
    assert sum(r.preemptions for r in result.records) >= 0
    clean = _faulted(fakes, [])
    assert clean.extra["disaggregation"][counter] == 0
    if counter == "decode_lost_continued":
        # the continued streams were interrupted and resumed: more transfers than requests
        assert pd["kv_transfers"] > 40
        assert any(r.interrupted for r in result.records)


def test_roles_and_disaggregation_go_together() -> None:
    with pytest.raises(ScenarioError, match="need the run's disaggregation"):
        parse_scenario(_doc(disaggregation=None))
    doc = _doc()
    doc["fleet"] = {"instances": 4}
    with pytest.raises(ScenarioError, match="role prefill and role decode"):
        parse_scenario(doc)
    with pytest.raises(ScenarioError, match="pd-nope"):
        parse_scenario(_doc(disaggregation={"pair": "pd-nope"}))


def _short_example() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["workload"]["num_requests"] = 150
    for run in doc["runs"]:
        if "num_requests" in run.get("workload", {}):
            run["workload"] = {**run["workload"], "num_requests": 800}
    return doc


def test_example_short_version_shows_where_disaggregation_wins() -> None:
    sc = parse_scenario(_short_example(), source=str(EXAMPLE))
    names = [r.name for r in sc.runs]
    assert names[:4] == ["colocated-long", "disaggregated-long", "colocated-short", "disaggregated-short"]
    sc = sc.model_copy(update={"runs": sc.runs[:4]})
    reports = {name: o.report for name, o in run_scenario(sc).items()}
    for name, rep in reports.items():
        assert rep["requests_failed"] == 0, name
        assert rep["cost_per_slo_met_usd"] is not None
        # every instance's bill, the prefill pool's included, is split over the legs it ran
        assert abs(rep["economics"]["unattributed_cost_usd"]) < 1e-9 * rep["gpu_cost_usd"]
    cmp = comparisons(reports)
    assert set(cmp) == {"long", "short"}
    for c in cmp.values():
        assert c["gpus"]["colocated"] == c["gpus"]["disaggregated"] == 8
    # physics: no prefill chunks in decode batches, so long prompts no longer stretch decode steps
    assert cmp["long"]["tbt_p99_s"]["winner"] == "disaggregated"
    assert cmp["long"]["tbt_p99_s"]["factor"] > 2
    lines = summary_lines(reports)
    assert len(lines) == 2 and lines[0].startswith("long: 8 vs 8 GPUs (equal GPUs)")
    assert "TBT p99" in lines[0] and "disaggregated wins" in lines[0]


def test_decode_lost_with_requests_gated_for_it_sends_their_kv_elsewhere(fakes: SimpleNamespace) -> None:
    small = {"kv_capacity_tokens": 6000}
    fleet = {
        "gpu": "H100",
        "model": "llama-3-8b",
        "groups": [
            {"name": "prefill", "instances": 2, "role": "prefill"},
            {"name": "decode", "instances": 2, "role": "decode", "engine": small},
        ],
    }
    specs = [RequestSpec(i, 0.0, 4000, 200) for i in range(6)]
    lose = {"kind": "lose", "instance": 2, "at_s": 1.0, "replace_after_s": 0.5}
    result = _run(specs, fakes, fleet=fleet, faults=[lose])
    assert all(r.ok for r in result.records) and len(result.records) == 6
    pd = result.extra["disaggregation"]
    assert pd["kv_waits"] > 0 and pd["retransfers"] > 0 and pd["decode_lost_continued"] > 0


def test_disaggregation_refuses_what_it_does_not_model(fakes: SimpleNamespace) -> None:
    with pytest.raises(ValueError, match="drain"):
        _run([RequestSpec(0, 0.0, 100, 5)], fakes, faults=[{"kind": "drain", "instance": 0, "at_s": 1.0}])
    with pytest.raises(ValueError, match="admission"):
        _run([RequestSpec(0, 0.0, 100, 5)], fakes, admission={})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.floats(0.0, 3.0), st.sampled_from([0.2, 1.0, None])),
        min_size=1,
        max_size=3,
    )
)
def test_any_losses_on_either_side_end_every_request_exactly_once(
    fakes: SimpleNamespace, losses: list[tuple[int, float, float | None]]
) -> None:
    """Whatever instances die when, each request ends once: ok while a pair is left, else failed
    with a reason; never lost, never finished twice."""
    faults = [{"kind": "lose", "instance": i, "at_s": t, "replace_after_s": r} for i, t, r in losses]
    specs = [RequestSpec(i, i * 0.01, 2000 + 50 * i, 100) for i in range(20)]
    wl = fakes.ListWorkload(specs)
    run = parse_scenario(_doc(faults=faults)).runs[0]
    result = simulate(run, catalog=CATALOG, workload=wl)
    assert sorted(r.request_id for r in result.records) == list(range(20))
    assert sorted(rid for rid, _, _ in wl.finished) == list(range(20))  # one end each
    for r in result.records:
        assert r.ok or r.reason == "no_instance"
        if r.ok:
            assert r.first_token_s is not None and r.finish_s is not None and r.finish_s >= r.first_token_s
    # an instance is down for good if its last event (losses first at equal times, as scheduled)
    # is a loss without replacement
    events = sorted(
        [(t, 0, i, r is not None) for i, t, r in losses]
        + [(t + r, 1, i, False) for i, t, r in losses if r is not None]
    )
    up = {i: True for i in range(4)}
    pending = {i: 0 for i in range(4)}  # replacements on their way
    stranded = False  # a side with no instance up and none on its way: what arrives then fails
    for _, kind, i, replaced in events:
        up[i] = kind == 1
        if kind == 1:
            pending[i] -= 1
        else:
            pending[i] += replaced
            side = (0, 1) if i < 2 else (2, 3)
            stranded |= not any(up[j] or pending[j] > 0 for j in side)
    if (up[0] or up[1]) and (up[2] or up[3]) and not stranded:  # a pair throughout: nobody fails
        assert all(r.ok for r in result.records), [
            (r.request_id, r.reason) for r in result.records if not r.ok
        ]
