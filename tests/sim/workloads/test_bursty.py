"""The bursty (MMPP-2) generator: the configured inter-arrival CV and mean rate, several-fold bursts,
replayable streams, and the factory's ``type: bursty``."""

from __future__ import annotations

import itertools
import statistics

import pytest

from tokenplane.sim.workloads.bursty import BurstyWorkload, mmpp_cv, solve_mmpp
from tokenplane.sim.workloads.factory import WorkloadConfigError, build_workload


@pytest.mark.parametrize("cv", [2.0, 4.0, 10.0])
def test_solved_shape_has_the_configured_cv_mean_and_peak(cv: float) -> None:
    shape = solve_mmpp(20.0, cv, peak_ratio=4.0, burst_s=60.0)
    assert mmpp_cv(shape) == pytest.approx(cv, rel=1e-6)
    assert shape.mean_rps == pytest.approx(20.0, rel=1e-9)
    assert shape.high_rps == pytest.approx(80.0)
    assert shape.high_dwell_s == pytest.approx(60.0)
    assert 0.0 <= shape.low_rps < 20.0


def test_on_off_limit_and_poisson_limit() -> None:
    # CV 1 is Poisson: the high state is (almost) never visited, the low rate is the mean.
    poisson = solve_mmpp(10.0, 1.0, peak_ratio=3.0, burst_s=30.0)
    assert poisson.low_rps == pytest.approx(10.0, rel=1e-3)
    with pytest.raises(ValueError, match="out of reach"):
        solve_mmpp(10.0, 1e6, peak_ratio=3.0, burst_s=30.0)
    with pytest.raises(ValueError, match="cv >= 1"):
        solve_mmpp(10.0, 0.5, peak_ratio=3.0, burst_s=30.0)


@pytest.mark.parametrize("cv", [3.0, 6.0])
def test_generated_cv_matches_the_configured_one_over_a_long_run(cv: float) -> None:
    # Short bursts (2 s) so that 200k arrivals span thousands of high/low cycles.
    w = BurstyWorkload(rate_rps=50.0, cv=cv, peak_ratio=4.0, burst_s=2.0, seed=7)
    times = list(itertools.islice(w.arrival_times(), 200_000))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean = statistics.fmean(gaps)
    assert statistics.pstdev(gaps) / mean == pytest.approx(cv, rel=0.1)
    assert 1.0 / mean == pytest.approx(50.0, rel=0.1)


def test_bursts_are_several_fold_and_minutes_long() -> None:
    w = BurstyWorkload(rate_rps=10.0, cv=4.0, peak_ratio=4.0, burst_s=120.0, duration_s=4 * 3600, seed=3)
    counts: dict[int, int] = {}
    for spec in w.arrivals():
        counts[int(spec.arrival_s // 60)] = counts.get(int(spec.arrival_s // 60), 0) + 1
    per_min = [counts.get(k, 0) / 60 for k in range(240)]
    busy = sorted(per_min)[-24:]  # the busiest tenth of the minutes
    assert min(busy) > 2.5 * statistics.fmean(per_min)
    assert max(per_min) < 6 * 10.0


def test_replayable_and_bounded() -> None:
    a = list(BurstyWorkload(rate_rps=5.0, cv=3.0, num_requests=500, seed=1).arrivals())
    b = list(BurstyWorkload(rate_rps=5.0, cv=3.0, num_requests=500, seed=1).arrivals())
    c = list(BurstyWorkload(rate_rps=5.0, cv=3.0, num_requests=500, seed=2).arrivals())
    assert a == b and a != c and len(a) == 500
    assert [s.request_id for s in a] == list(range(500))
    assert all(x.arrival_s <= y.arrival_s for x, y in itertools.pairwise(a))
    d = list(BurstyWorkload(rate_rps=5.0, cv=3.0, duration_s=300.0, seed=1).arrivals())
    assert d and all(s.arrival_s <= 300.0 for s in d)


def test_factory_builds_bursty_and_names_bad_fields() -> None:
    w = build_workload(
        {"type": "bursty", "rate_rps": 8, "cv": 5, "burst_s": 30, "num_requests": 50, "output": 64},
        traces=None,
        seed=4,
    )
    specs = list(w.arrivals())
    assert len(specs) == 50 and all(s.output_tokens == 64 for s in specs)
    with pytest.raises(WorkloadConfigError, match=r"bursty\.cv"):
        build_workload({"type": "bursty", "rate_rps": 8, "cv": 0.5}, traces=None, seed=1)
    with pytest.raises(WorkloadConfigError, match="out of reach"):
        build_workload({"type": "bursty", "rate_rps": 8, "cv": 1e5, "burst_s": 1}, traces=None, seed=1)
