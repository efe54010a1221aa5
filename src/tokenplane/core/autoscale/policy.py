"""tokenplane's autoscaler: size the serving pool from demand, backlog, SLO attainment and KV use,
keep a warm pool to absorb rises, and scale down slowly by draining.

Algorithm, per decision (``n`` = serving instances, ``c`` = per-instance capacity in req/s, learned
online, see "Learning" below; ``u`` = ``target_utilisation``):

1. Forecast (:mod:`~tokenplane.core.autoscale.forecast`) arrivals over two horizons: activation
   (``warm_activation_s + decision_interval_s``: what serving must cover until the next decision can
   act) and cold (``cold_start_s + decision_interval_s``: what must already be warming now).
2. Needs, each a serving-instance count:

   * demand = ⌈r_act / (c·u)⌉ with r_act the larger of the upper forecast (peak + k·σ) and the
     rate the *measured burstiness* says to hold over the activation horizon (:mod:`burst`:
     ``min(level × headroom, seen peak)`` at the ``slo_target`` quantile), and the token term
     ⌈tokens/s demand / (c_tok·u)⌉ when both are known;
   * queue = ⌈(λ + backlog / queue_drain_s) / (c·u)⌉, λ = max(forecast level, throughput): enough to
     serve arrivals and drain the backlog (gateway queue + engine ``waiting``) within the target;
   * slo = n + max(1, ⌈n·slo_gain·deficit⌉) when TTFT/TBT attainment is below ``slo_target`` (or the
     TTFT p90 above the SLO) *and* the pool is loaded (backlog, utilisation ≥ ``slo_load_gate``, or
     KV pressure): adding GPUs to an idle pool with bad latency would hide a routing or scheduling
     problem, not fix it. One step per ``slo_step_interval_s``, because attainment is a windowed,
     lagging signal; between steps the term holds ``n`` (no scale-down while the SLO is failing);
   * kv = ⌈n·mean KV use / kv_target⌉ when mean KV use ≥ ``kv_high``.

   The largest need (ties: demand first) names the reason. Scale-up has no cooldown: capacity added
   late costs SLO, capacity added early costs minutes of GPU time.
3. Scale-down uses the same needs at utilisation ``u − scale_down_hysteresis`` (and KV at
   ``kv_high``), so a pool does not oscillate around a threshold. That recommendation (less the
   backlog term, which is transient by construction) is recorded on commit; the pool shrinks only
   to the *largest* recommendation of the last ``stabilisation_s``
   (the HPA's stabilisation window), never within ``cooldown_s`` of a scale-up, and by at most
   ``scale_down_step_fraction`` of the pool per decision. It drains (no request is cut); drained
   instances refill the warm pool first.
   Latency guards the way down: the pool does not shrink while TTFT p90 is above
   ``comfort_fraction`` of the SLO, nor below ⌈r_act / (s·(1 + capacity_probe))⌉ where ``s`` is
   the most req/s per instance it has served with comfortable latency (TTFT has a cliff, and the
   capacity estimate may still be a prior).
4. Warm pool target = max(``warm_pool_size``, ⌈r_cold / (c·u)⌉ − serving target), r_cold the
   larger of the cold-horizon forecast and the measured burstiness over a cold start: the warm pool
   is sized from the cold-start time and the bursts seen within one.
   Everything is clamped to [min, max]; cold starts never take the total past max.

Learning (:func:`.learning.learn`, from :meth:`TokenplaneScaler.observe`): capacity per instance
(:mod:`capacity`) and burstiness (:mod:`burst`), each from what the pool measures; see :mod:`.learning`.

Params (all optional): ``target_utilisation`` 0.75, ``scale_down_hysteresis`` 0.1, ``queue_drain_s``
30, ``slo_target`` 0.95, ``slo_gain`` 2, ``slo_step_interval_s`` 60, ``slo_load_gate`` 0.5,
``kv_high`` 0.9, ``kv_target`` 0.75, ``cooldown_s`` 180, ``stabilisation_s`` 180 (shorter than the
HPA's 300 s: drained instances park in the warm pool first, so a re-rise within minutes is absorbed
in seconds rather than by a cold start), ``scale_down_step_fraction`` 0.25, ``decision_interval_s``
15, ``forecast_alpha`` 0.5, ``forecast_beta`` 0.3, ``forecast_phi`` 0.9, ``burst_k`` 1.5,
``learn_capacity`` true, ``capacity_learn_rate`` 0.2, ``capacity_bound`` 8, ``capacity_prior_weight``
2, ``capacity_probe`` 0.25, ``comfort_fraction`` 0.5, ``probe_load_gate`` 0.3, ``learn_burstiness``
true, ``burst_half_life_s`` (2 × ``stabilisation_s``), ``park_drained`` true, ``slo_period_s``
(none: the period the SLO is judged over, read by ``slo_budget``); the evidence rules above
(false). Parsing and checks: :mod:`tokenplane_params`.

Evidence rules (params, default false; ``bench/autoscale_suite.py`` turns all on):
``symmetric_bursts``, ``capacity_lower_bounds``, ``trust_latency``, ``queue_buffer``,
``window_from_cold_start``, ``latency_queues``, ``warm_slo_share``, ``cancel_warming``,
``slo_budget`` and ``slo_defer``, each a rule read from what the pool measures; they are described
in :mod:`.evidence` (``slo_budget`` in :mod:`.budget`, ``slo_defer``, which needs ``slo_budget``
and ``slo_period_s``, in :func:`.budget.deferral`).

Cost: two O(history) forecast passes and one pass over the serving instances per decision.

How it fails: a prior far too high shrinks the pool only step by step into loads seen to work, but
a load that grows into the gap before a saturated window teaches it costs SLO; a burst shape not yet
seen (the first quiet-to-burst jump) is served late (the queue and SLO terms then add capacity, which
arrives after ``cold_start_s``); a burst memory shorter than the burst cycle forgets between bursts;
very noisy low-rate traffic inflates the headroom, which costs money, not SLO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tokenplane.core.autoscale.base import AUTOSCALERS
from tokenplane.core.autoscale.budget import affordable_size, deferral, held_by_budget
from tokenplane.core.autoscale.decision import ActionKind, Needs, ScaleDecision, ScaleReason
from tokenplane.core.autoscale.evidence import cancellable_warming, queue_within_slo, recovered
from tokenplane.core.autoscale.forecast import holt_forecast
from tokenplane.core.autoscale.learning import horizons, learn
from tokenplane.core.autoscale.plan import plan_actions
from tokenplane.core.autoscale.scale_down import record_decision, scale_down
from tokenplane.core.autoscale.scaler_state import ScalerState as ScalerState
from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec
from tokenplane.core.autoscale.tokenplane_params import TokenplaneParams, read_params
from tokenplane.core.registry import BuildContext, register

_EPS = 1e-9


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS)) if math.isfinite(x) else 1 << 30


class TokenplaneScaler:
    name = "tokenplane"

    def __init__(self, params: TokenplaneParams | None = None) -> None:
        self.params = params or TokenplaneParams()
        self._state = ScalerState()

    @property
    def state(self) -> ScalerState:
        return self._state

    def capacity_rps(self, spec: PoolSpec) -> float:
        return self._state.capacity_rps.get(spec.capacity_rps, bound=self.params.capacity_bound)

    # -- state changes -------------------------------------------------------------------------

    def observe(self, signal: PoolSignal, spec: PoolSpec) -> None:
        """Learn the burstiness of arrivals (see :mod:`burst`) and per-instance capacity from
        throughput at the observed latency (see :mod:`capacity`)."""
        self._state = learn(self._state, self.params, signal, spec)

    def commit(self, decision: ScaleDecision, *, now: float) -> None:
        """Record a decision that the shell carried out: cooldown clock and stabilisation window."""
        self._state = record_decision(self._state, self.params, decision, now=now)

    # -- the decision (pure) -------------------------------------------------------------------

    def decide(self, signal: PoolSignal, spec: PoolSpec, *, now: float) -> ScaleDecision:
        p = self.params
        n = len(signal.serving)
        cap = self.capacity_rps(spec)
        safe = self._state.safe_rps
        if p.learn_capacity and safe is not None:
            # Seen serving ``safe`` per instance with comfortable latency: sizing at utilisation u
            # of a capacity below safe / u would plan for less than has been shown to work.
            cap = min(spec.capacity_rps * p.capacity_bound, max(cap, safe / p.target_utilisation))
        fc_act = holt_forecast(
            signal.arrivals,
            horizon_s=spec.warm_activation_s + p.decision_interval_s,
            alpha=p.forecast_alpha,
            beta=p.forecast_beta,
            phi=p.forecast_phi,
            burst_k=p.burst_k,
        )
        fc_cold = holt_forecast(
            signal.arrivals,
            horizon_s=spec.cold_start_s + p.decision_interval_s,
            alpha=p.forecast_alpha,
            beta=p.forecast_beta,
            phi=p.forecast_phi,
            burst_k=p.burst_k,
        )
        backlog = signal.backlog
        rate_now = max(fc_act.level_rps, signal.throughput_rps or 0.0)
        mean_kv = signal.mean_kv_usage
        u, u_down = p.target_utilisation, p.target_utilisation - p.scale_down_hysteresis
        # Headroom from measured burstiness: size serving for the rise seen within an activation,
        # and serving + warm for the rise seen within a cold start (see :mod:`burst`).
        serve_rps, provision_rps = fc_act.upper_rps, max(fc_act.upper_rps, fc_cold.upper_rps)
        headroom = 1.0
        burst_provision_rps = 0.0
        remembered_rps = 0.0  # the remembered bursts' peak (latency_queues' scale-down floor)
        state = self._state
        if p.learn_burstiness:
            level, q = fc_act.level_rps, p.slo_target
            if p.symmetric_bursts and len(signal.arrivals) >= 2:
                # The level the rise samples are measured from (the last minute's mean, at least one
                # request per bucket): a smoothed level that decays toward 0 in a quiet spell would
                # scale the measured rise down to nothing.
                width = signal.arrivals[-1][0] - signal.arrivals[-2][0]
                if width > 0:
                    k = max(1, round(60.0 / width))
                    recent = signal.arrivals[-k:]
                    minute = sum(r for _, r in recent) / len(recent)
                    level = max(level, minute, 1.0 / width)
            serve_rps = max(serve_rps, state.burst_activation.size_for(level, q))
            remembered_rps = state.burst_activation.peak(q)
            burst_provision_rps = state.burst_cold.size_for(level, q) if state.burst_cold.samples else 0.0
            provision_rps = max(provision_rps, serve_rps, burst_provision_rps)
            headroom = state.burst_activation.headroom(q)
        if p.queue_buffer and spec.ttft_slo_s is not None:
            # A rise shorter than the TTFT budget allows can queue: capacity c over a horizon H
            # absorbs a peak r when the backlog (r - c) H drains within the SLO S, i.e. c >= r H /
            # (H + S). Applied to the rise above today's level only.
            h_act, h_cold = horizons(spec, p.decision_interval_s)
            level = fc_act.level_rps
            serve_rps = max(level, serve_rps * h_act / (h_act + spec.ttft_slo_s))
            remembered_rps = remembered_rps * h_act / (h_act + spec.ttft_slo_s)
            provision_rps = max(serve_rps, provision_rps * h_cold / (h_cold + spec.ttft_slo_s))
            # The same buffer for the measured cold-start rises alone (what the warm pool is sized
            # from while the demand term is held): otherwise the warm target flips by one instance
            # as the hold turns on and off, and each flip up is a cold start stopped when it lands.
            burst_provision_rps = max(level, burst_provision_rps * h_cold / (h_cold + spec.ttft_slo_s))

        def demand_need(util: float) -> int:
            need = _ceil(serve_rps / (cap * util))
            if spec.capacity_tokens_per_s is not None and signal.tokens_per_s_demand:
                cap_tps = self._state.capacity_tps.get(spec.capacity_tokens_per_s, bound=p.capacity_bound)
                need = max(need, _ceil(signal.tokens_per_s_demand / (cap_tps * util)))
            return need

        queue_ok = p.latency_queues and queue_within_slo(signal, spec, p)

        def queue_need(util: float) -> int:
            if backlog == 0 or (p.trust_latency and backlog < n):
                return 0  # trust_latency: under one waiting request per instance is routing jitter
            if queue_ok:
                return 0  # latency_queues: a backlog served within the SLO needs no draining
            return _ceil((rate_now + backlog / p.queue_drain_s) / (cap * util))

        # SLO feedback, gated on load (see module docstring).
        attainments = [a for a in (signal.ttft_attainment, signal.tbt_attainment) if a is not None]
        attainment = min(attainments) if attainments else None
        p90_breach = (
            spec.ttft_slo_s is not None
            and signal.ttft_p90_s is not None
            and signal.ttft_p90_s > spec.ttft_slo_s
        )
        at_risk = (attainment is not None and attainment < p.slo_target) or p90_breach
        loaded = backlog > 0 or mean_kv >= p.kv_high or (n > 0 and rate_now / (n * cap) >= p.slo_load_gate)
        slo_hold = n if at_risk and loaded else 0
        slo_up = 0
        if slo_hold:
            last_up = self._state.last_scale_up_s
            if last_up is None or now - last_up >= p.slo_step_interval_s:
                deficit = max(0.0, p.slo_target - (attainment if attainment is not None else p.slo_target))
                slo_up = n + max(1, _ceil(n * p.slo_gain * deficit / p.slo_target))
        kv_up = _ceil(n * mean_kv / p.kv_target) if mean_kv >= p.kv_high else 0
        kv_down = _ceil(n * mean_kv / p.kv_high)

        busy = 1 if (fc_act.upper_rps > 0 or backlog > 0) else 0
        demand_up = demand_need(u)
        # slo_budget (:mod:`.budget`): the estimated terms (demand, queue, warm pool) are capped at the
        # smallest size the run's banked SLO margin pays for; the measured ones (SLO, KV) are not.
        shrink_ok = True
        if p.slo_budget and n > 0:
            h_cold = horizons(spec, p.decision_interval_s)[1]
            period = p.slo_period_s
            remaining = None if period is None else period - now % period
            size = affordable_size(
                state.slo_budget, n, signal, target=p.slo_target, horizon_s=h_cold, remaining_s=remaining
            )
            afford = (n if at_risk else size) if size is not None else 1 << 30
            if p.slo_defer and period is not None and remaining is not None:
                # slo_defer (:func:`.budget.deferral`): while a purchase can wait for the period to
                # tell whether it is needed, the estimated terms and the KV term hold at n; otherwise
                # the KV term goes one size up at a time (the projection needs one more to earn the
                # shortfall back, and KV use at 0.9+ asks for a third more at once). The demand
                # estimate (before any cap) tells it whether the capacity learned so far calls n short.
                defer = deferral(
                    state.slo_budget,
                    n,
                    signal,
                    target=p.slo_target,
                    horizon_s=h_cold,
                    elapsed_s=period - remaining,
                    remaining_s=remaining,
                    interval_s=p.decision_interval_s,
                    short_by_estimate=demand_up > n,
                )
                if defer.hold:
                    afford = min(afford, n)
                kv_up = min(kv_up, n if defer.hold else n + 1)
                shrink_ok = defer.shrink
        else:
            afford = 1 << 30
        demand_up = min(demand_up, afford)
        held = False
        ceiling = state.capacity_rps.ceiling
        # latency_queues: a ceiling below a rate served comfortably is refuted (its saturated window
        # measured something other than the pool at its limit); the estimate is as unproven as with
        # no ceiling at all.
        unproven = ceiling is None or (p.latency_queues and safe is not None and safe > ceiling)
        unproven_comfort = bool(
            p.trust_latency
            and unproven
            and (backlog < max(1, n) or queue_ok)
            and not at_risk
            and mean_kv < p.kv_high
            and spec.ttft_slo_s is not None
            and signal.ttft_p90_s is not None
            and signal.ttft_p90_s <= p.comfort_fraction * spec.ttft_slo_s
        )
        if unproven_comfort and demand_up > n:
            # No saturated window yet, so the capacity estimate is a prior or a lower bound (the
            # most served); the pool meets the SLO with room now. Adding GPUs on that estimate
            # would buy capacity the latency says is not needed: hold, and let the queue, SLO and
            # KV terms (measured, not estimated) add capacity when the load reaches the knee.
            demand_up = n
            held = True
        terms = (
            (ScaleReason.FORECAST_RISE, demand_up),
            (ScaleReason.QUEUE_GROWING, min(queue_need(u), afford)),
            (ScaleReason.SLO_AT_RISK, max(slo_up, slo_hold)),
            (ScaleReason.KV_PRESSURE, kv_up),
        )
        driver, raw_up = max(terms, key=lambda t: t[1])  # first of equal maxima: demand wins ties
        raw_up = max(raw_up, busy)
        # What the stabilisation window remembers excludes the backlog term: it is transient by
        # construction (sized to empty the queue), and holding a drained queue's peak for a whole
        # window is pure cost. The window guards against demand noise; the cooldown guards churn.
        lasting = max(
            terms[0][1], terms[2][1], kv_up, min(demand_need(u_down), afford), slo_hold, kv_down, busy
        )
        raw_down = max(lasting, terms[1][1], min(queue_need(u_down), afford))
        provision = min(_ceil(provision_rps / (cap * u)), afford)
        if held or (p.latency_queues and unproven_comfort):
            # Nor pre-warm on it: only the rises measured within a cold start size the warm pool
            # (latency_queues: whenever the latency vouches for the pool, held or not).
            provision = max(min(provision, n), _ceil(burst_provision_rps / (cap * u)))
        provision = min(provision, afford)  # slo_budget: the warm pool is an estimated term too
        if p.warm_slo_share and attainment is not None and attainment >= p.slo_target and not p90_breach:
            # The SLO asks that slo_target of requests be served in time, not all: while it is met,
            # the warm pool covers that share of the peak forecast within a cold start (an upper
            # bound already: peak + margin), the rest being the slack the SLO allows.
            provision = min(provision, _ceil(p.slo_target * provision_rps / (cap * u)))
        # Shrink only into a per-instance load seen served comfortably (plus one probe step): the
        # capacity estimate may still be the prior, and TTFT has a cliff, not a slope.
        if p.learn_capacity and spec.ttft_slo_s is not None:
            proven = safe * (1.0 + p.capacity_probe) if safe is not None else 0.0
            if proven < cap:
                raw_down = max(raw_down, n if proven <= 0 else _ceil(serve_rps / proven))
            if p.latency_queues and safe is not None:
                # The probe step above is checked by the latency of the load now; a remembered burst
                # checks it only when it returns, and capacity shed for it then takes a cold start
                # to come back: size for the remembered bursts at what has been served comfortably.
                raw_down = max(raw_down, _ceil(remembered_rps / safe))
        if afford < 1 << 30:  # slo_budget: its size is the floor while it holds the pool
            raw_down = min(raw_down, max(afford, lasting))
            if afford < n or held_by_budget(state.slo_budget, n, signal):
                raw_down = max(raw_down, afford)
        if not shrink_ok:  # slo_defer: the size below is not paid for
            raw_down = max(raw_down, n)
        if not signal.arrivals:
            raw_down = max(raw_down, n)  # no complete bucket measured yet: nothing to size down on

        lo, hi = spec.min_instances, spec.max_instances
        needs = Needs(
            demand=terms[0][1],
            queue=terms[1][1],
            slo=terms[2][1],
            kv=kv_up,
            provision=provision,
            scale_down_to=raw_down,
            forecast_rps=serve_rps,
            capacity_rps=cap,
            provision_rps=provision_rps,
            headroom=headroom,
            capacity_prior_share=state.capacity_rps.prior_share,
        )

        if raw_up > n:
            target = min(max(raw_up, lo), hi)
            recommendation = min(max(lasting, lo), hi)
            if raw_up > hi:
                reason, note = ScaleReason.AT_MAX, f"need {raw_up} ({driver.value}) > max {hi}"
            else:
                reason, note = driver, self._note(driver, needs, backlog, attainment, mean_kv)
        else:
            recommendation = min(max(lasting, lo), hi)
            floor = min(max(raw_down, lo), hi)
            target, reason, note = scale_down(self._state, p, n, floor, raw_up, spec, now)
            tight = (
                spec.ttft_slo_s is not None
                and signal.ttft_p90_s is not None
                and signal.ttft_p90_s > p.comfort_fraction * spec.ttft_slo_s
            )
            if target < n and tight and reason is ScaleReason.OVERPROVISIONED:
                # Latency is the ground truth the capacity estimate approximates: with TTFT p90
                # past comfort_fraction of the SLO the pool is near its knee, whatever the
                # estimate says, so it does not shrink.
                assert signal.ttft_p90_s is not None and spec.ttft_slo_s is not None
                target, reason = n, ScaleReason.STEADY
                note = (
                    f"TTFT p90 {signal.ttft_p90_s:.2f}s > {p.comfort_fraction:.2f} x SLO "
                    f"{spec.ttft_slo_s:.2f}s: not shrinking"
                )

        target_warm = max(spec.warm_pool_size, provision - target)
        target_warm = max(0, min(target_warm, hi - target))
        max_cold: int | None = None
        if p.window_from_cold_start:
            # A cold start lands a cold start from now: buy one only for a need the previous
            # decision asked for too. A need that lasts less than a decision interval (a KV spike, a
            # backlog the pool drains, an estimate flickering across a whole number of instances)
            # is gone long before the instance lands, which is then stopped idle, a cold start of
            # GPU time for nothing. Warm activations (seconds) are not held back.
            held_now = n + len(signal.warm) + len(signal.warming)
            prev = self._state.last_asked
            # Before the first decision, what is held is what was asked for (the initial pool).
            max_cold = min(target + target_warm, held_now if prev is None else prev) - held_now
        cancel = 0
        if p.cancel_warming:  # see :mod:`.evidence`
            asked, previous = target + target_warm, self._state.last_asked
            failing = slo_hold > 0 and not recovered(signal, spec, p)
            cancel = cancellable_warming(signal, asked, previous=previous, slo_failing=failing)
        actions = plan_actions(
            signal,
            spec,
            target_serving=target,
            target_warm=target_warm,
            park_drained=p.park_drained,
            max_cold_starts=max_cold,
            cancel_warming=cancel,
        )
        if reason is ScaleReason.STEADY and any(
            a.kind in (ActionKind.START_COLD, ActionKind.STOP_WARM, ActionKind.CANCEL_WARMING)
            for a in actions
        ):
            if provision - target > spec.warm_pool_size:
                reason, note = (
                    ScaleReason.FORECAST_RISE,
                    f"pre-warming {target_warm} for {provision_rps:.2f} req/s within a cold start",
                )
            else:
                reason, note = ScaleReason.WARM_BACKFILL, f"warm pool to {target_warm}"
        return ScaleDecision(
            target_serving=target,
            target_warm=target_warm,
            reason=reason,
            actions=actions,
            current_serving=n,
            recommendation=recommendation,
            needs=needs,
            note=note,
        )

    @staticmethod
    def _note(driver: ScaleReason, needs: Needs, backlog: int, attainment: float | None, kv: float) -> str:
        if driver is ScaleReason.QUEUE_GROWING:
            return f"backlog {backlog} needs {needs.queue} at {needs.capacity_rps:.2f} req/s each"
        if driver is ScaleReason.SLO_AT_RISK:
            return f"attainment {attainment} needs {needs.slo}"
        if driver is ScaleReason.KV_PRESSURE:
            return f"mean KV use {kv:.2f} needs {needs.kv}"
        return (
            f"{needs.forecast_rps:.2f} req/s (headroom x{needs.headroom:.2f} measured) needs "
            f"{needs.demand} at {needs.capacity_rps:.2f} req/s each "
            f"(prior {100 * needs.capacity_prior_share:.0f}% of it); "
            f"{needs.provision_rps:.2f} req/s within a cold start needs {needs.provision} with warm"
        )


@register(AUTOSCALERS, "tokenplane")
def _build(params: Mapping[str, Any], ctx: BuildContext) -> TokenplaneScaler:
    return TokenplaneScaler(read_params(params))
