"""Short-horizon demand forecast: damped Holt (double exponential smoothing) plus a burst margin.

Input: per-bucket arrival rates ``(bucket_start_s, rps)``, oldest first, evenly spaced, complete
buckets only. The bucket width is the median spacing of the samples.

Algorithm (Gardner's damped-trend Holt), one pass over the samples::

    level_0 = x_0, trend_0 = 0
    ŷ_t     = level_{t-1} + φ·trend_{t-1}                  (one-step-ahead forecast)
    level_t = α·x_t + (1 − α)·ŷ_t
    trend_t = β·(level_t − level_{t-1}) + (1 − β)·φ·trend_{t-1}
    f(h)    = level + trend·(φ + φ² + … + φ^h)              (h buckets ahead)

``peak_rps`` is the largest ``f(h)`` over ``h ∈ [0, horizon]`` (the level itself when the trend
is falling: capacity sized now must still serve today's demand), and ``margin_rps`` is
``burst_k`` times a robust standard deviation (1.4826 × median absolute value) of the one-step-ahead
errors over the last ``error_window`` buckets: a burst allowance that tracks how noisy the pool's
traffic actually is, and that one step change does not inflate for the whole window.
``upper_rps`` = peak + margin is what the scaler sizes for.

Params: ``alpha`` (level smoothing, 0.5), ``beta`` (trend smoothing, 0.3), ``phi`` (trend damping,
0.9: the trend's total contribution is bounded by φ/(1−φ) = 9 buckets of slope, so a short ramp is
not extrapolated for ever), ``burst_k`` (1.5), ``error_window`` (30 buckets).

Cost: O(samples) per call, no allocation beyond the result; the shell keeps the history bounded.

How it fails: a step change is tracked within a few buckets (α = 0.5 halves the gap each bucket),
not anticipated; the first buckets of a burst look like noise, which is why the warm pool exists.
Periodic (diurnal) structure is not modelled: over a cold-start horizon of minutes, the trend term
carries it. Poisson noise at low rates inflates the margin (relative noise ~ 1/sqrt(rate × bucket)).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import msgspec

from tokenplane.core.autoscale.signals import RateSample

DEFAULT_ALPHA = 0.5
DEFAULT_BETA = 0.3
DEFAULT_PHI = 0.9
DEFAULT_BURST_K = 1.5
DEFAULT_ERROR_WINDOW = 30


class Forecast(msgspec.Struct, frozen=True):
    level_rps: float = 0.0
    trend_rps_per_bucket: float = 0.0
    bucket_s: float = 0.0
    horizon_s: float = 0.0
    point_rps: float = 0.0  # f(horizon)
    peak_rps: float = 0.0  # max f(h) over [0, horizon]
    margin_rps: float = 0.0  # burst_k × robust sigma of one-step errors
    samples: int = 0

    @property
    def upper_rps(self) -> float:
        return self.peak_rps + self.margin_rps


EMPTY_FORECAST = Forecast()


def holt_forecast(
    history: Sequence[RateSample],
    *,
    horizon_s: float,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    phi: float = DEFAULT_PHI,
    burst_k: float = DEFAULT_BURST_K,
    error_window: int = DEFAULT_ERROR_WINDOW,
) -> Forecast:
    """Forecast the arrival rate up to ``horizon_s`` ahead of the last complete bucket."""
    rates = [r if math.isfinite(r) and r > 0 else 0.0 for _, r in history]
    n = len(rates)
    if n == 0:
        return EMPTY_FORECAST
    bucket_s = _median_spacing([t for t, _ in history])
    level = rates[0]
    trend = 0.0
    errors: list[float] = []
    for x in rates[1:]:
        predicted = level + phi * trend
        errors.append(x - predicted)
        new_level = alpha * x + (1.0 - alpha) * predicted
        trend = beta * (new_level - level) + (1.0 - beta) * phi * trend
        level = new_level
    level = max(0.0, level)

    steps = math.ceil(horizon_s / bucket_s - 1e-9) if bucket_s > 0 else 0
    damp_sum = 0.0
    power = 1.0
    peak = level
    for _ in range(min(steps, 10_000)):
        power *= phi
        damp_sum += power
        peak = max(peak, level + trend * damp_sum)
        if power < 1e-6:  # the damped trend has converged; later steps add nothing visible
            break
    point = max(0.0, level + trend * damp_sum)

    recent = sorted(abs(e) for e in errors[-error_window:]) if error_window > 0 else []
    # Robust spread: 1.4826 × median |error| (the MAD's normal-consistent scale, errors centred on
    # zero). An RMS would let one step change inflate the margin for the whole window.
    spread = 1.4826 * recent[len(recent) // 2] if recent else 0.0
    return Forecast(
        level_rps=level,
        trend_rps_per_bucket=trend,
        bucket_s=bucket_s,
        horizon_s=horizon_s,
        point_rps=point,
        peak_rps=max(0.0, peak),
        margin_rps=burst_k * spread,
        samples=n,
    )


def _median_spacing(times: Sequence[float]) -> float:
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
    if not gaps:
        return 0.0
    return gaps[len(gaps) // 2]
