"""Where the live loop reads the pool's state: a :class:`SignalSource` returning a :class:`SignalSample`.

A sample is the gateway's half of a :class:`~tokenplane.core.autoscale.PoolSignal`: the instances
it routes to (draining ones included, so the loop sees when they empty) and the pool's
:class:`~tokenplane.core.autoscale.signals.PoolMeasures` (its admission queue, per-bucket arrival
rates, recent throughput and SLO attainment), the very fields the signal carries. The loop adds
the other half (which instances are warm, warming, draining) from its own bookkeeping, as the
twin's shell does from its lifecycle.

Two sources:

* :class:`InProcessSignalSource`: callables over the gateway's objects plus a :class:`PoolStats`
  the gateway feeds on its request path (``arrival``, ``first_token``, ``finished``): exact
  arrivals and SLO attainment, no HTTP. The wiring the gateway needs is in the package docstring.
* :class:`GatewaySignalSource`: reads a running gateway over HTTP (``GET /v1/instances`` and
  ``GET /metrics``), so the loop can run in another process. Arrivals are derived by conservation:
  ``tokenplane_requests_total`` (counted when a request ends) plus ``tokenplane_queue_depth`` and
  ``tokenplane_admitted_in_flight`` (requests not yet ended) is a cumulative arrival count, read at
  each sample and interpolated onto fixed buckets. Throughput is the rate of ``outcome="ok"``
  requests; TTFT attainment and p90 come from the ``tokenplane_ttft_seconds`` histogram (streams
  only) over ``slo_window_s``, at bucket resolution (attainment counts the largest bucket bound not
  above the SLO, so it errs low).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.core.autoscale import RateSample
from tokenplane.core.autoscale.signals import PROMPT_TOKENS_WINDOW_S, PoolMeasures, prompt_tokens_rate
from tokenplane.core.views import InstanceView

DEFAULT_BUCKET_S = 10.0
DEFAULT_HISTORY_BUCKETS = 60
DEFAULT_SLO_WINDOW_S = 60.0


class SignalSample(PoolMeasures, frozen=True):
    """The gateway's view of one pool at one moment: the :class:`PoolMeasures` (queue, arrivals,
    throughput, SLO attainment) and the ``instances`` it routes to (see the module docstring)."""

    instances: tuple[InstanceView, ...] = ()


@runtime_checkable
class SignalSource(Protocol):
    async def sample(self, now: float) -> SignalSample: ...


def _p90(values: list[float]) -> float:
    values.sort()
    return values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]


class PoolStats:
    """Rolling arrival buckets, throughput and SLO attainment, fed by the gateway's request path.

    ``arrival(now, prompt_tokens)`` per admitted-or-not request; ``first_token(now, ttft_s)`` per
    stream's first token; ``finished(now, ok=..., output_tokens=..., tpot_s=...)`` per request end. Memory is
    bounded by ``history_buckets`` and the events of one ``slo_window_s``.
    """

    def __init__(
        self,
        *,
        bucket_s: float = DEFAULT_BUCKET_S,
        history_buckets: int = DEFAULT_HISTORY_BUCKETS,
        slo_window_s: float = DEFAULT_SLO_WINDOW_S,
        ttft_slo_s: float | None = None,
        tbt_slo_s: float | None = None,
    ) -> None:
        self.bucket_s = bucket_s
        self.history_buckets = history_buckets
        self.slo_window_s = slo_window_s
        self.ttft_slo_s = ttft_slo_s
        self.tbt_slo_s = tbt_slo_s
        self._counts: dict[int, int] = {}
        self._tokens: dict[int, int] = {}  # prompt tokens arrived per bucket
        self._first_bucket: int | None = None
        self._ttft: deque[tuple[float, float]] = deque()
        self._done: deque[tuple[float, bool, int, float | None]] = deque()
        self._since: float | None = None

    def arrival(self, now: float, prompt_tokens: int = 0) -> None:
        if self._since is None:
            self._since = now
        k = int(now // self.bucket_s)
        if self._first_bucket is None:
            self._first_bucket = k
        self._counts[k] = self._counts.get(k, 0) + 1
        if prompt_tokens:
            self._tokens[k] = self._tokens.get(k, 0) + prompt_tokens

    def first_token(self, now: float, ttft_s: float) -> None:
        self._ttft.append((now, ttft_s))

    def finished(
        self, now: float, *, ok: bool = True, output_tokens: int = 0, tpot_s: float | None = None
    ) -> None:
        if self._since is None:
            self._since = now
        self._done.append((now, ok, output_tokens, tpot_s))

    def arrivals(self, now: float) -> tuple[RateSample, ...]:
        width = self.bucket_s
        current = int(now // width)  # the bucket in progress is not complete
        start = self._first_bucket if self._first_bucket is not None else current
        first = max(start, current - self.history_buckets)
        for k in [k for k in self._counts if k < first]:
            del self._counts[k]
            self._tokens.pop(k, None)
        return tuple((k * width, self._counts.get(k, 0) / width) for k in range(first, current))

    def prompt_tokens_per_s(self, now: float) -> float | None:
        """Prompt tokens per second arrived over the last minute of complete buckets (as the twin
        measures them); ``None`` before a bucket is complete or when no request said its size."""
        if self._first_bucket is None or not self._tokens:
            return None
        return prompt_tokens_rate(self._tokens, now, self.bucket_s, self._first_bucket)

    def window(self, now: float) -> dict[str, float | None]:
        horizon = now - self.slo_window_s
        while self._ttft and self._ttft[0][0] < horizon:
            self._ttft.popleft()
        while self._done and self._done[0][0] < horizon:
            self._done.popleft()
        out: dict[str, float | None] = {
            "throughput_rps": None,
            "throughput_tps": None,
            "ttft_attainment": None,
            "ttft_p90_s": None,
            "tbt_attainment": None,
            "tbt_p90_s": None,
        }
        if self._done:
            # A window not yet full (just started) is measured over what it has seen.
            span = max(1e-9, min(self.slo_window_s, now - (self._since if self._since is not None else now)))
            ok = [d for d in self._done if d[1]]
            out["throughput_rps"] = len(ok) / span
            out["throughput_tps"] = sum(d[2] for d in ok) / span
            tpots = [d[3] for d in ok if d[3] is not None]
            if tpots:
                if self.tbt_slo_s is not None:
                    out["tbt_attainment"] = sum(1 for t in tpots if t <= self.tbt_slo_s) / len(tpots)
                out["tbt_p90_s"] = _p90(tpots)
        if self._ttft:
            ttfts = [t for _, t in self._ttft]
            if self.ttft_slo_s is not None:
                out["ttft_attainment"] = sum(1 for t in ttfts if t <= self.ttft_slo_s) / len(ttfts)
            out["ttft_p90_s"] = _p90(ttfts)
        return out


class InProcessSignalSource:
    """A sample from callables over the gateway's own objects (no I/O); see the package docstring."""

    def __init__(
        self,
        views: Callable[[], Iterable[InstanceView]],
        queued: Callable[[], int] = lambda: 0,
        stats: PoolStats | None = None,
    ) -> None:
        self._views = views
        self._queued = queued
        self.stats = stats

    async def sample(self, now: float) -> SignalSample:
        w: Mapping[str, float | None] = self.stats.window(now) if self.stats is not None else {}
        return SignalSample(
            instances=tuple(self._views()),
            queued=self._queued(),
            arrivals=self.stats.arrivals(now) if self.stats is not None else (),
            prompt_tokens_per_s=self.stats.prompt_tokens_per_s(now) if self.stats is not None else None,
            throughput_rps=w.get("throughput_rps"),
            throughput_tps=w.get("throughput_tps"),
            ttft_attainment=w.get("ttft_attainment"),
            tbt_attainment=w.get("tbt_attainment"),
            ttft_p90_s=w.get("ttft_p90_s"),
            tbt_p90_s=w.get("tbt_p90_s"),
        )


