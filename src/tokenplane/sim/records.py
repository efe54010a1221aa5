"""Per-request and per-instance measurements a twin run produces; the report reads only these."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

import msgspec


class RequestRecord(msgspec.Struct, gc=False):
    """Timeline of one request. Times are virtual seconds; ``None`` where the stage never happened.

    ``gc=False``: a run keeps one per request (millions) and they hold only scalars, so they can
    never be part of a reference cycle; the cyclic collector need not scan them.
    """

    request_id: int
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    instance_id: str | None = None
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    prefix_hit_tokens: int = 0
    prefix_bound_tokens: int = 0
    preemptions: int = 0
    ok: bool = False
    reason: str = ""
    route_reason: str = ""
    attempts: int = 1
    interrupted: bool = False

    @property
    def queue_s(self) -> float | None:
        return None if self.scheduled_s is None else self.scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time between output tokens (vLLM's TPOT): decode time over tokens after the first."""
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class InstanceSample:
    """One point of an instance's timeline: busy fraction since the previous sample, KV use now."""

    t_s: float
    busy_fraction: float
    kv_usage: float
    running: int
    waiting: int


@dataclass(slots=True)
class InstanceRecord:
    instance_id: str
    gpu: str
    model: str
    price_per_hour: float
    busy_s: float = 0.0
    alive_s: float = 0.0
    steps: int = 0
    adapter_loads: int = 0  # LoRA adapters loaded into a slot (sim/lora.py)
    samples: list[InstanceSample] = field(default_factory=list)


_floor, _log = math.floor, math.log  # bound once: TbtHistogram.add runs for every engine step or run


@dataclass(slots=True)
class TbtHistogram:
    """Token-weighted histogram of time between tokens, log-spaced buckets (about 2 % wide).

    Decode runs add many identical-ish steps at once, so recording every gap would cost a list
    entry per token; a histogram costs one update per run of steps.
    """

    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0

    def add(self, gap_s: float, weight: int) -> None:
        if weight <= 0 or gap_s <= 0:
            return
        key = _floor(_log(gap_s) * 50.0)
        counts = self.counts
        counts[key] = counts.get(key, 0) + weight
        self.total += weight

    def percentile(self, q: float) -> float | None:
        if self.total == 0:
            return None
        target = q / 100.0 * self.total
        seen = 0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen >= target:
                return math.exp((key + 0.5) / 50.0)
        return math.exp((max(self.counts) + 0.5) / 50.0)


#: Values a :class:`Distribution` keeps exactly; past this many it folds them into a histogram.
EXACT_LIMIT = 1_000_000
#: Log-histogram buckets per factor e: a bucket spans a factor e^(1/100) (about 1 %), and its
#: representative (the geometric middle) is within 0.5 % of every value in it.
LOG_BUCKETS_PER_E = 100.0


@dataclass(slots=True)
class LogHistogram:
    """Counts of positive values in log-spaced buckets (mergeable; relative error at most 0.5 %).

    Values at or below zero (a request scheduled the instant it arrived) count apart and read back
    as the smallest value seen. ``lo`` and ``hi`` are the exact extremes, which clamp every read.
    """

    counts: dict[int, int] = field(default_factory=dict)
    nonpositive: int = 0
    n: int = 0
    lo: float = math.inf
    hi: float = -math.inf

    def add(self, value: float) -> None:
        self.n += 1
        if value < self.lo:
            self.lo = value
        if value > self.hi:
            self.hi = value
        if value <= 0.0:
            self.nonpositive += 1
            return
        key = _floor(_log(value) * LOG_BUCKETS_PER_E)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1

    def merge(self, other: LogHistogram) -> None:
        for key, c in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + c
        self.nonpositive += other.nonpositive
        self.n += other.n
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)

    def value_at_rank(self, rank: int) -> float:
        """The (approximate) ``rank``-th smallest value, 0-based."""
        if rank < self.nonpositive:
            return self.lo
        seen = self.nonpositive
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen > rank:
                mid = math.exp((key + 0.5) / LOG_BUCKETS_PER_E)
                return min(max(mid, self.lo), self.hi)
        return self.hi


