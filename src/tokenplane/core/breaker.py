"""Per-instance circuit breakers: consecutive failures, error rate, and latency outliers against the pool.

States and the only legal transitions::

    CLOSED --(CONSECUTIVE_FAILURES | ERROR_RATE | LATENCY_OUTLIER)--> OPEN
    OPEN --(COOLDOWN_ELAPSED)--> HALF_OPEN
    HALF_OPEN --(PROBE_SUCCEEDED)--> CLOSED
    HALF_OPEN --(PROBE_FAILED | PROBE_SLOW)--> OPEN

CLOSED opens on the first of:

* ``consecutive_failures`` failures in a row;
* an error rate ``>= error_rate`` over the last ``window_s`` seconds with at least ``min_requests``
  results in the window;
* a latency outlier: the instance's mean latency over the window (at least ``latency_min_samples``
  successful results) exceeds ``latency_k`` × the median of the per-instance means of the pool (at
  least ``latency_min_instances`` instances with enough samples). A degraded GPU is slow, not dead,
  and only this comparison catches it. The pool median is recomputed at most every
  ``median_refresh_s`` seconds, and at once whenever an instance starts or stops counting towards it
  (it reaches ``latency_min_samples`` or falls below, or a breaker moves): each recomputation prunes
  every instance's window, which per result was more than half of a breaker's cost, while a median
  of means over a 30 s window moves little in 0.1 s (Envoy's outlier detection, likewise, evaluates
  its success-rate ejection on an interval). At most ``max_latency_ejection_fraction`` of the known
  instances are held open for latency at once (Envoy's max ejection percent): if the whole pool is
  slow, that is load, not a bad instance. Failures are never capped: if every instance fails, every
  breaker opens and the shell answers fast 503s.

``latency_s`` is whatever per-attempt latency the shell reports consistently (TTFT is the natural
one; TPOT works too); ``None`` adds no latency sample.

OPEN lasts ``cooldown_s × cooldown_multiplier ** reopens`` (capped at ``max_cooldown_s``), where
``reopens`` counts the times it went HALF_OPEN → OPEN since it was last CLOSED. After the cooldown it
reads HALF_OPEN and admits ``half_open_probes`` concurrent probes; that many successes close it, one
failure (or a probe slower than ``latency_k`` × the other instances' median) reopens it. Every
transition clears the instance's window, so old samples cannot reopen a freshly closed breaker.

API (:class:`BreakerBoard`): ``allow(id, now=)`` and ``state(id, now=)`` are pure reads (an elapsed
cooldown reads as HALF_OPEN before anything records it); ``on_attempt`` takes a probe slot;
``on_result`` records the result; ``tick(now)`` materialises elapsed cooldowns. Each of the three
returns the transitions it caused as :class:`BreakerEvent`s (for metrics and logs).
:func:`filter_allowed` / :class:`BreakerFilter` prune routing candidates to allowed instances.

Cost: ``on_result`` is O(1) amortised, plus O(instances log instances) for the pool median at most
once per ``median_refresh_s``; ``allow`` O(1). Memory: 16 bytes per result per instance over
``window_s`` (:class:`~tokenplane.core.timed_series.TimedSeries`).

Failure modes: a probe whose result is never reported holds its slot forever; the shell must report
timeouts and lost connections as failures (``ok=False``). The latency test needs a pool: with fewer
than ``latency_min_instances`` instances reporting it is off. Results that arrive while OPEN (from
attempts sent before it opened) are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tokenplane.core.breaker_config import BreakerConfig
from tokenplane.core.breaker_states import (
    LEGAL_TRANSITIONS,
    PEER_REASONS,
    BreakerEvent,
    BreakerReason,
    BreakerState,
)
from tokenplane.core.timed_series import TimedSeries
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo

__all__ = [
    "LEGAL_TRANSITIONS",
    "PEER_REASONS",
    "BreakerBoard",
    "BreakerConfig",
    "BreakerEvent",
    "BreakerFilter",
    "BreakerReason",
    "BreakerState",
    "filter_allowed",
]

_FAILED = -1.0  # a failed result's latency in the window (real latencies are >= 0 or NaN)


class _Breaker:
    __slots__ = (
        "consecutive",
        "cooldown_s",
        "failures",
        "lat_n",
        "lat_sum",
        "latency_open",
        "opened_at",
        "probe_successes",
        "probes_in_flight",
        "reopens",
        "samples",
        "state",
    )

    def __init__(self) -> None:
        self.state = BreakerState.CLOSED
        self.consecutive = 0
        # (time, latency) per result; a failure's latency is -1 (two arrays of doubles, not a
        # deque of tuples: see core.timed_series)
        self.samples = TimedSeries()
        self.failures = 0
        self.lat_sum = 0.0
        self.lat_n = 0
        self.opened_at = 0.0
        self.cooldown_s = 0.0
        self.reopens = 0
        self.probes_in_flight = 0
        self.probe_successes = 0
        self.latency_open = False

    def clear_window(self) -> None:
        self.samples.clear()
        self.failures = 0
        self.lat_sum = 0.0
        self.lat_n = 0
        self.consecutive = 0

    def prune(self, horizon: float) -> None:
        samples = self.samples
        for latency in samples.expire(horizon):
            if latency < 0:
                self.failures -= 1
            elif not math.isnan(latency):
                self.lat_sum -= latency
                self.lat_n -= 1
        if not samples:
            self.lat_sum = 0.0

    def mean_latency(self) -> float:
        return self.lat_sum / self.lat_n if self.lat_n else math.nan


class BreakerBoard:
    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = (config or BreakerConfig()).validate()
        self._breakers: dict[InstanceId, _Breaker] = {}
        self._unsettled = 0  # breakers not CLOSED
        self._median: float | None = None  # the pool median of latency means, as of _median_at
        self._median_at = -math.inf  # -inf: stale (membership changed), recompute at next use

    # ---- pure reads -------------------------------------------------------------------------

    @property
    def all_closed(self) -> bool:
        """Every breaker is CLOSED: :meth:`allow` is True for any instance at any time (so what a
        shell derives from it need not be recomputed until a breaker moves)."""
        return self._unsettled == 0

    def state(self, instance_id: InstanceId, *, now: float) -> BreakerState:
        b = self._breakers.get(instance_id)
        if b is None:
            return BreakerState.CLOSED
        if b.state is BreakerState.OPEN and now >= b.opened_at + b.cooldown_s:
            return BreakerState.HALF_OPEN
        return b.state

    def allow(self, instance_id: InstanceId, *, now: float) -> bool:
        b = self._breakers.get(instance_id)
        if b is None or b.state is BreakerState.CLOSED:
            return True
        if b.state is BreakerState.OPEN:
            return now >= b.opened_at + b.cooldown_s  # reads HALF_OPEN with every probe slot free
        return b.probes_in_flight < self.config.half_open_probes

    def open_instances(self, *, now: float) -> list[InstanceId]:
        return [i for i in self._breakers if self.state(i, now=now) is BreakerState.OPEN]

    # ---- observations -----------------------------------------------------------------------

    def tick(self, now: float) -> tuple[BreakerEvent, ...]:
        events: list[BreakerEvent] = []
        for instance_id, b in self._breakers.items():
            self._materialise(instance_id, b, now, events)
        return tuple(events)

    def on_attempt(self, instance_id: InstanceId, *, now: float) -> tuple[BreakerEvent, ...]:
        b = self._breakers.get(instance_id)
        if b is None or b.state is BreakerState.CLOSED:
            return ()
        events: list[BreakerEvent] = []
        self._materialise(instance_id, b, now, events)
        if b.state is BreakerState.HALF_OPEN:
            b.probes_in_flight += 1
        return tuple(events)

    def on_result(
        self, instance_id: InstanceId, ok: bool, latency_s: float | None, *, now: float
    ) -> tuple[BreakerEvent, ...]:
        b = self._breakers.get(instance_id)
        if b is None:
            b = self._breakers[instance_id] = _Breaker()
        if b.state is BreakerState.CLOSED:  # the usual case: no cooldown to materialise
            self._record(b, ok, latency_s, now)
            reason = self._closed_trip(instance_id, b, now)
            if reason is None:
                return ()
            events: list[BreakerEvent] = []
            b.reopens = 0
            b.latency_open = reason is BreakerReason.LATENCY_OUTLIER
            self._open(instance_id, b, now, reason, events)
            return tuple(events)
        events = []
        self._materialise(instance_id, b, now, events)
        if b.state is BreakerState.OPEN:
            return tuple(events)
        if b.state is BreakerState.HALF_OPEN:
            b.probes_in_flight = max(0, b.probes_in_flight - 1)
            if not ok:
                self._reopen(instance_id, b, now, BreakerReason.PROBE_FAILED, events)
            elif latency_s is not None and self._too_slow(instance_id, latency_s, now):
                self._reopen(instance_id, b, now, BreakerReason.PROBE_SLOW, events)
            else:
                b.probe_successes += 1
                if b.probe_successes >= self.config.half_open_probes:
                    self._move(
                        instance_id, b, BreakerState.CLOSED, BreakerReason.PROBE_SUCCEEDED, now, events
                    )
                    b.reopens = 0
        return tuple(events)

    def release(self, instance_id: InstanceId) -> None:
        """An attempt ended with no verdict on the instance (its client left first).

        A half-open probe slot it held is freed; nothing counts as a success or a failure, so a
        wave of client cancellations cannot open a breaker.
        """
        b = self._breakers.get(instance_id)
        if b is not None and b.state is BreakerState.HALF_OPEN:
            b.probes_in_flight = max(0, b.probes_in_flight - 1)

    def cooldown_s(self, instance_id: InstanceId) -> float:
        """The cooldown of the instance's last opening (0 if it never opened)."""
        b = self._breakers.get(instance_id)
        return 0.0 if b is None else b.cooldown_s

    def adopt(
        self, instance_id: InstanceId, to: BreakerState, *, cooldown_s: float, now: float
    ) -> tuple[BreakerEvent, ...]:
        """Take another replica's verdict on an instance, so that replicas agree.

        ``OPEN``: that replica opened the breaker (or a probe failed there): open it here for
        ``cooldown_s`` from ``now`` unless it is already open. ``CLOSED``: a probe succeeded there:
        close it here (an OPEN breaker passes through HALF_OPEN, so every move stays legal).
        Reasons ``PEER_OPENED`` / ``PEER_CLOSED``; the shell must not pass them on again.
        """
        b = self._breakers.get(instance_id)
        if b is None:
            b = self._breakers[instance_id] = _Breaker()
        events: list[BreakerEvent] = []
        self._materialise(instance_id, b, now, events)
        if to is BreakerState.OPEN:
            if b.state is not BreakerState.OPEN:
                b.latency_open = False
                b.opened_at = now
                b.cooldown_s = max(0.0, cooldown_s)
                self._move(instance_id, b, BreakerState.OPEN, BreakerReason.PEER_OPENED, now, events)
        elif to is BreakerState.CLOSED and b.state is not BreakerState.CLOSED:
            if b.state is BreakerState.OPEN:
                self._move(instance_id, b, BreakerState.HALF_OPEN, BreakerReason.PEER_CLOSED, now, events)
            self._move(instance_id, b, BreakerState.CLOSED, BreakerReason.PEER_CLOSED, now, events)
            b.reopens = 0
        return tuple(events)

    def forget(self, instance_id: InstanceId) -> None:
        b = self._breakers.pop(instance_id, None)
        if b is not None and b.state is not BreakerState.CLOSED:
            self._unsettled -= 1
        self._median_at = -math.inf

    # ---- internals --------------------------------------------------------------------------

    def _record(self, b: _Breaker, ok: bool, latency_s: float | None, now: float) -> None:
        min_samples = self.config.latency_min_samples
        counted = b.lat_n >= min_samples
        b.prune(now - self.config.window_s)
        if ok:
            b.consecutive = 0
            if latency_s is not None and math.isfinite(latency_s):
                b.samples.append(now, latency_s)
                b.lat_sum += latency_s
                b.lat_n += 1
            else:
                b.samples.append(now, math.nan)
        else:
            b.samples.append(now, _FAILED)
            b.consecutive += 1
            b.failures += 1
        if (b.lat_n >= min_samples) is not counted:  # it joins or leaves the pool median
            self._median_at = -math.inf

    def _closed_trip(self, instance_id: InstanceId, b: _Breaker, now: float) -> BreakerReason | None:
        cfg = self.config
        if b.consecutive >= cfg.consecutive_failures:
            return BreakerReason.CONSECUTIVE_FAILURES
        n = len(b.samples)
        if n >= cfg.min_requests and b.failures / n >= cfg.error_rate:
            return BreakerReason.ERROR_RATE
        if b.lat_n >= cfg.latency_min_samples:
            median = self._median
            if not (0.0 <= now - self._median_at < cfg.median_refresh_s):
                median = self._median = self._pool_median(now, exclude=None)
                self._median_at = now
            if median is not None and b.mean_latency() > cfg.latency_k * median:
                held = sum(
                    1
                    for x in self._breakers.values()
                    if x.latency_open and x.state is not BreakerState.CLOSED
                )
                if held + 1 <= cfg.max_latency_ejection_fraction * len(self._breakers):
                    return BreakerReason.LATENCY_OUTLIER
        return None

    def _pool_median(self, now: float, *, exclude: InstanceId | None) -> float | None:
        cfg = self.config
        horizon = now - cfg.window_s
        min_samples = cfg.latency_min_samples
        means = []
        for other_id, other in self._breakers.items():
            if other_id == exclude or other.state is not BreakerState.CLOSED:
                continue
            counted = other.lat_n >= min_samples
            other.prune(horizon)
            if other.lat_n >= min_samples:
                means.append(other.mean_latency())
            elif counted and exclude is not None:  # it left the pool: the cached median is stale
                self._median_at = -math.inf
        needed = cfg.latency_min_instances - (1 if exclude is not None else 0)
        n = len(means)
        if n < max(1, needed):
            return None
        means.sort()  # the median by hand: statistics.median costs ~1 µs more, once per request
        mid = n // 2
        return means[mid] if n % 2 else (means[mid - 1] + means[mid]) / 2

    def _too_slow(self, instance_id: InstanceId, latency_s: float, now: float) -> bool:
        median = self._pool_median(now, exclude=instance_id)
        return median is not None and latency_s > self.config.latency_k * median

    def _cooldown(self, reopens: int) -> float:
        cfg = self.config
        return min(cfg.max_cooldown_s, cfg.cooldown_s * cfg.cooldown_multiplier**reopens)

    def _open(
        self,
        instance_id: InstanceId,
        b: _Breaker,
        now: float,
        reason: BreakerReason,
        events: list[BreakerEvent],
    ) -> None:
        b.opened_at = now
        b.cooldown_s = self._cooldown(b.reopens)
        self._move(instance_id, b, BreakerState.OPEN, reason, now, events)

    def _reopen(
        self,
        instance_id: InstanceId,
        b: _Breaker,
        now: float,
        reason: BreakerReason,
        events: list[BreakerEvent],
    ) -> None:
        b.reopens += 1
        self._open(instance_id, b, now, reason, events)

    def _materialise(
        self, instance_id: InstanceId, b: _Breaker, now: float, events: list[BreakerEvent]
    ) -> None:
        if b.state is BreakerState.OPEN and now >= b.opened_at + b.cooldown_s:
            at = b.opened_at + b.cooldown_s
            self._move(instance_id, b, BreakerState.HALF_OPEN, BreakerReason.COOLDOWN_ELAPSED, at, events)

    def _move(
        self,
        instance_id: InstanceId,
        b: _Breaker,
        to: BreakerState,
        reason: BreakerReason,
        at: float,
        events: list[BreakerEvent],
    ) -> None:
        events.append(BreakerEvent(instance_id, b.state, to, reason, at))
        if (b.state is BreakerState.CLOSED) != (to is BreakerState.CLOSED):
            self._unsettled += 1 if b.state is BreakerState.CLOSED else -1
            self._median_at = -math.inf  # it joins or leaves the pool median
        b.state = to
        b.clear_window()
        b.probes_in_flight = 0
        b.probe_successes = 0
        if to is BreakerState.CLOSED:
            b.latency_open = False


def filter_allowed(
    views: Sequence[InstanceView], board: BreakerBoard, *, now: float
) -> Sequence[InstanceView]:
    """Drop instances whose breaker is OPEN, or HALF_OPEN with no free probe slot.

    Returns the very same sequence when it keeps all (no allocation on the healthy path); an empty
    result means every instance is broken and the shell should fail fast.
    """
    for view in views:
        if not board.allow(view.instance_id, now=now):
            return [v for v in views if board.allow(v.instance_id, now=now)]
    return views


class BreakerFilter:
    """A routing :class:`~tokenplane.core.routing.base.Filter` over a board the shell owns."""

    name = "breaker-open"

    def __init__(self, board: BreakerBoard) -> None:
        self.board = board

    def filter(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> Sequence[InstanceView]:
        return filter_allowed(candidates, self.board, now=now)
