"""The ``slo_budget`` evidence rule: the SLO as a run-level error budget, not a per-window bar.

The SLO asks that ``slo_target`` of the run's requests meet it. A pool that has served better than
that has banked the difference (``met - slo_target × seen``, in requests), and may spend it on
running one instance short, *if* the worst it has been seen to do at that size, at the load now,
costs less than the bank over the time it takes to come back (a cold start plus a decision): sizes
never measured, or measured only at a lower load than now, are not afforded (no extrapolation).
"At the load now" is the worst window in the load's band (bands 10 % wide, geometric; else the
nearest measured band above): a miss in a burst far above today's load prices today's load only
when the load is that high again (priced as the worst ever, one such miss held the pool a size up
until the bank covered the burst's shortfall at today's rate). While a size is afforded, the
estimated terms (demand, queue, warm pool, the one the remembered bursts ask for included) are
capped at it; the measured ones (the
SLO and KV terms) are not, so a window that fails brings capacity back as before; and while the
budget holds the pool below what a larger, measured pool carried at this load, the pool shrinks no
further on the estimate (the sizes below are unmeasured there).

What is measured (:func:`observe_budget`, from each signal): the bank, from each window's
attainment weighted by the requests served over a decision interval (windows overlap and lag by
the SLO, so this is an estimate of the run's attainment); and per ready pool size, the worst window
attainment (overall and per load band) and the highest load seen at that size in each unit
(arrivals/s always, prompt tokens/s when the shell measures them), once the size has held for a
cold start plus the SLO plus a decision (so the window measured that size, not the one before). A
record is compared with the load now in the unit the signal has now (:func:`carried`: prompt
tokens/s when measured, else arrivals/s); a record with no maximum in that unit has not been
measured at the load now.

With ``slo_period_s`` (the SLO judged per period, not over the whole run: the twin's suite judges
each run as one period) the bank starts again with each period, and it may also count what the size
above will earn back before the period ends: if the pool runs one short for the horizon and then
returns to that size, the size's mean attainment over its settled windows over the target, times
the requests left in the period after the horizon (at the rate now). A size above not measured at
the load now or more earns nothing; near the period's end the rule is the bank's alone. Periods are
consecutive ``slo_period_s`` of the clock the shell stamps its signals with (the twin: from the
run's start).

With ``slo_defer`` as well (:func:`deferral`) the period also times the purchases: a pool that
can still end the period on target by buying later holds its size (the estimated terms and the KV
term are capped at it), and goes one size down only where the bank pays for that size's worst
window near the load now.

State is a few floats per pool size; every function is pure.
"""

from __future__ import annotations

import math

import msgspec

from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec

__all__ = [
    "Deferral",
    "SizeRecord",
    "SloBudget",
    "affordable_size",
    "band",
    "carried",
    "deferral",
    "held_by_budget",
    "load",
    "observe_budget",
    "recent_rate",
]