class Distribution:
    """One latency's values over a run: kept exactly up to ``limit`` values, then a :class:`LogHistogram`.

    Exact, it reads as :func:`tokenplane.sim.report.percentile` and an exact :func:`math.fsum`
    mean over the sorted values; past ``limit`` values, a percentile is the histogram's value at
    the lower of the two closest ranks (within 0.5 % of a value between those two ranks' values,
    relative), and the mean is a running float sum over the count.
    """

    __slots__ = ("_sorted", "hist", "limit", "total", "values")

    def __init__(self, limit: int = EXACT_LIMIT) -> None:
        self.values: list[float] = []
        self.hist: LogHistogram | None = None
        self.limit = limit
        self.total = 0.0
        self._sorted = True

    def __len__(self) -> int:
        return len(self.values) if self.hist is None else self.hist.n

    @property
    def exact(self) -> bool:
        return self.hist is None

    def extend(self, values: list[float]) -> None:
        hist = self.hist
        if hist is None:
            self.values.extend(values)
            self._sorted = False
            if len(self.values) > self.limit:
                self._fold()
            return
        add = hist.add
        for v in values:
            add(v)
        self.total += math.fsum(values)

    def _fold(self) -> None:
        hist = LogHistogram()
        for v in self.values:
            hist.add(v)
        self.total = math.fsum(self.values)
        self.values = []
        self.hist = hist

    def mean(self) -> float | None:
        if self.hist is None:
            return math.fsum(self.values) / len(self.values) if self.values else None
        return self.total / self.hist.n if self.hist.n else None

    def sorted_values(self) -> list[float]:
        if not self._sorted:
            self.values.sort()
            self._sorted = True
        return self.values

    def percentile(self, q: float) -> float | None:
        hist = self.hist
        if hist is None:
            from tokenplane.sim.report import percentile

            return percentile(self.sorted_values(), q)
        if hist.n == 0:
            return None
        q = min(max(q, 0.0), 100.0)
        return hist.value_at_rank(math.floor((hist.n - 1) * q / 100.0))


class RecordStream:
    """Where a run that streams its records appends them: each request's record stays here only
    until it is done (finished, or failed with a reason), then goes to ``consume`` in batches and,
    when given, to ``file`` (one JSON object per line), and is dropped.

    Memory is bounded by the requests in flight (plus one batch), not by the run's length. Reading
    it back (``len``, iteration) sees only the count and the records not yet handed on.
    """

    __slots__ = ("_batch", "_count", "_encode", "_file", "_open", "consume")

    def __init__(
        self,
        consume: Callable[[list[RequestRecord]], None],
        *,
        file: IO[bytes] | None = None,
        batch: int = 65_536,
    ) -> None:
        self.consume = consume
        self._open: list[RequestRecord] = []
        self._count = 0
        self._batch = batch
        self._file = file
        self._encode = msgspec.json.Encoder().encode

    def append(self, record: RequestRecord) -> None:
        self._open.append(record)
        self._count += 1
        if len(self._open) >= self._batch:
            self.flush()

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self._open)

    def flush(self, *, final: bool = False) -> None:
        """Hand on the records that are done (all of them when ``final``); keep the rest."""
        done: list[RequestRecord] = []
        keep: list[RequestRecord] = []
        if final:
            done = self._open
        else:
            for r in self._open:
                (done if r.ok or r.reason else keep).append(r)
        self._open = keep
        # A batch that is mostly still in flight grows, so each flush hands on about half of it.
        self._batch = max(self._batch, 2 * len(keep))
        if done:
            self.consume(done)
            if self._file is not None:
                encode = self._encode
                self._file.write(b"".join(encode(r) + b"\n" for r in done))

    def close(self) -> None:
        self.flush(final=True)
