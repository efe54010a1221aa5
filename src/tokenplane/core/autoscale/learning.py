"""What the tokenplane scaler learns from each signal (:func:`learn`), and the horizons it sizes over.

Learning (:meth:`.policy.TokenplaneScaler.observe` calls :func:`learn` with each signal):

* capacity: throughput per ready instance while saturated (most instances queueing, KV full, or
  the TTFT SLO breached while queueing) is a measurement; so is a throughput above the estimate.
  The spec's ``capacity_rps`` prior counts as ``capacity_prior_weight`` measurements, and its weight
  decays by ``1 − capacity_learn_rate`` per measurement (:mod:`capacity`). When TTFT p90 is under
  ``comfort_fraction`` of the SLO with each instance at least ``probe_load_gate`` of the estimate,
  the estimate probes up by ``capacity_probe`` (never past the last saturated measurement), and
  ``c`` is at least ``s / u`` (sizing below what has been seen to work is never planned);
* burstiness: one rise sample per complete arrival bucket for each horizon, remembered with a
  half-life of ``burst_half_life_s`` (default 2 × ``stabilisation_s``) (:mod:`burst`).
"""

from __future__ import annotations

import msgspec

from tokenplane.core.autoscale.budget import observe_budget
from tokenplane.core.autoscale.burst import BurstMemory, RiseSample, fall_sample, rise_sample
from tokenplane.core.autoscale.capacity import DEFAULT_KV_SATURATED
from tokenplane.core.autoscale.evidence import queue_within_slo
from tokenplane.core.autoscale.scaler_state import ScalerState
from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec
from tokenplane.core.autoscale.tokenplane_params import TokenplaneParams

__all__ = ["horizons", "learn"]


def horizons(spec: PoolSpec, decision_interval_s: float) -> tuple[float, float]:
    """(activation, cold) horizons: how long until capacity asked for now can serve."""
    step = decision_interval_s
    return spec.warm_activation_s + step, spec.cold_start_s + step


def learn(state: ScalerState, p: TokenplaneParams, signal: PoolSignal, spec: PoolSpec) -> ScalerState:
    """Learn the burstiness of arrivals (see :mod:`burst`) and per-instance capacity from
    throughput at the observed latency (see :mod:`capacity`)."""
    if p.learn_burstiness and signal.arrivals:
        h_act, h_cold = horizons(spec, p.decision_interval_s)
        half_life = p.burst_half_life_s or 2.0 * max(p.stabilisation_s, p.decision_interval_s)
        for horizon, field in ((h_act, "burst_activation"), (h_cold, "burst_cold")):
            sample = rise_sample(signal.arrivals, horizon)
            if p.symmetric_bursts:
                fall = fall_sample(signal.arrivals, horizon)
                if fall is not None and (sample is None or fall.ratio > sample.ratio):
                    sample = fall
                if sample is not None:  # dated at the newest bucket: one sample per bucket
                    sample = RiseSample(signal.arrivals[-1][0], sample.level_rps, sample.peak_rps)
            if sample is not None:
                memory: BurstMemory = getattr(state, field)
                if memory.half_life_s != half_life:
                    memory = BurstMemory(memory.samples, half_life)
                state = msgspec.structs.replace(state, **{field: memory.add(sample)})
    if p.slo_budget:
        budget = observe_budget(
            state.slo_budget, signal, spec, interval_s=p.decision_interval_s, period_s=p.slo_period_s
        )
        state = msgspec.structs.replace(state, slo_budget=budget)
    if not p.learn_capacity:
        return state
    ready = sum(1 for v in signal.serving if v.ready and v.healthy)
    if ready == 0:
        return state
    # Saturated at the observed latency: most ready instances have a queue (a backlog stuck on
    # a few instances says nothing of the others), KV caches nearly full, or the TTFT SLO
    # breached while they queue. Then throughput per instance measures capacity.
    queueing = sum(1 for v in signal.serving if v.ready and v.healthy and v.waiting > 0)
    slo_breach = (
        spec.ttft_slo_s is not None and signal.ttft_p90_s is not None and signal.ttft_p90_s > spec.ttft_slo_s
    )
    # latency_queues: a backlog served within the SLO (queue_within_slo) is not saturation.
    queue_counts = not (p.latency_queues and queue_within_slo(signal, spec, p))
    saturated = (
        (2 * queueing >= ready and signal.backlog >= ready and queue_counts)
        or signal.mean_kv_usage >= DEFAULT_KV_SATURATED
        or (slo_breach and 2 * queueing >= ready)
    )
    if signal.throughput_rps is not None:
        per_instance = signal.throughput_rps / ready
        served = per_instance
        current = state.capacity_rps.get(spec.capacity_rps, bound=p.capacity_bound)
        # Latency evidence: the pool met the TTFT SLO with room to spare (p90 under
        # comfort_fraction of it) while each instance carried at least probe_load_gate of its
        # estimated capacity: capacity is probably above the estimate, so the estimate probes
        # upward by capacity_probe, but never past the last saturated measurement (what the
        # pool did at its limit). A saturated window (below) pulls it back.
        comfortable = (
            not saturated
            and (not p.latency_queues or signal.backlog < ready)  # a queue: served is the measure
            and spec.ttft_slo_s is not None
            and signal.ttft_p90_s is not None
            and signal.ttft_p90_s <= p.comfort_fraction * spec.ttft_slo_s
            and (signal.ttft_attainment is None or signal.ttft_attainment >= p.slo_target)
            and per_instance >= p.probe_load_gate * current
        )
        if comfortable:
            state = msgspec.structs.replace(state, safe_rps=max(per_instance, state.safe_rps or 0.0))
            probe = current * (1.0 + p.capacity_probe)
            ceiling = state.capacity_rps.ceiling
            if ceiling is not None:
                probe = min(probe, max(ceiling, current))
            per_instance = max(per_instance, probe)
        est = state.capacity_rps.observe(
            per_instance,
            saturated=saturated,
            prior=spec.capacity_rps,
            rate=p.capacity_learn_rate,
            bound=p.capacity_bound,
            prior_weight=p.capacity_prior_weight,
        )
        if p.capacity_lower_bounds and not saturated and est.value is not None and served > est.value:
            # Served without saturating: capacity is at least this. A bound, not a noisy sample
            # to average with a rough prior (the average would keep the prior's error for
            # minutes); the probe above stays a step, not a bound.
            top = spec.capacity_rps * p.capacity_bound
            est = msgspec.structs.replace(est, value=min(top, served))
        state = msgspec.structs.replace(state, capacity_rps=est)
    if signal.throughput_tps is not None and spec.capacity_tokens_per_s is not None:
        est = state.capacity_tps.observe(
            signal.throughput_tps / ready,
            saturated=saturated,
            prior=spec.capacity_tokens_per_s,
            rate=p.capacity_learn_rate,
            bound=p.capacity_bound,
            prior_weight=p.capacity_prior_weight,
        )
        state = msgspec.structs.replace(state, capacity_tps=est)
    return state
