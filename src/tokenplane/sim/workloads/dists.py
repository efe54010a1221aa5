"""Small, fast random distributions for workload generators (stdlib ``random`` and ``math`` only).

Every distribution hands out a *sampler*: a zero-argument closure bound to one ``random.Random``, so
the hot loop of a generator pays one call per draw and nothing else.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

LengthKind = Literal["fixed", "uniform", "lognormal", "normal"]
ArrivalProcess = Literal["poisson", "gamma", "weibull"]

__all__ = [
    "ArrivalProcess",
    "IntDist",
    "LengthDist",
    "LengthKind",
    "interarrival_sampler",
    "weibull_shape_for_cv",
]


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A non-negative quantity (token counts, think times) drawn from a simple distribution.

    - ``fixed``: always ``value``.
    - ``uniform``: uniform on ``[lo, hi]`` (integers inclusive when drawn as ints).
    - ``lognormal``: mean ``mean`` and coefficient of variation ``cv`` (std / mean).
    - ``normal``: mean ``mean`` and standard deviation ``cv * mean``.

    Every draw is clipped to ``[min, max]`` (``max=None``: unbounded above). Use the classmethods
    :meth:`fixed`, :meth:`uniform`, :meth:`lognormal` and :meth:`normal` rather than the raw fields.
    """

    kind: LengthKind = "fixed"
    value: float = 0.0
    lo: float = 0.0
    hi: float = 0.0
    mean: float = 0.0
    cv: float = 0.0
    min: float = 0.0
    max: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal", "normal"):
            raise ValueError(f"unknown LengthDist kind {self.kind!r}")
        if self.kind == "fixed" and self.value < 0:
            raise ValueError(f"fixed value must be >= 0, got {self.value}")
        if self.kind == "uniform" and not 0 <= self.lo <= self.hi:
            raise ValueError(f"uniform needs 0 <= lo <= hi, got lo={self.lo}, hi={self.hi}")
        if self.kind in ("lognormal", "normal") and (self.mean < 0 or self.cv < 0):
            raise ValueError(f"{self.kind} needs mean >= 0 and cv >= 0, got {self.mean}, {self.cv}")
        if self.kind == "lognormal" and self.mean == 0 and self.cv > 0:
            raise ValueError("lognormal needs mean > 0")
        if self.min < 0 or (self.max is not None and self.max < self.min):
            raise ValueError(f"clip bounds need 0 <= min <= max, got min={self.min}, max={self.max}")

    @classmethod
    def fixed(cls, value: float) -> LengthDist:
        return cls(kind="fixed", value=value)

    @classmethod
    def uniform(cls, lo: float, hi: float) -> LengthDist:
        return cls(kind="uniform", lo=lo, hi=hi)

    @classmethod
    def lognormal(
        cls, mean: float, cv: float = 1.0, *, min: float = 0.0, max: float | None = None
    ) -> LengthDist:
        return cls(kind="lognormal", mean=mean, cv=cv, min=min, max=max)

    @classmethod
    def normal(
        cls, mean: float, cv: float = 0.25, *, min: float = 0.0, max: float | None = None
    ) -> LengthDist:
        return cls(kind="normal", mean=mean, cv=cv, min=min, max=max)

    def mean_value(self) -> float:
        """The distribution's mean before clipping (after clipping for ``fixed``/``uniform``)."""
        if self.kind == "fixed":
            return self._clip(self.value)
        if self.kind == "uniform":
            return (self._clip(self.lo) + self._clip(self.hi)) / 2
        return self.mean

    def _clip(self, x: float) -> float:
        if x < self.min:
            return self.min
        if self.max is not None and x > self.max:
            return self.max
        return x

    def float_sampler(self, rng: random.Random) -> Callable[[], float]:
        """A closure drawing one float per call from ``rng``."""
        lo_clip = self.min
        hi_clip = math.inf if self.max is None else self.max
        if self.kind == "fixed":
            v = self._clip(self.value)
            return lambda: v
        if self.kind == "uniform":
            a, b = self.lo, self.hi
            uni = rng.uniform
            return lambda: min(max(uni(a, b), lo_clip), hi_clip)
        if self.kind == "lognormal":
            if self.cv == 0:
                v = self._clip(self.mean)
                return lambda: v
            sigma2 = math.log1p(self.cv * self.cv)
            mu = math.log(self.mean) - sigma2 / 2
            sigma = math.sqrt(sigma2)
            logn = rng.lognormvariate
            return lambda: min(max(logn(mu, sigma), lo_clip), hi_clip)
        mean, sd = self.mean, self.cv * self.mean
        gauss = rng.gauss
        return lambda: min(max(gauss(mean, sd), lo_clip), hi_clip)

    def int_sampler(self, rng: random.Random) -> Callable[[], int]:
        """A closure drawing one rounded, clipped integer per call from ``rng``."""
        if self.kind == "fixed":
            v = round(self._clip(self.value))
            return lambda: v
        if self.kind == "uniform":
            a, b = math.ceil(self._clip(self.lo)), math.floor(self._clip(self.hi))
            if b < a:
                v = round(self._clip(self.lo))
                return lambda: v
            randint = rng.randint
            return lambda: randint(a, b)
        if self.kind == "lognormal" and self.cv > 0:
            # Inlined (one call per draw): this is the hot path of the synthetic generator.
            sigma2 = math.log1p(self.cv * self.cv)
            mu = math.log(self.mean) - sigma2 / 2
            sigma = math.sqrt(sigma2)
            logn = rng.lognormvariate
            lo_i = round(self.min)
            hi_i = None if self.max is None else round(self.max)
            if hi_i is None:

                def draw_lognormal() -> int:
                    x = round(logn(mu, sigma))
                    return x if x > lo_i else lo_i

                return draw_lognormal

            def draw_lognormal_capped() -> int:
                x = round(logn(mu, sigma))
                return lo_i if x < lo_i else (hi_i if x > hi_i else x)

            return draw_lognormal_capped
        f = self.float_sampler(rng)
        return lambda: round(f())


