"""Bursty open-loop traffic: a two-state Markov-modulated Poisson process (MMPP-2) whose
inter-arrival times have a configured coefficient of variation (CV).

Real request streams are not Poisson: code-completion and agent traffic has minutes in which the
rate jumps several-fold, and inter-arrival CVs above 10 are common. An MMPP-2 models that with two
states, *high* (rate ``peak_ratio × rate_rps``, held ``burst_s`` on average) and *low* (the rate
that keeps the long-run mean at ``rate_rps``), each held for an exponentially distributed dwell.
Those fix everything but the share of time spent high, ``p``; it is solved so that the stationary
inter-arrival CV equals ``cv`` (the CV rises with ``p``, from 1 at ``p → 0`` to the on-off process's
at ``p = 1/peak_ratio``, where the low rate is 0), so the bursts are minutes long and several-fold
whatever the CV.

The CV comes from the MMPP's phase-type inter-arrival law (``D0 = Q − Λ``, ``D1 = Λ``; the phase
at an arrival is ``φ = πΛ / λ̄``): ``E[X^k] = k! φ (−D0)^−k 1``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.dists import LengthDist

__all__ = ["BurstyWorkload", "MmppShape", "mmpp_cv", "solve_mmpp"]


class MmppShape:
    """Rates (req/s) and mean dwell times (s) of the two states."""

    __slots__ = ("high_dwell_s", "high_rps", "low_dwell_s", "low_rps")

    def __init__(self, high_rps: float, low_rps: float, high_dwell_s: float, low_dwell_s: float) -> None:
        self.high_rps = high_rps
        self.low_rps = low_rps
        self.high_dwell_s = high_dwell_s
        self.low_dwell_s = low_dwell_s

    @property
    def mean_rps(self) -> float:
        th, tl = self.high_dwell_s, self.low_dwell_s
        return (self.high_rps * th + self.low_rps * tl) / (th + tl)


def mmpp_cv(shape: MmppShape) -> float:
    """Stationary inter-arrival coefficient of variation of an MMPP-2 (see module doc)."""
    a = 1.0 / shape.high_dwell_s  # high -> low
    b = 1.0 / shape.low_dwell_s  # low -> high
    lh, ll = shape.high_rps, shape.low_rps
    pi_h, pi_l = b / (a + b), a / (a + b)
    mean = pi_h * lh + pi_l * ll
    phi = (pi_h * lh / mean, pi_l * ll / mean)
    # (-D0)^-1 with -D0 = [[a + lh, -a], [-b, b + ll]]
    det = (a + lh) * (b + ll) - a * b
    m = ((b + ll) / det, a / det, b / det, (a + lh) / det)
    m1 = (m[0] + m[1], m[2] + m[3])  # M·1
    m2 = (m[0] * m1[0] + m[1] * m1[1], m[2] * m1[0] + m[3] * m1[1])  # M²·1
    ex = phi[0] * m1[0] + phi[1] * m1[1]
    ex2 = 2.0 * (phi[0] * m2[0] + phi[1] * m2[1])
    return math.sqrt(max(0.0, ex2 / (ex * ex) - 1.0))


def solve_mmpp(rate_rps: float, cv: float, *, peak_ratio: float, burst_s: float) -> MmppShape:
    """The MMPP-2 with mean ``rate_rps``, high rate ``peak_ratio × rate_rps`` held for ``burst_s``
    on average, and inter-arrival CV ``cv``: bisection on the high state's share of time ``p`` in
    ``(0, 1/peak_ratio]`` (the CV rises with ``p``: from 1 as ``p → 0`` to the on-off process's,
    where the low rate reaches 0)."""
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"rate_rps must be > 0, got {rate_rps}")
    if not (math.isfinite(cv) and cv >= 1.0):
        raise ValueError(f"a bursty workload needs cv >= 1 (1 is Poisson), got {cv}")
    if not (math.isfinite(peak_ratio) and peak_ratio > 1):
        raise ValueError(f"peak_ratio must be > 1, got {peak_ratio}")
    if not (math.isfinite(burst_s) and burst_s > 0):
        raise ValueError(f"burst_s must be > 0, got {burst_s}")
    high = peak_ratio * rate_rps

    def shape(p: float) -> MmppShape:
        low = max(0.0, rate_rps * (1.0 - peak_ratio * p) / (1.0 - p))
        return MmppShape(high, low, burst_s, burst_s * (1.0 - p) / p)

    top = 1.0 / peak_ratio
    most = mmpp_cv(shape(top))
    if cv > most:
        raise ValueError(
            f"cv {cv} is out of reach with peak_ratio {peak_ratio} and burst_s {burst_s} (at most "
            f"{most:.3g}, the on-off process): lengthen burst_s or raise peak_ratio"
        )
    lo, hi = 1e-9, top
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mmpp_cv(shape(mid)) < cv:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return shape(0.5 * (lo + hi))


class BurstyWorkload:
    """Requests from an MMPP-2 with mean ``rate_rps`` and inter-arrival CV ``cv`` (see module doc).

    Stops after ``num_requests`` or at ``duration_s`` (whichever first; neither: endless). Prompt and
    output lengths as :class:`~tokenplane.sim.workloads.synthetic.SyntheticWorkload`'s (defaults:
    lognormal, means 1,000 and 200, cv 1). The start state is drawn from the stationary law; the
    same ``seed`` replays the same stream.
    """

    def __init__(
        self,
        *,
        rate_rps: float,
        cv: float,
        peak_ratio: float = 4.0,
        burst_s: float = 60.0,
        num_requests: int | None = None,
        duration_s: float | None = None,
        prompt: LengthDist | None = None,
        output: LengthDist | None = None,
        seed: int = 0,
        tenant: str = "default",
        model: str = "",
        name: str = "bursty",
    ) -> None:
        if num_requests is not None and num_requests < 0:
            raise ValueError(f"num_requests must be >= 0, got {num_requests}")
        if duration_s is not None and duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {duration_s}")
        self.shape = solve_mmpp(rate_rps, cv, peak_ratio=peak_ratio, burst_s=burst_s)
        self.rate_rps = rate_rps
        self.cv = cv
        self.num_requests = num_requests
        self.duration_s = duration_s
        self.prompt = prompt if prompt is not None else LengthDist.lognormal(1000, 1.0, min=1)
        self.output = output if output is not None else LengthDist.lognormal(200, 1.0, min=1)
        self.seed = seed
        self.tenant = tenant
        self.model = model
        self.name = name

    def arrival_times(self) -> Iterator[float]:
        """The arrival instants alone (what the CV is defined on)."""
        rng = random.Random(f"tokenplane-bursty:{self.seed}")
        s = self.shape
        rates = (s.high_rps, s.low_rps)
        dwells = (s.high_dwell_s, s.low_dwell_s)
        state = 0 if rng.random() < s.high_dwell_s / (s.high_dwell_s + s.low_dwell_s) else 1
        expo = rng.expovariate
        t = 0.0
        while True:
            switch = t + expo(1.0 / dwells[state])
            rate = rates[state]
            if rate > 0:
                while True:
                    t += expo(rate)
                    if t > switch:
                        break
                    yield t
            t = switch  # memoryless: the next state's first gap starts at the switch
            state = 1 - state

    def arrivals(self) -> Iterator[RequestSpec]:
        rng = random.Random(f"tokenplane-bursty-lengths:{self.seed}")
        draw_prompt = self.prompt.int_sampler(rng)
        draw_output = self.output.int_sampler(rng)
        n_max, t_end = self.num_requests, self.duration_s
        tenant, model = self.tenant, self.model
        for rid, t in enumerate(self.arrival_times()):
            if (n_max is not None and rid >= n_max) or (t_end is not None and t > t_end):
                return
            p = draw_prompt()
            o = draw_output()
            o = o if o > 0 else 1
            yield RequestSpec(rid, t, p if p > 0 else 1, o, (), 16, tenant, model, o)

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()