class SizeRecord(msgspec.Struct, frozen=True):
    """What one ready pool size has been seen to do: its worst window and the most load it carried,
    in each unit (the prompt-token one only once a signal measured prompt tokens at that size)."""

    size: int
    worst_attainment: float
    max_rps: float  # most arrivals/s (:func:`recent_rate`) carried
    max_prompt_tps: float | None = None  # most prompt tokens/s carried; None: never measured
    # The worst window per load band: (in prompt tokens/s?, :func:`band` of :func:`load`, worst).
    bands: tuple[tuple[bool, int, float], ...] = ()
    met: float = 0.0  # requests estimated to have met the SLO at this size (settled windows)
    seen: float = 0.0  # requests estimated to have been judged at this size

    def mean_attainment(self) -> float | None:
        return self.met / self.seen if self.seen > 0 else None

    def observed(self, signal: PoolSignal, attainment: float, weight: float) -> SizeRecord:
        """This record after one more settled window at its size, ``weight`` requests judged."""
        tps = signal.prompt_tokens_per_s
        if tps is not None and self.max_prompt_tps is not None:
            tps = max(tps, self.max_prompt_tps)
        return SizeRecord(
            self.size,
            min(self.worst_attainment, attainment),
            max(self.max_rps, recent_rate(signal)),
            self.max_prompt_tps if tps is None else tps,
            _banded(self.bands, signal, attainment),
            self.met + attainment * weight,
            self.seen + weight,
        )

    def worst_at(self, signal: PoolSignal, load_now: float) -> float:
        """The worst window seen at the load ``load_now`` (in :func:`load`'s unit now): in the band
        of ``load_now``, else in the nearest band above it that was measured, else the worst window
        ever (a record measured only below: not carried anyway)."""
        unit, key = signal.prompt_tokens_per_s is not None, band(load_now)
        # One entry per (unit, band): the lowest band at or above the load's is its own, else the
        # nearest measured above.
        above = [(k, w) for u, k, w in self.bands if u == unit and k >= key]
        return min(above)[1] if above else self.worst_attainment


BAND_RATIO = 1.1  # load bands: each 10 % above the one below


def band(load_value: float) -> int:
    """The load band ``load_value`` falls in (bands are ``BAND_RATIO`` wide, geometric)."""
    return math.floor(math.log(max(load_value, 1e-9)) / math.log(BAND_RATIO))


def _banded(
    bands: tuple[tuple[bool, int, float], ...], signal: PoolSignal, attainment: float
) -> tuple[tuple[bool, int, float], ...]:
    unit, key = signal.prompt_tokens_per_s is not None, band(load(signal))
    old = next((w for u, k, w in bands if u == unit and k == key), 1.0)
    rest = tuple(b for b in bands if not (b[0] == unit and b[1] == key))
    return (*rest, (unit, key, min(old, attainment)))


class SloBudget(msgspec.Struct, frozen=True):
    """The run's banked SLO margin and what each pool size has been seen to do."""

    met: float = 0.0  # requests estimated to have met the TTFT SLO
    seen: float = 0.0  # requests estimated to have been judged
    sizes: tuple[SizeRecord, ...] = ()
    ready: int | None = None  # ready pool size at the last signal
    ready_since_s: float | None = None  # when it became that size
    period: int | None = None  # which SLO period the bank is for (``now // period_s``)

    def banked(self, target: float) -> float:
        """Requests the run can still miss and meet ``target`` (negative: behind)."""
        return self.met - target * self.seen

    def record(self, size: int) -> SizeRecord | None:
        return next((r for r in self.sizes if r.size == size), None)


def observe_budget(
    budget: SloBudget, signal: PoolSignal, spec: PoolSpec, *, interval_s: float, period_s: float | None = None
) -> SloBudget:
    """The budget after one signal; with ``period_s`` the bank starts again at each period
    (periods are ``[k × period_s, (k + 1) × period_s)`` of the clock the signal is stamped with),
    what each size was seen to do carries over."""
    ready = sum(1 for v in signal.serving if v.ready and v.healthy)
    since = budget.ready_since_s
    if ready != budget.ready or since is None:
        since = signal.now
    met, seen = budget.met, budget.seen
    period = None if period_s is None else math.floor(signal.now / period_s)
    if period != budget.period:
        met, seen = 0.0, 0.0
    att, served = signal.ttft_attainment, signal.throughput_rps
    weight = served * interval_s if served is not None and served > 0 else 0.0
    if att is not None and weight > 0:
        met, seen = met + att * weight, seen + weight
    sizes = budget.sizes
    settled = spec.cold_start_s + (spec.ttft_slo_s or 0.0) + interval_s
    if att is not None and ready > 0 and signal.now - since >= settled:
        old = budget.record(ready) or SizeRecord(ready, 1.0, 0.0)  # never seen: nothing measured
        rec = old.observed(signal, att, weight)
        sizes = (*(r for r in sizes if r.size != ready), rec)
    return SloBudget(met, seen, sizes, ready, since, period)