@dataclass(frozen=True, slots=True)
class IntDist:
    """A whole number uniform on ``[min, max]`` inclusive (``IntDist.fixed(n)``: always ``n``)."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"IntDist needs 0 <= min <= max, got min={self.min}, max={self.max}")

    @classmethod
    def fixed(cls, n: int) -> IntDist:
        return cls(n, n)

    @classmethod
    def of(cls, x: int | IntDist) -> IntDist:
        return x if isinstance(x, IntDist) else cls(x, x)

    def mean_value(self) -> float:
        return (self.min + self.max) / 2

    def sample(self, rng: random.Random) -> int:
        return self.min if self.min == self.max else rng.randint(self.min, self.max)


def _weibull_cv(k: float) -> float:
    # cv^2 = Gamma(1 + 2/k) / Gamma(1 + 1/k)^2 - 1, via lgamma so small k does not overflow.
    return math.sqrt(math.expm1(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)))


def weibull_shape_for_cv(cv: float) -> float:
    """The Weibull shape ``k`` whose coefficient of variation is ``cv`` (bisection in log k).

    The cv falls monotonically in ``k``; ``k`` is searched in [0.02, 1000] (cv from about 1e35 down
    to about 0.0013), and values outside that range are clamped to its ends.
    """
    if cv <= 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    lo, hi = math.log(0.02), math.log(1000.0)
    if cv >= _weibull_cv(math.exp(lo)):
        return math.exp(lo)
    if cv <= _weibull_cv(math.exp(hi)):
        return math.exp(hi)
    for _ in range(100):
        mid = (lo + hi) / 2
        if _weibull_cv(math.exp(mid)) > cv:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return math.exp((lo + hi) / 2)


def interarrival_sampler(
    rng: random.Random, process: str, rate_rps: float, cv: float = 1.0
) -> Callable[[], float]:
    """Inter-arrival gaps with mean ``1 / rate_rps`` and coefficient of variation ``cv``.

    ``poisson``: exponential gaps (cv is 1 by definition; any other cv is an error). ``gamma``:
    shape ``1 / cv**2``. ``weibull``: shape solved from ``cv``, scale set so the mean is right.
    ``cv == 0`` gives evenly spaced arrivals for gamma and weibull.
    """
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0, got {rate_rps}")
    if cv < 0:
        raise ValueError(f"cv must be >= 0, got {cv}")
    mean = 1.0 / rate_rps
    if process == "poisson":
        if abs(cv - 1.0) > 1e-9:
            raise ValueError(f"a poisson process has cv 1 (got cv={cv}); use process 'gamma' or 'weibull'")
        expo = rng.expovariate
        return lambda: expo(rate_rps)
    if process not in ("gamma", "weibull"):
        raise ValueError(f"unknown arrival process {process!r}; expected poisson, gamma or weibull")
    if cv == 0:
        return lambda: mean
    if process == "gamma":
        shape = 1.0 / (cv * cv)
        scale = mean / shape
        gam = rng.gammavariate
        return lambda: gam(shape, scale)
    k = weibull_shape_for_cv(cv)
    lam = mean / math.exp(math.lgamma(1 + 1 / k))
    weib = rng.weibullvariate
    return lambda: weib(lam, k)
