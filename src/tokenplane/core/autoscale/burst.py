"""Measured burstiness: how far the arrival rate rises within a horizon, learned from the pool's own
arrivals, so the scaler's headroom comes from the traffic rather than from a tuned constant.

For a horizon ``H`` (the time it takes to add capacity: activating a warm instance, or a cold
start, plus one decision interval) each complete arrival bucket ``j`` that is at least ``H`` old
yields one *rise sample*:

* ``level_j`` = mean rate over the minute up to and including bucket ``j`` (at least one bucket);
* ``peak_j`` = the largest bucket rate in ``(j, j + H]``;
* ``ratio_j = peak_j / max(level_j, floor)``, ``floor`` = one request per bucket (so a silent
  minute does not read as an infinite rise).

A :class:`BurstMemory` keeps the samples of the last four half-lives (one per bucket). Its
``headroom(q)`` is the weighted ``q``-quantile of the ratios, each sample weighted by its peak (the
requests at stake if capacity falls short) times ``2^(−age / half_life_s)`` (the newest sample has
age 0), so a burst pattern that recurs stays in the headroom and a one-off rise fades from it over a
few half-lives; ``peak(q)`` is the same quantile of the peaks.
The scaler sizes for ``min(level × headroom(q), peak(q))``: the rise it has seen from a level like
today's, but never more than the rates it has actually seen over such a window (so a quiet spell's
large ratios are not applied to a busy level). ``q`` is the SLO target: the headroom covers the rises
that carry all but ``1 − q`` of the requests.

Cost: O(h) per sample, O(samples · log samples) per quantile (a few hundred samples).

How it fails: a burst shape never seen in the memory is not anticipated (the queue and SLO terms
react, after the horizon); a memory shorter than the burst cycle forgets between bursts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from tokenplane.core.autoscale.signals import RateSample

DEFAULT_HALF_LIFE_S = 900.0
LEVEL_WINDOW_S = 60.0


class RiseSample(msgspec.Struct, frozen=True):
    at_s: float  # start of the anchor bucket
    level_rps: float
    peak_rps: float

    @property
    def ratio(self) -> float:
        return self.peak_rps / self.level_rps


def rise_sample(history: Sequence[RateSample], horizon_s: float) -> RiseSample | None:
    """The rise sample whose horizon ends at the last complete bucket, or ``None`` if the history
    is too short (``history``: evenly spaced complete buckets, oldest first)."""
    n = len(history)
    if n < 2:
        return None
    width = history[-1][0] - history[-2][0]
    if width <= 0:
        return None
    h = max(1, math.ceil(horizon_s / width - 1e-9))
    anchor = n - 1 - h
    if anchor < 0:
        return None
    k = max(1, round(LEVEL_WINDOW_S / width))
    lo = max(0, anchor - k + 1)
    level = sum(r for _, r in history[lo : anchor + 1]) / (anchor + 1 - lo)
    peak = max(r for _, r in history[anchor + 1 :])
    floor = 1.0 / width
    return RiseSample(history[anchor][0], max(level, floor), max(peak, 0.0))


def fall_sample(history: Sequence[RateSample], horizon_s: float) -> RiseSample | None:
    """The rise sample of the time-reversed history: the newest minute's level against the peak of
    the horizon before it, dated at the newest bucket. A fall of the rate is a rise read backwards:
    an on-off or Markov-modulated source (time-reversible) rises as far as it falls, so a pool that
    starts inside a burst learns the burst's size when it ends, not only at the next rise."""
    n = len(history)
    if n < 2:
        return None
    width = history[-1][0] - history[-2][0]
    if width <= 0:
        return None
    h = max(1, math.ceil(horizon_s / width - 1e-9))
    k = max(1, round(LEVEL_WINDOW_S / width))
    if n < h + k:
        return None
    level = sum(r for _, r in history[n - k :]) / k
    peak = max(r for _, r in history[n - k - h : n - k])
    floor = 1.0 / width
    return RiseSample(history[-1][0], max(level, floor), max(peak, 0.0))


def _weighted_quantile(pairs: list[tuple[float, float]], q: float) -> float:
    """``q``-quantile of values weighted by weights (``pairs``: (value, weight)), lower convention."""
    pairs.sort()
    total = sum(w for _, w in pairs)
    if total <= 0:
        return pairs[math.ceil(q * len(pairs)) - 1 if q > 0 else 0][0]
    acc = 0.0
    for value, weight in pairs:
        acc += weight
        if acc >= q * total - 1e-12:
            return value
    return pairs[-1][0]


class BurstMemory(msgspec.Struct, frozen=True):
    """Rise samples of one horizon (immutable; :meth:`add` returns a new memory)."""

    samples: tuple[RiseSample, ...] = ()
    half_life_s: float = DEFAULT_HALF_LIFE_S

    def add(self, sample: RiseSample) -> BurstMemory:
        if self.samples and sample.at_s <= self.samples[-1].at_s:
            return self  # this bucket is already in
        horizon = sample.at_s - 4.0 * self.half_life_s
        kept = tuple(s for s in self.samples if s.at_s > horizon)
        return BurstMemory((*kept, sample), self.half_life_s)

    def _weights(self) -> list[float]:
        newest = self.samples[-1].at_s
        hl = self.half_life_s
        return [s.peak_rps * 0.5 ** ((newest - s.at_s) / hl) for s in self.samples]

    def headroom(self, q: float) -> float:
        """Weighted ``q``-quantile of the rise ratio (1 with no samples; never below 1)."""
        if not self.samples:
            return 1.0
        pairs = [(s.ratio, w) for s, w in zip(self.samples, self._weights(), strict=True)]
        return max(1.0, _weighted_quantile(pairs, q))

    def peak(self, q: float) -> float:
        """Weighted ``q``-quantile of the windowed peak rate (0 with no samples)."""
        if not self.samples:
            return 0.0
        pairs = [(s.peak_rps, w) for s, w in zip(self.samples, self._weights(), strict=True)]
        return _weighted_quantile(pairs, q)

    def size_for(self, level_rps: float, q: float) -> float:
        """The rate to provision for over this horizon from today's ``level_rps`` (module doc)."""
        if not self.samples:
            return level_rps
        return max(level_rps, min(level_rps * self.headroom(q), self.peak(q)))