def affordable_size(
    budget: SloBudget,
    n: int,
    signal: PoolSignal,
    *,
    target: float,
    horizon_s: float,
    remaining_s: float | None = None,
) -> int | None:
    """The smallest of ``n - 1`` and ``n`` measured at the load now or more, whose worst window at
    the load now (:meth:`SizeRecord.worst_at`) the bank covers for ``horizon_s`` at the arrival rate
    now (``None``: neither; nothing changes).

    With ``remaining_s`` (the time left in the period the SLO is judged over), the bank also counts
    what the size above will earn back over the rest of the period if the pool returns to it after
    the horizon: its mean settled attainment over the target, at the rate now; only a size above
    measured at the load now or more (:func:`carried`) earns anything."""
    bank, rate_rps, load_now = budget.banked(target), recent_rate(signal), load(signal)
    for size in (n - 1, n):
        rec = budget.record(size)
        if size < 1 or rec is None or not carried(rec, signal):
            continue
        cost = max(0.0, target - rec.worst_at(signal, load_now)) * rate_rps * horizon_s
        credit = bank + _earned(budget.record(size + 1), signal, target, rate_rps, remaining_s, horizon_s)
        if credit > 0 and credit >= cost:
            return size
    return None


def _earned(
    above: SizeRecord | None,
    signal: PoolSignal,
    target: float,
    rate_rps: float,
    remaining_s: float | None,
    horizon_s: float,
) -> float:
    if remaining_s is None or above is None or not carried(above, signal):
        return 0.0
    mean = above.mean_attainment()
    margin = 0.0 if mean is None else mean - target
    return max(0.0, margin) * rate_rps * max(0.0, remaining_s - horizon_s)


def recent_rate(signal: PoolSignal) -> float:
    """Arrivals per second over the last minute of complete buckets (throughput when none)."""
    arrivals = signal.arrivals
    if len(arrivals) >= 2 and arrivals[-1][0] > arrivals[-2][0]:
        width = arrivals[-1][0] - arrivals[-2][0]
        recent = arrivals[-max(1, round(60.0 / width)) :]
        return sum(r for _, r in recent) / len(recent)
    return signal.throughput_rps or 0.0


def load(signal: PoolSignal) -> float:
    """The load a size's record is compared on: prompt tokens per second asked when the shell
    measures them (a prefill-bound pool's work follows tokens, not requests), else arrivals per
    second."""
    if signal.prompt_tokens_per_s is not None:
        return signal.prompt_tokens_per_s
    return recent_rate(signal)


def carried(rec: SizeRecord, signal: PoolSignal) -> bool:
    """Whether ``rec``'s size was measured at the load now or more, like with like: prompt tokens/s
    when the signal has them (a record without them was not measured in that unit), else arrivals/s."""
    if signal.prompt_tokens_per_s is not None:
        return rec.max_prompt_tps is not None and rec.max_prompt_tps >= signal.prompt_tokens_per_s
    return rec.max_rps >= recent_rate(signal)


def held_by_budget(budget: SloBudget, n: int, signal: PoolSignal) -> bool:
    """Whether a larger pool has been measured at the load now: then a pool of ``n`` that the
    budget affords is where the budget (not the estimate) brought it, and it shrinks no further
    on the estimate (sizes below are unmeasured at this load)."""
    rec = budget.record(n + 1)
    return rec is not None and carried(rec, signal)


def _mean_margin(rec: SizeRecord | None, signal: PoolSignal, target: float) -> float | None:
    """A size's mean settled attainment over the target, if it was measured at the load now or more."""
    if rec is None or not carried(rec, signal):
        return None
    mean = rec.mean_attainment()
    return None if mean is None else mean - target


