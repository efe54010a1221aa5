"""The autoscaler's evidence rules: what the tokenplane scaler may conclude from what it measures.

Each is a param of :class:`~tokenplane.core.autoscale.tokenplane_params.TokenplaneParams`, default
false (``bench/autoscale_suite.py`` turns all on); :mod:`.policy` sizes the pool and applies them.

* ``symmetric_bursts``: a fall of the arrival rate counts as a rise read backwards
  (:func:`.burst.fall_sample`; on-off and Markov-modulated sources are time-reversible), so a pool
  that starts inside a burst learns the burst when it ends; burst sizing then starts from the last
  minute's mean (at least one request per bucket), the level the samples were measured from.
* ``capacity_lower_bounds``: a rate served without saturating is a lower bound on capacity; the
  estimate jumps to it instead of averaging it with the prior.
* ``trust_latency``: with no saturated window yet (the estimate is a prior or a lower bound) and
  the pool comfortable (TTFT p90 under ``comfort_fraction`` of the SLO, attainment met, no queue,
  KV under ``kv_high``), the demand term does not add serving instances and the warm pool is sized
  from measured cold-start rises only; a backlog under one request per instance is not a queue.
* ``queue_buffer``: the TTFT budget ``S`` absorbs part of a rise: over a horizon ``H`` capacity
  ``c`` serves a peak ``r`` when ``c >= r·H/(H + S)`` (never below the current level); the same for
  the cold-start rises that alone size the warm pool while ``trust_latency`` holds the demand term.
* ``window_from_cold_start``: stabilisation window and cooldown both equal one cold start plus a
  decision interval (released capacity takes that long to return), and no shrink happens before one
  such span has been observed. A cold start is bought only for serving + warm that the previous
  decision asked for too (before the first decision: the initial pool); a need shorter than a
  decision interval is gone long before the instance lands. Warm activations are not held back.
* ``latency_queues``: a backlog is judged by the latency it causes (:func:`queue_within_slo`:
  TTFT p90 within ``comfort_fraction`` of the SLO, attainment met, and the wait it implies by
  Little's law, backlog / throughput, within the rest of the SLO). Such a backlog is neither a
  saturated window (capacity learns only a lower bound from it, and it sets no ceiling) nor a
  queue to drain. Without the ceiling such queues used to set, the probe can raise the estimate
  past anything measured, so the pool does not shrink below the remembered bursts' peak
  (``peak(slo_target)`` of the activation-horizon memory, buffered like the rest) at the rate
  served comfortably: a shed instance is verified only when a burst returns, a cold start late.
  And while the pool is comfortable on an estimate with no ceiling (the ``trust_latency``
  conditions), the warm pool is sized from the measured cold-start rises alone even when the
  demand term needs no hold: the forecast's trend over a cold start extrapolates a burst's onset
  step far past the burst, and a cold start bought for it is stopped unused when it lands. A
  ceiling below the most served comfortably (``safe_rps``) is refuted and counts as none.
* ``warm_slo_share``: the SLO asks that ``slo_target`` of requests meet it, not all. While the
  measured TTFT/TBT attainment meets it (and TTFT p90 is within the SLO), the warm pool is sized
  for ``slo_target`` of the peak forecast within a cold start (already an upper bound: peak plus
  margin); a peak that the serving pool misses by less than the SLO's slack buys no cold start,
  which otherwise lands after the peak and is stopped unused. Serving targets are unchanged.
* ``cancel_warming``: a scale-down cancels instances still warming first (as a platform deletes a
  pod that is still starting: it stops costing at once, and it holds no work to drain), and the
  policy lets it (:func:`cancellable_warming`). A warming instance is cancelled when neither this
  decision nor the previous one asks for it (serving + warm), the mirror of the rule that buys a
  cold start only for a need two decisions long; never while the SLO fails under load (the SLO
  term holds what its last step bought until that lands and is measured) unless the pool has
  caught up by the leading measures (:func:`recovered`: KV under ``kv_high`` and the backlog's
  wait by Little's law within the margin ``comfort_fraction`` leaves), since the windowed
  attainment judges arrivals up to a window ago and lags the recovery. A need that ends
  before its cold start lands (a KV or SLO episode shorter than a cold start) then costs the
  decisions it lasted plus one, not a whole cold start stopped unused when it lands.
* ``slo_budget``: the SLO as a run-level error budget: a pool that has banked margin may run one
  instance short when the bank covers the worst window that size was measured at (at this load or
  more) for a cold start; see :mod:`.budget`.
"""

from __future__ import annotations

from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec
from tokenplane.core.autoscale.tokenplane_params import TokenplaneParams


def queue_within_slo(signal: PoolSignal, spec: PoolSpec, p: TokenplaneParams) -> bool:
    """The ``latency_queues`` test: is the pool's backlog one it serves within the TTFT SLO?

    True when the measured TTFT p90 (queueing included) is at most ``comfort_fraction`` of the SLO,
    TTFT attainment meets ``slo_target``, and the wait the backlog implies now (Little's law:
    backlog / throughput) fits in the margin the comfort threshold leaves, ``(1 -
    comfort_fraction)`` of the SLO: a leading check, since the measured p90 lags by one SLO plus
    its window. Such a backlog is the batch turning over (a continuous-batching engine always has a
    few requests between steps), not a pool at its limit. False (the queue counts) whenever either
    is unknown.
    """
    slo, p90, served = spec.ttft_slo_s, signal.ttft_p90_s, signal.throughput_rps
    if slo is None or p90 is None or served is None or served <= 0:
        return False
    if p90 > p.comfort_fraction * slo:
        return False
    if signal.ttft_attainment is not None and signal.ttft_attainment < p.slo_target:
        return False
    return signal.backlog / served <= (1.0 - p.comfort_fraction) * slo


def cancellable_warming(signal: PoolSignal, asked: int, *, previous: int | None, slo_failing: bool) -> int:
    """How many warming instances the ``cancel_warming`` rule lets a decision cancel.

    ``asked`` is serving + warm this decision targets, ``previous`` what the previous decision
    asked for (``None`` before the first: what is held counts as asked). Warming instances beyond
    the larger of the two may go; none while ``slo_failing``.
    """
    if slo_failing or not signal.warming:
        return 0
    held = len(signal.serving) + len(signal.warm) + len(signal.warming)
    keep = max(asked, held if previous is None else previous)
    return max(0, min(len(signal.warming), held - keep))


def recovered(signal: PoolSignal, spec: PoolSpec, p: TokenplaneParams) -> bool:
    """The leading half of :func:`queue_within_slo`: the pool has caught up now, whatever the
    windowed attainment (which judges arrivals up to a window ago) still says.

    True when KV use is under ``kv_high`` and the wait the backlog implies (backlog / throughput,
    Little's law) fits in ``(1 - comfort_fraction)`` of the TTFT SLO; False when either is unknown.
    """
    slo, served = spec.ttft_slo_s, signal.throughput_rps
    if slo is None or served is None or served <= 0 or signal.mean_kv_usage >= p.kv_high:
        return False
    return signal.backlog / served <= (1.0 - p.comfort_fraction) * slo