class CumulativeBuckets:
    """Per-bucket rates from readings of a cumulative count, linearly interpolated at bucket edges."""

    def __init__(
        self, bucket_s: float = DEFAULT_BUCKET_S, history_buckets: int = DEFAULT_HISTORY_BUCKETS
    ) -> None:
        self.bucket_s = bucket_s
        self.history_buckets = history_buckets
        self._t: list[float] = []
        self._v: list[float] = []

    def add(self, t: float, total: float) -> None:
        if self._t and t <= self._t[-1]:
            return
        if self._v and total < self._v[-1]:  # the counter reset (gateway restart): start over
            self._t.clear()
            self._v.clear()
        self._t.append(t)
        self._v.append(total)
        keep_from = t - self.bucket_s * (self.history_buckets + 2)
        cut = bisect.bisect_left(self._t, keep_from) - 1
        if cut > 0:
            del self._t[:cut]
            del self._v[:cut]

    def _at(self, t: float) -> float:
        i = bisect.bisect_left(self._t, t)
        if i < len(self._t) and self._t[i] == t:
            return self._v[i]
        t0, t1, v0, v1 = self._t[i - 1], self._t[i], self._v[i - 1], self._v[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def buckets(self) -> tuple[RateSample, ...]:
        if len(self._t) < 2:
            return ()
        w = self.bucket_s
        first = math.ceil(self._t[0] / w)
        last = math.floor(self._t[-1] / w)  # buckets [k·w, (k+1)·w) with (k+1)·w <= the last reading
        first = max(first, last - self.history_buckets)
        return tuple((k * w, (self._at((k + 1) * w) - self._at(k * w)) / w) for k in range(first, last))


def _counter_rate(
    readings: deque[tuple[float, float]], now: float, total: float, window_s: float
) -> float | None:
    """Per second of a cumulative counter read as ``total`` at ``now``, from its oldest reading
    within ``window_s`` (``readings`` keeps them; ``None`` with one reading or a counter gone back)."""
    readings.append((now, total))
    while len(readings) > 2 and readings[1][0] <= now - window_s:
        readings.popleft()
    t0, v0 = readings[0]
    return (total - v0) / (now - t0) if now > t0 and total >= v0 else None


def _label_sum(families: Mapping[str, list[Any]], name: str, **match: str) -> float:
    total = 0.0
    for s in families.get(name, ()):
        if all(s.labels.get(k) == v for k, v in match.items()):
            total += float(s.value)
    return total


class GatewaySignalSource:
    """Samples a running gateway over HTTP; see the module docstring."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        bucket_s: float = DEFAULT_BUCKET_S,
        history_buckets: int = DEFAULT_HISTORY_BUCKETS,
        slo_window_s: float = DEFAULT_SLO_WINDOW_S,
        ttft_slo_s: float | None = None,
        timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.slo_window_s = slo_window_s
        self.ttft_slo_s = ttft_slo_s
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self._arrivals = CumulativeBuckets(bucket_s, history_buckets)
        self._ok: deque[tuple[float, float]] = deque()
        self._prompt: deque[tuple[float, float]] = deque()
        self._ttft: deque[tuple[float, dict[float, float]]] = deque()
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str) -> aiohttp.ClientResponse:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s), headers=self.headers
            )
        resp = await self._session.get(self.base_url + path)
        resp.raise_for_status()
        return resp

    async def sample(self, now: float) -> SignalSample:
        async with await self._get("/v1/instances") as resp:
            listing = await resp.json()
        async with await self._get("/metrics") as resp:
            text = await resp.text()
        views = tuple(
            msgspec.convert(d, InstanceView) for d in listing.get("data", ()) if d.get("model") == self.model
        )
        fams: dict[str, list[Any]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                fams.setdefault(s.name, []).append(s)
        m = self.model
        queued = _label_sum(fams, "tokenplane_queue_depth", model=m)
        ended = _label_sum(fams, "tokenplane_requests_total", model=m)
        inflight = _label_sum(fams, "tokenplane_admitted_in_flight", model=m)
        self._arrivals.add(now, ended + queued + inflight)
        ok = _label_sum(fams, "tokenplane_requests_total", model=m, outcome="ok")
        hist: dict[float, float] = {}
        for s in fams.get("tokenplane_ttft_seconds_bucket", ()):
            if s.labels.get("model") == m:
                le = float(s.labels["le"])
                hist[le] = hist.get(le, 0.0) + float(s.value)
        throughput, att, p90 = self._window(now, ok, hist)
        prompt = _label_sum(fams, "tokenplane_prompt_tokens_total", model=m)
        return SignalSample(
            instances=views,
            queued=int(queued),
            arrivals=self._arrivals.buckets(),
            prompt_tokens_per_s=self._prompt_rate(now, prompt),
            throughput_rps=throughput,
            ttft_attainment=att,
            ttft_p90_s=p90,
        )

    def _prompt_rate(self, now: float, total: float) -> float | None:
        """Prompt tokens per second over the last minute of readings of the cumulative counter
        (counted as requests end, so this lags arrivals by their duration; a reset starts over)."""
        if self._prompt and total < self._prompt[-1][1]:
            self._prompt.clear()
        return _counter_rate(self._prompt, now, total, PROMPT_TOKENS_WINDOW_S)

    def _window(
        self, now: float, ok: float, hist: dict[float, float]
    ) -> tuple[float | None, float | None, float | None]:
        throughput = _counter_rate(self._ok, now, ok, self.slo_window_s)
        self._ttft.append((now, hist))
        horizon = now - self.slo_window_s
        while len(self._ttft) > 2 and self._ttft[1][0] <= horizon:
            self._ttft.popleft()
        old = self._ttft[0][1]
        diff = {le: c - old.get(le, 0.0) for le, c in hist.items()}
        total = diff.get(math.inf, 0.0)
        if total <= 0:
            return throughput, None, None
        bounds = sorted(diff)
        att = None
        if self.ttft_slo_s is not None:
            within = [diff[le] for le in bounds if le <= self.ttft_slo_s]
            att = max(0.0, min(1.0, (within[-1] if within else 0.0) / total))
        p90 = next(le for le in bounds if diff[le] >= 0.9 * total)
        return throughput, att, (p90 if math.isfinite(p90) else bounds[-2] if len(bounds) > 1 else None)
