"""Holt forecast and the online capacity estimator, on small hand-checked series."""

from __future__ import annotations

import pytest

from tokenplane.core.autoscale import CapacityEstimate, holt_forecast


def series(rates: list[float], bucket_s: float = 10.0) -> list[tuple[float, float]]:
    return [(i * bucket_s, r) for i, r in enumerate(rates)]


def test_empty_and_single() -> None:
    assert holt_forecast([], horizon_s=60).upper_rps == 0.0
    one = holt_forecast(series([5.0]), horizon_s=60)
    assert (one.level_rps, one.peak_rps, one.margin_rps, one.bucket_s) == (5.0, 5.0, 0.0, 0.0)


def test_constant_series_has_no_trend_or_margin() -> None:
    fc = holt_forecast(series([8.0] * 30), horizon_s=120)
    assert fc.level_rps == pytest.approx(8.0)
    assert fc.trend_rps_per_bucket == pytest.approx(0.0)
    assert fc.upper_rps == pytest.approx(8.0)
    assert fc.bucket_s == 10.0


def test_ramp_is_extrapolated_over_the_horizon_but_damped() -> None:
    fc = holt_forecast(series([float(i) for i in range(30)]), horizon_s=120)  # +1 req/s per bucket
    assert fc.point_rps > 29.0  # ahead of the last bucket
    # Damped: the trend adds at most trend × φ/(1 − φ) = 9 buckets of slope, not 12.
    assert fc.point_rps < fc.level_rps + 9.0 * fc.trend_rps_per_bucket + 1e-9
    assert fc.peak_rps == pytest.approx(fc.point_rps)


def test_falling_series_sizes_for_today_not_the_trough() -> None:
    fc = holt_forecast(series([float(30 - i) for i in range(30)]), horizon_s=300)
    assert fc.point_rps < fc.level_rps
    assert fc.peak_rps == pytest.approx(fc.level_rps)


def test_noise_widens_the_burst_margin() -> None:
    calm = holt_forecast(series([10.0, 10.5] * 15), horizon_s=60, burst_k=2.0)
    noisy = holt_forecast(series([5.0, 15.0] * 15), horizon_s=60, burst_k=2.0)
    assert noisy.margin_rps > 5 * calm.margin_rps
    assert noisy.upper_rps > noisy.peak_rps


def test_step_is_tracked_within_a_few_buckets() -> None:
    fc = holt_forecast(series([4.0] * 20 + [20.0] * 4), horizon_s=30)
    assert fc.level_rps > 18.0


def test_capacity_estimator() -> None:
    est = CapacityEstimate()
    assert est.get(2.0) == 2.0  # the prior until learned
    # Not saturated and below the estimate: tells nothing.
    assert est.observe(1.0, saturated=False, prior=2.0) is est
    # Not saturated but above: a measurement (weighed against the prior's weight of 2, decayed).
    assert est.observe(3.0, saturated=False, prior=2.0).get(2.0) == pytest.approx(6.2 / 2.6)
    # Saturated: a measurement; with rate 1 the prior is forgotten at once.
    assert est.observe(1.0, saturated=True, prior=2.0, rate=1.0).get(2.0) == pytest.approx(1.0)
    # Bounded to [prior / bound, prior × bound].
    assert est.observe(100.0, saturated=True, prior=2.0, rate=1.0, bound=4.0).get(2.0, bound=4.0) == 8.0
    assert est.observe(0.01, saturated=True, prior=2.0, rate=1.0, bound=4.0).get(2.0, bound=4.0) == 0.5
    # Garbage is ignored.
    assert est.observe(float("nan"), saturated=True, prior=2.0) is est