class Deferral(msgspec.Struct, frozen=True):
    """What ``slo_defer`` allows now: ``hold`` caps the estimated terms and the KV term at the pool
    size now (a purchase can wait), else they go one size up at most; ``shrink`` whether the pool may
    go one size down."""

    hold: bool
    shrink: bool


NO_OPINION = Deferral(hold=False, shrink=True)


def deferral(
    budget: SloBudget,
    n: int,
    signal: PoolSignal,
    *,
    target: float,
    horizon_s: float,
    elapsed_s: float,
    remaining_s: float,
    interval_s: float,
    short_by_estimate: bool = False,
) -> Deferral:
    """The ``slo_defer`` rule: the SLO is judged over a period, so a purchase can wait while the
    period can still end on target if it is made later, and should, since what the pool measures in
    the meantime may show that it is not needed (the replays' first minutes, a KV episode that ends
    within a cold start).

    The pool holds at ``n`` while either staying at ``n`` to the period's end ends on target (the
    deficit now, ``target`` less the window's attainment, over the cold-start horizon at the rate
    now and over the rest at the period's mean rate), or the latest time at which one size more
    could still earn the shortfall back is more than a decision away. One size more earns its mean
    settled attainment over the target when measured at the load now, else ``1 - target`` (an
    instance more assumed to serve every request in time: the projection's only prior). A period
    that no size measured or assumed can bring back on target gets no opinion (the other rules
    decide, as without a period), and so does the last horizon of a period.

    One size down is allowed when the bank covers, for a horizon, the worst window that size was
    measured at near the load now and the size now earns the rest back over the period; a size never
    measured at the load now, only when the bank covers a horizon of every request missed.

    A size not yet measured at the load now that the capacity estimate calls short
    (``short_by_estimate``) is not held: its window lags the queue it is building (a window counts
    requests whose first token came; a pool of one at twice its capacity shows 0.98 for a minute),
    so only a measured size's window vouches for it against the estimate."""
    rate = recent_rate(signal)
    if rate <= 0 or remaining_s <= horizon_s + interval_s:
        return NO_OPINION
    mean_rate = budget.seen / elapsed_s if elapsed_s > 0 and budget.seen > 0 else rate
    rest = remaining_s - horizon_s
    bank = budget.banked(target)
    lower, rec = budget.record(n - 1), budget.record(n)
    here = _mean_margin(rec, signal, target)
    if lower is None or not carried(lower, signal):
        shrink = bank >= target * rate * horizon_s
    else:
        below = lower.worst_at(signal, load(signal)) - target
        shrink = bank + min(0.0, below) * rate * horizon_s + max(0.0, here or 0.0) * mean_rate * rest >= 0
    if short_by_estimate and (rec is None or not carried(rec, signal)):
        return Deferral(hold=False, shrink=shrink)
    attainment = signal.ttft_attainment
    if attainment is None and rec is not None:
        attainment = rec.mean_attainment()
    if attainment is None:
        return Deferral(hold=False, shrink=shrink)
    above = _mean_margin(budget.record(n + 1), signal, target)
    margin_up = 1.0 - target if above is None else above
    deficit = target - attainment
    now_cost = max(0.0, deficit) * rate * horizon_s
    if bank - now_cost - deficit * mean_rate * rest >= 0:
        return Deferral(hold=True, shrink=shrink)  # staying at n ends the period on target
    if margin_up <= 0:
        return Deferral(hold=False, shrink=shrink)
    if bank - now_cost + max(-deficit, margin_up) * mean_rate * rest < 0:
        return NO_OPINION  # lost at any size measured or assumed
    if deficit + margin_up <= 0:
        return Deferral(hold=True, shrink=shrink)  # one size more earns no more than this one
    latest_s = (bank - now_cost + margin_up * mean_rate * rest) / (mean_rate * (deficit + margin_up))
    return Deferral(hold=latest_s > interval_s, shrink=shrink)
