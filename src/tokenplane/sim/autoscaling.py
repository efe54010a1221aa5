"""The twin's autoscaling shell: measure the pool, ask the core's autoscaler, carry out its actions.

Scenario key (validated at load through the core's :func:`build_autoscaler` and
:func:`parse_pool_spec`)::

    autoscaler:
      name: tokenplane            # or hpa, static
      params: {...}               # the scaler's own params
      pool: {capacity_rps: 2.0, min_instances: 2, warm_pool_size: 1, ...}   # PoolSpec fields
      decision_interval_s: 15     # how often the loop runs (and after every landed cold start)
      initial_serving: null       # serving at t = 0; default: static's instances, else max(1, min)
      arrival_bucket_s: 15        # width of the arrival-rate buckets handed to the forecast
      history_buckets: 120        # how many complete buckets the signal carries
      slo_window_s: 60            # window of the TTFT/TBT attainment signals

Pool defaults and the initial state: :mod:`tokenplane.sim.autoscaling_setup`.

Signal, per decision at ``now``:

* ``serving`` = views of serving and activating instances (activating with ``ready=False``),
  ``warm``/``warming``/``draining`` = ids by lifecycle state; ``queued`` = 0 (the twin has no
  gateway queue: a request with no ready instance fails with ``no_instance``);
* ``arrivals`` = per-bucket arrival rates of the last ``history_buckets`` complete buckets, counted
  from the request records (appended in arrival order, so no per-request cost is added);
  ``prompt_tokens_per_s`` = their prompt tokens per second over the last minute of those buckets;
* ``ttft_attainment`` / ``ttft_p90_s``: over the requests that arrived in
  ``[now - slo_window_s - ttft_slo, now - ttft_slo]``, whose TTFT outcome is already decided at
  ``now`` (a request still without a first token counts as a miss, its TTFT as at least its wait).
  This reacts one SLO after arrival rather than after the (long, for reasoning outputs) completion;
* ``tbt_attainment`` / ``tbt_p90_s``: TPOT of requests that finished within ``slo_window_s``;
* ``throughput_rps`` / ``throughput_tps``: completions (and their output tokens) since the previous
  decision, per second;
* ``utilisation``: mean GPU busy fraction of the ready serving instances since the previous
  decision (what the HPA baseline scales on).

Actions: ``ACTIVATE_WARM`` takes the lowest-numbered warm instances, ``START_COLD`` the
lowest-numbered stopped ones, ``STOP_WARM`` the highest-numbered warm ones, ``CANCEL_WARMING``
the most recently started warming ones (stopped at once, see :mod:`tokenplane.sim.lifecycle`), ``DRAIN`` and
``DRAIN_TO_WARM`` the ids named. One pool: a heterogeneous fleet is scaled as one pool (its
capacity prior is per instance, whatever the GPU).

Recorded: ``fleet_timeline`` ``[t_s, serving, warming]`` (serving = ready serving instances;
warming = cold starts plus activations in progress), ``warm_timeline`` ``[t_s, warm_idle,
draining]``, ``scale_decisions`` (decisions by reason), ``scale_actions`` (instances per action
kind) and ``scale_log`` (every decision that acted: ``[t_s, reason, target_serving, note]``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from tokenplane.core.autoscale import (
    ActionKind,
    Autoscaler,
    PoolSignal,
    PoolSpec,
    ScaleDecision,
    TokenplaneScaler,
)
from tokenplane.core.autoscale.signals import prompt_tokens_rate
from tokenplane.core.views import InstanceView
from tokenplane.sim.autoscaling_setup import build_scaler_and_pool as build_scaler_and_pool
from tokenplane.sim.autoscaling_setup import group_price as group_price
from tokenplane.sim.autoscaling_setup import group_timings as group_timings
from tokenplane.sim.autoscaling_setup import initial_states as initial_states
from tokenplane.sim.engine import ContinuousEngine, Seq
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.lifecycle import (
    ACTIVATING,
    DRAINING,
    SERVING,
    STOPPED,
    WARM,
    WARMING,
    Lifecycle,
)
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.report import Slo
from tokenplane.sim.scenario import AutoscalerSettings


class AutoscalingShell:
    """Runs the observe / decide / act / commit loop of one autoscaler over the twin's fleet."""

    def __init__(
        self,
        *,
        loop: EventLoop,
        engines: Sequence[ContinuousEngine],
        records: list[RequestRecord],
        lifecycle: Lifecycle,
        scaler: Autoscaler,
        spec: PoolSpec,
        settings: AutoscalerSettings,
        ttft_slo_s: float,
        tbt_slo_s: float,
        active: Any,
    ) -> None:
        self.loop = loop
        self.engines = list(engines)
        self.records = records
        self.lc = lifecycle
        self.scaler = scaler
        self.spec = spec
        self.cfg = settings
        self.ttft_slo = ttft_slo_s
        self.tbt_slo = tbt_slo_s
        self._active = active  # () -> bool: work is left (arrivals to come or requests in flight)
        self._bucket_counts: dict[int, int] = {}
        self._bucket_tokens: dict[int, int] = {}  # prompt tokens arrived per bucket
        self._arr_idx = 0
        self._finishes: deque[tuple[float, float | None, int]] = deque()  # (t, tpot, output tokens)
        self._last_t = 0.0
        self._last_busy = [0.0] * len(self.engines)
        self._max_seqs = [getattr(getattr(e, "cfg", None), "max_num_seqs", 1) for e in self.engines]
        self._done_since_last = 0
        self._tokens_since_last = 0
        self.fleet_timeline: list[list[float]] = []
        self.warm_timeline: list[list[float]] = []
        self.decisions: dict[str, int] = {}
        self.actions: dict[str, int] = {}
        self.log: list[list[Any]] = []

    # -- wiring --------------------------------------------------------------------------------
    def start(self) -> None:
        self._record(0.0)
        self.loop.schedule(self.cfg.decision_interval_s, self._tick)

    def on_finish(self, seq: Seq, now: float) -> None:
        rec = seq.record
        out = seq.spec.output_tokens
        tpot = None
        if rec.first_token_s is not None and out >= 2:
            tpot = (now - rec.first_token_s) / (out - 1)
        self._finishes.append((now, tpot, out))
        self._done_since_last += 1
        self._tokens_since_last += out
        if self.lc.draining:
            i = self.lc.index.get(rec.instance_id or "")
            if i is not None:
                self.lc.check_drained(i, now)

    def on_landed(self, now: float) -> None:
        self.decide(now)

    def _tick(self, now: float, _: object) -> None:
        self.decide(now)
        if self._active():
            self.loop.schedule(now + self.cfg.decision_interval_s, self._tick)

    # -- the loop ------------------------------------------------------------------------------
    def decide(self, now: float) -> ScaleDecision:
        self.lc.check_all_drained(now)  # aborts can empty a draining instance without a finish
        signal = self.signal(now)
        self.scaler.observe(signal, self.spec)
        decision = self.scaler.decide(signal, self.spec, now=now)
        acted = self._apply(decision, now)
        self.scaler.commit(decision, now=now)
        reason = decision.reason.value
        self.decisions[reason] = self.decisions.get(reason, 0) + 1
        if acted:
            self.log.append([round(now, 3), reason, decision.target_serving, decision.note])
        self._record(now)
        return decision

    def _apply(self, decision: ScaleDecision, now: float) -> bool:
        lc = self.lc
        acted = False
        for action in decision.actions:
            kind = action.kind
            if kind is ActionKind.NOOP:
                continue
            if kind is ActionKind.ACTIVATE_WARM:
                chosen = lc.ids_in(WARM)[: action.count]
                for i in chosen:
                    lc.activate(i, now)
            elif kind is ActionKind.START_COLD:
                chosen = lc.ids_in(STOPPED)[: action.count]
                for i in chosen:
                    lc.start_cold(i, now)
            elif kind is ActionKind.STOP_WARM:
                chosen = lc.ids_in(WARM)[::-1][: action.count]
                for i in chosen:
                    lc.stop_warm(i, now)
            elif kind is ActionKind.CANCEL_WARMING:
                chosen = lc.warming_newest_first()[: action.count]
                for i in chosen:
                    lc.cancel_warming(i, now)
            else:  # DRAIN / DRAIN_TO_WARM
                park = kind is ActionKind.DRAIN_TO_WARM
                chosen = [lc.index[iid] for iid in action.instance_ids if iid in lc.index]
                for i in chosen:
                    if lc.state[i] in (SERVING, ACTIVATING):
                        lc.drain(i, now, park=park)
            if chosen:
                acted = True
                self.actions[kind.value] = self.actions.get(kind.value, 0) + len(chosen)
        return acted

    def _record(self, now: float) -> None:
        lc = self.lc
        self.fleet_timeline.append([now, lc.count(SERVING), lc.count(WARMING) + lc.count(ACTIVATING)])
        self.warm_timeline.append([now, lc.count(WARM), lc.count(DRAINING)])

    # -- measuring -----------------------------------------------------------------------------
    def _arrivals(self, now: float) -> tuple[tuple[float, float], ...]:
        width = self.cfg.arrival_bucket_s
        counts, tokens = self._bucket_counts, self._bucket_tokens
        records = self.records
        i = self._arr_idx
        n = len(records)
        while i < n and records[i].arrival_s < now:
            k = int(records[i].arrival_s // width)
            counts[k] = counts.get(k, 0) + 1
            tokens[k] = tokens.get(k, 0) + records[i].prompt_tokens
            i += 1
        self._arr_idx = i
        current = int(now // width)  # the bucket in progress is not complete
        first = max(0, current - self.cfg.history_buckets)
        for k in [k for k in counts if k < first]:
            del counts[k]
            tokens.pop(k, None)
        return tuple((k * width, counts.get(k, 0) / width) for k in range(first, current))

    def _prompt_tps(self, now: float) -> float | None:
        """Prompt tokens per second arrived (the demand in tokens: a prefill-bound pool's load,
        whatever the request count does)."""
        return prompt_tokens_rate(self._bucket_tokens, now, self.cfg.arrival_bucket_s)

    def _ttft(self, now: float) -> tuple[float | None, float | None]:
        slo = self.ttft_slo
        hi_t = now - slo
        lo_t = hi_t - self.cfg.slo_window_s
        if hi_t <= 0:
            return None, None
        records = self.records
        lo = bisect.bisect_left(records, lo_t, key=lambda r: r.arrival_s)
        hi = bisect.bisect_right(records, hi_t, key=lambda r: r.arrival_s)
        if hi <= lo:
            return None, None
        met = 0
        ttfts: list[float] = []
        for r in records[lo:hi]:
            if r.first_token_s is not None:
                t = r.first_token_s - r.arrival_s
                if t <= slo:
                    met += 1
            else:
                t = now - r.arrival_s  # still waiting (or failed): at least this long
            ttfts.append(t)
        ttfts.sort()
        return met / len(ttfts), ttfts[min(len(ttfts) - 1, math.ceil(0.9 * len(ttfts)) - 1)]

    def _tbt(self, now: float) -> tuple[float | None, float | None]:
        fin = self._finishes
        horizon = now - self.cfg.slo_window_s
        while fin and fin[0][0] < horizon:
            fin.popleft()
        tpots = sorted(t for _, t, _ in fin if t is not None)
        if not tpots:
            return None, None
        met = sum(1 for t in tpots if t <= self.tbt_slo)
        return met / len(tpots), tpots[min(len(tpots) - 1, math.ceil(0.9 * len(tpots)) - 1)]

    def signal(self, now: float) -> PoolSignal:
        lc = self.lc
        serving: list[InstanceView] = []
        busy = 0.0
        ready = 0
        span = now - self._last_t
        for i, e in enumerate(self.engines):
            state = lc.state[i]
            b = e.busy_seconds(now)
            if state in (SERVING, ACTIVATING):
                view = e.view()
                serving.append(view)
                if state == SERVING and span > 0:
                    metric = self.cfg.utilisation_metric
                    if metric == "kv_usage":
                        busy += view.kv_usage
                    elif metric == "batch_fill":
                        busy += min(1.0, view.running / max(1, self._max_seqs[i]))
                    else:
                        busy += min(1.0, max(0.0, (b - self._last_busy[i]) / span))
                    ready += 1
            self._last_busy[i] = b
        ttft_att, ttft_p90 = self._ttft(now)
        tbt_att, tbt_p90 = self._tbt(now)
        rps = tps = None
        if span > 0:
            rps = self._done_since_last / span
            tps = self._tokens_since_last / span
        self._done_since_last = 0
        self._tokens_since_last = 0
        self._last_t = now
        ids = [e.id for e in self.engines]
        arrivals = self._arrivals(now)  # counts the prompt tokens _prompt_tps reads
        return PoolSignal(
            now=now,
            serving=tuple(serving),
            warm=tuple(ids[i] for i in lc.ids_in(WARM)),
            warming=tuple(ids[i] for i in lc.ids_in(WARMING)),
            draining=tuple(ids[i] for i in lc.ids_in(DRAINING)),
            queued=0,
            arrivals=arrivals,
            prompt_tokens_per_s=self._prompt_tps(now),
            throughput_rps=rps,
            throughput_tps=tps,
            ttft_attainment=ttft_att,
            tbt_attainment=tbt_att,
            ttft_p90_s=ttft_p90,
            tbt_p90_s=tbt_p90,
            utilisation=busy / ready if ready else None,
        )

    # -- report --------------------------------------------------------------------------------
    def report_extra(self) -> dict[str, Any]:
        return {
            "autoscaler": self.cfg.name,
            "fleet_timeline": self.fleet_timeline,
            "warm_timeline": self.warm_timeline,
            "scale_decisions": dict(sorted(self.decisions.items())),
            "scale_actions": dict(sorted(self.actions.items())),
            "scale_log": self.log,
            "pool": {
                "max_instances": self.spec.max_instances,
                "min_instances": self.spec.min_instances,
                "warm_pool_size": self.spec.warm_pool_size,
                "capacity_rps": self.spec.capacity_rps,
                "cold_start_s": self.spec.cold_start_s,
                "warm_activation_s": self.spec.warm_activation_s,
                **self._learned(),
            },
        }

    def _learned(self) -> dict[str, Any]:
        """What a learning scaler ended the run believing (capacity per instance, headroom)."""
        scaler = self.scaler
        if not isinstance(scaler, TokenplaneScaler):
            return {}
        state = scaler.state
        q = scaler.params.slo_target
        learned: dict[str, Any] = {
            "learned_capacity_rps": scaler.capacity_rps(self.spec),
            "capacity_prior_share": state.capacity_rps.prior_share,
            "headroom_activation": state.burst_activation.headroom(q),
            "headroom_cold_start": state.burst_cold.headroom(q),
        }
        if scaler.params.slo_budget:  # what each pool size was seen to do, and the run's bank
            budget = state.slo_budget
            learned["slo_budget"] = {
                "banked_requests": budget.banked(q),
                "sizes": {
                    str(r.size): {
                        "worst_window_attainment": r.worst_attainment,
                        "max_rps": r.max_rps,
                        "max_prompt_tokens_per_s": r.max_prompt_tps,
                    }
                    for r in sorted(budget.sizes, key=lambda r: r.size)
                },
            }
        return learned


def autoscale_report(result: Any, report: Mapping[str, Any], slo: Slo, *, bucket_s: float) -> dict[str, Any]:
    """Report keys of an autoscaled run beside the usual ones.

    ``ttft_slo_attainment``: requests (all of them, failed ones included in the denominator) that
    completed with TTFT within the SLO, whatever their TPOT (``slo_attainment`` asks both).
    ``cost_usd`` is ``gpu_cost_usd`` (GPU-hours held, at each instance's price).
    ``demand_timeline`` ``[t_s, arrivals per s]`` and ``slo_timeline`` ``[t_s, TTFT attainment]``
    per arrival bucket (``None`` where nothing arrived), for the fleet timeline plot.
    """
    records: Sequence[RequestRecord] = result.records
    total = len(records)
    met = 0
    arrivals: dict[int, int] = {}
    within: dict[int, int] = {}
    for r in records:
        k = int(r.arrival_s // bucket_s)
        arrivals[k] = arrivals.get(k, 0) + 1
        if r.ok and r.first_token_s is not None and r.first_token_s - r.arrival_s <= slo.ttft_s:
            met += 1
            within[k] = within.get(k, 0) + 1
    last = max(arrivals) if arrivals else -1
    return {
        "ttft_slo_attainment": met / total if total else None,
        "cost_usd": report.get("gpu_cost_usd"),
        "demand_timeline": [[k * bucket_s, arrivals.get(k, 0) / bucket_s] for k in range(last + 1)],
        "slo_timeline": [
            [k * bucket_s, within.get(k, 0) / arrivals[k] if arrivals.get(k) else None]
            for k in range(last + 1)
        ],
    }
