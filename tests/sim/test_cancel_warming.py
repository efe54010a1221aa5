"""The twin cancels warming instances (``cancel_warming``): a cancelled instance never served a
request while it warmed, never lands, and stops costing at the cancel."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.fleet import FleetResult
from tokenplane.sim.lifecycle import STOPPED, WARM, WARMING
from tokenplane.sim.runner import simulate
from tokenplane.sim.scenario import parse_scenario
from tokenplane.sim.workloads.base import RequestSpec

COLD_S = 120.0


class Phases:
    """Constant-rate phases ``(duration_s, rate_rps)``, deterministic spacing, short requests."""

    name = "phases"

    def __init__(self, phases: Sequence[tuple[float, float]]) -> None:
        self.phases = phases

    def arrivals(self) -> Iterator[RequestSpec]:
        t0, rid = 0.0, 0
        for duration, rate in self.phases:
            for k in range(int(duration * rate)):
                yield RequestSpec(rid, t0 + k / rate, 100, 30)
                rid += 1
            t0 += duration

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()


def _run(phases: Sequence[tuple[float, float]], *, cancel: bool) -> FleetResult:
    doc: dict[str, Any] = {
        "name": "cancel-warming",
        "seed": 1,
        "router": "least-requests",
        "fleet": {
            "instances": 8,
            "gpu": "H100",
            "model": "llama-3-8b",
            "engine": {"max_num_seqs": 4},
            "lifecycle": {"cold_start_s": COLD_S, "warm_activation_s": 2.0},
        },
        "workload": {"type": "synthetic", "rate_rps": 1, "num_requests": 1},
        "slo": {"ttft_s": 2.0, "tbt_s": 0.5},
        "autoscaler": {
            "name": "tokenplane",
            "params": {"window_from_cold_start": True, "burst_k": 0.0, "cancel_warming": cancel},
            "pool": {"capacity_rps": 8.0, "min_instances": 1},
            "initial_serving": 1,
        },
    }
    (run,) = parse_scenario(doc).runs
    return simulate(run, catalog=Catalog.default(), workload=Phases(phases))


def _cancelled(result: FleetResult) -> list[tuple[str, float, float]]:
    """(instance, warming since, cancelled at) for every warming -> stopped transition."""
    out = []
    state: dict[str, tuple[str, float]] = {}
    for t, iid, s in result.lifecycle.transitions:
        prev = state.get(iid)
        if prev is not None and prev[0] == WARMING and s == STOPPED:
            out.append((iid, prev[1], t))
        state[iid] = (s, t)
    return out


def _held_s(result: FleetResult, iid: str, end: float) -> float:
    """Seconds ``iid`` held a GPU up to ``end``, from its transitions: every state but stopped (an
    interval still open, or closed by a decision after the run's end, is counted to ``end``)."""
    held, since = 0.0, None
    for t, i, s in result.lifecycle.transitions:
        if i != iid:
            continue
        if s == STOPPED and since is not None:
            held, since = held + max(0.0, min(t, end) - since), None
        elif s != STOPPED and since is None:
            since = t
    return held + (max(0.0, end - since) if since is not None else 0.0)


SPIKE = [(120.0, 2.0), (45.0, 40.0), (300.0, 2.0)]


def test_a_spike_shorter_than_a_cold_start_has_its_cold_starts_cancelled() -> None:
    kept = _run(SPIKE, cancel=False)
    cut = _run(SPIKE, cancel=True)
    assert kept.extra["scale_actions"].get("start_cold", 0) >= 1
    assert not _cancelled(kept)
    assert cut.extra["scale_actions"].get("cancel_warming", 0) >= 1
    assert len(_cancelled(cut)) == cut.extra["scale_actions"]["cancel_warming"]
    assert sum(i.alive_s for i in cut.instances) < sum(i.alive_s for i in kept.instances)
    assert all(r.ok for r in cut.records)


@settings(max_examples=10, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(
    base=st.floats(0.5, 4.0),
    peak=st.floats(10.0, 60.0),
    spike_s=st.floats(15.0, 200.0),
    gap_s=st.floats(0.0, 200.0),
)
def test_a_cancelled_warming_instance_never_served_and_stopped_costing(
    base: float, peak: float, spike_s: float, gap_s: float
) -> None:
    phases = [(90.0, base), (spike_s, peak), (gap_s, base), (spike_s, peak), (240.0, base)]
    result = _run(phases, cancel=True)
    end = result.duration_s
    by_id = {i.instance_id: i for i in result.instances}
    for iid, since, at in _cancelled(result):
        # Never ready while warming: no request reached it in that span.
        assert not [r for r in result.records if r.instance_id == iid and since <= r.arrival_s <= at]
        # It never landed from that cold start: the next transition of iid (if any) is a new one.
        after = [s for t, i, s in result.lifecycle.transitions if i == iid and t >= at]
        assert after[0] == STOPPED and WARM not in after[1:2]
        assert after[1:2] in ([], [WARMING])
    for iid, inst in by_id.items():
        # Cost is the time holding a GPU: nothing is charged between a cancel and a new start.
        assert abs(inst.alive_s - _held_s(result, iid, end)) < 1e-6
    assert all(r.ok for r in result.records)
