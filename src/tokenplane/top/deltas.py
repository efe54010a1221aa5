"""Counter and histogram arithmetic between two snapshots: increases, sums by label, quantiles.

Rates are deltas between two polls; a counter that went down (the gateway restarted) counts from
zero. Percentiles are estimated from the histogram buckets' deltas, interpolating linearly inside a
bucket as Prometheus' ``histogram_quantile`` does. Without a previous snapshot the cumulative values
since the gateway started are used instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tokenplane.top.snapshot import Sample, TopSnapshot

LabelKey = tuple[tuple[str, str], ...]


def _key(labels: Mapping[str, str], drop: Iterable[str] = ()) -> LabelKey:
    dropped = set(drop)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in dropped))


def _delta(cur: float, prev: float | None) -> float:
    """Counter increase; a counter that went down restarted from zero."""
    if prev is None:
        return cur
    d = cur - prev
    return cur if d < 0 else d


def counter_deltas(
    cur: TopSnapshot, prev: TopSnapshot | None, sample_name: str
) -> list[tuple[Sample, float]]:
    """Each current sample with its increase since ``prev`` (its value when there is no ``prev``)."""
    before: dict[LabelKey, float] = {}
    if prev is not None:
        before = {_key(s.labels): s.value for s in prev.samples(sample_name)}
    return [
        (s, _delta(s.value, before.get(_key(s.labels)) if prev is not None else None))
        for s in cur.samples(sample_name)
    ]


def sum_by(items: Iterable[tuple[Sample, float]], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s, d in items:
        k = s.labels.get(label, "")
        out[k] = out.get(k, 0.0) + d
    return out


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) from cumulative ``(upper_bound, count)`` buckets.

    Linear interpolation inside the bucket holding the rank (the first bucket starts at 0); a rank
    in the ``+Inf`` bucket gives the largest finite bound, as Prometheus does. ``None`` when the
    buckets hold no observations.
    """
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    total = bs[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in bs:
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = (bound if not math.isinf(bound) else prev_bound), count
    return prev_bound


def fraction_below(threshold: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Share of observations at most ``threshold``, interpolating inside its bucket."""
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    total = bs[-1][1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in bs:
        if threshold <= bound:
            if math.isinf(bound):
                return prev_count / total
            width = bound - prev_bound
            share = (threshold - prev_bound) / width if width > 0 else 1.0
            return (prev_count + (count - prev_count) * share) / total
        prev_bound, prev_count = bound, count
    return 1.0


@dataclass
class Hist:
    """One label group's histogram increases: cumulative bucket counts by upper bound, count, sum."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    sum: float = 0.0

    def bucket_list(self) -> list[tuple[float, float]]:
        return sorted(self.buckets.items())


def histograms(
    cur: TopSnapshot, prev: TopSnapshot | None, family: str, group_by: Sequence[str] | None = None
) -> dict[LabelKey, Hist]:
    """Histogram deltas since ``prev``, summed into groups of ``group_by`` labels (all labels if None)."""
    out: dict[LabelKey, Hist] = {}

    def group(labels: Mapping[str, str]) -> LabelKey:
        if group_by is None:
            return _key(labels, drop=("le",))
        return tuple((k, labels.get(k, "")) for k in group_by)

    for s, d in counter_deltas(cur, prev, family + "_bucket"):
        h = out.setdefault(group(s.labels), Hist())
        le = _le(s.labels.get("le", "+Inf"))
        h.buckets[le] = h.buckets.get(le, 0.0) + d
    for s, d in counter_deltas(cur, prev, family + "_count"):
        out.setdefault(group(s.labels), Hist()).count += d
    for s, d in counter_deltas(cur, prev, family + "_sum"):
        out.setdefault(group(s.labels), Hist()).sum += d
    return out
