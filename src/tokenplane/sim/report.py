"""Turn one twin run's records into a flat, JSON-able report; write several runs' (their console
summary is :mod:`tokenplane.sim.summary_table`'s, re-exported here).

Conventions, all deterministic (the same inputs give byte-identical ``report.json``):

* **Percentiles** use linear interpolation between closest ranks (numpy's default ``"linear"``
  method, Excel's ``PERCENTILE.INC``): for ``n`` sorted samples the ``q``-th percentile sits at
  position ``(n - 1) * q / 100``; the result is clamped to the two neighbouring samples, so it is
  monotone in ``q`` and always inside ``[min, max]``. No samples give ``None``.
  ``tbt_*`` percentiles come from :class:`~tokenplane.sim.records.TbtHistogram` instead (its
  own bucketed rule).
* **Completed** requests are the records with ``ok``; latency percentiles and means (queue, TTFT,
  TPOT, E2E), throughput, token counts, prefix ratios and cost per token use only those. Failed
  requests count in ``requests_total``, ``requests_failed``, ``failure_reasons``, ``preemptions``
  and ``route_reasons``, and in the denominator of ``slo_attainment``.
* A request **meets the SLO** (:meth:`Slo.met`) when it is ok, has a first token, its TTFT is at
  most ``Slo.ttft_s`` and its TPOT is ``None`` (fewer than two output tokens) or at most
  ``Slo.tbt_s``.
* Rates divide by ``duration_s`` (the simulated end time); a zero duration gives ``None``.
  Float sums use :func:`math.fsum`, so they do not depend on record order.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenplane.sim.records import EXACT_LIMIT, Distribution, InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.summary_table import print_summary, summary_table

__all__ = [
    "WALL_CLOCK_FIELDS",
    "RunAggregate",
    "Slo",
    "build_run_report",
    "goodput_timeline",
    "percentile",
    "print_summary",
    "summary_table",
    "write_report",
]

#: Report keys whose values depend on the host's wall clock; drop them to compare two runs.
WALL_CLOCK_FIELDS: frozenset[str] = frozenset({"wall_seconds", "sim_seconds_per_wall_second"})

#: Label used in ``failure_reasons`` / ``route_reasons`` when a record left the reason empty.
UNKNOWN_REASON = "unknown"
UNROUTED = "unrouted"


@dataclass(frozen=True)
class Slo:
    """Service-level objective: time to first token and mean time between tokens (TPOT)."""

    ttft_s: float = 2.0
    tbt_s: float = 0.1

    def met(self, record: RequestRecord) -> bool:
        """Whether ``record`` is ok and within both limits (see the module docstring)."""
        if not record.ok or record.first_token_s is None:
            return False
        if record.first_token_s - record.arrival_s > self.ttft_s:
            return False
        tpot = record.tpot_s
        return tpot is None or tpot <= self.tbt_s

    def as_dict(self) -> dict[str, float]:
        return {"ttft_s": self.ttft_s, "tbt_s": self.tbt_s}


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of already sorted values, by linear interpolation.

    ``None`` for an empty sequence. ``q`` outside 0..100 is clamped.
    """
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return float(sorted_values[0])
    q = min(max(q, 0.0), 100.0)
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    if lo >= n - 1:
        return float(sorted_values[n - 1])
    frac = pos - lo
    a = float(sorted_values[lo])
    b = float(sorted_values[lo + 1])
    if frac <= 0.0:
        return a
    value = a + (b - a) * frac
    return min(max(value, a), b)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _count(labels: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


class RunAggregate:
    """What a run's report reads from its request records, gathered record by record.

    :func:`build_run_report` fills one from a list of records; a run that streams its records
    (:class:`~tokenplane.sim.records.RecordStream`) feeds one batch by batch and keeps no records.
    Counts and token sums are exact. Latencies are :class:`~tokenplane.sim.records.Distribution`
    values: exact (the report is byte-identical to one built from the list) up to ``exact_limit``
    completed requests, log-bucketed past it (percentiles within 0.5 %, see there). The goodput
    timeline keeps each SLO-meeting finish time up to ``exact_limit`` of them, then counts per
    second (a bucket's edge then falls on whole seconds).
    """

    def __init__(self, slo: Slo, *, exact_limit: int = EXACT_LIMIT) -> None:
        self.slo = slo
        self.exact_limit = exact_limit
        self.total = 0
        self.completed = 0
        self.met = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.hit_tokens = 0
        self.bound_tokens = 0
        self.preemptions = 0
        self.failure_reasons: dict[str, int] = {}
        self.route_reasons: dict[str, int] = {}
        self.queue = Distribution(exact_limit)
        self.ttft = Distribution(exact_limit)
        self.tpot = Distribution(exact_limit)
        self.e2e = Distribution(exact_limit)
        self.met_finish: list[float] | None = []
        self.met_per_second: dict[int, int] = {}

    def add_all(self, records: Iterable[RequestRecord]) -> None:
        """Add records that are done (the report's conventions: see the module docstring)."""
        slo_ttft = self.slo.ttft_s
        slo_tbt = self.slo.tbt_s
        queue: list[float] = []
        ttft: list[float] = []
        tpot: list[float] = []
        e2e: list[float] = []
        met_finish: list[float] = []
        failure_reasons = self.failure_reasons
        route_reasons = self.route_reasons
        total = completed = met = prompt_tokens = output_tokens = hit_tokens = bound_tokens = 0
        preemptions = 0
        # One pass, attribute reads only (the record properties are inlined for speed).
        for r in records:
            total += 1
            preemptions += r.preemptions
            route = r.route_reason or UNROUTED
            route_reasons[route] = route_reasons.get(route, 0) + 1
            if not r.ok:
                reason = r.reason or UNKNOWN_REASON
                failure_reasons[reason] = failure_reasons.get(reason, 0) + 1
                continue
            completed += 1
            arrival = r.arrival_s
            prompt_tokens += r.prompt_tokens
            output_tokens += r.output_tokens
            hit_tokens += r.prefix_hit_tokens
            bound_tokens += r.prefix_bound_tokens
            if r.scheduled_s is not None:
                queue.append(r.scheduled_s - arrival)
            first = r.first_token_s
            finish = r.finish_s
            this_ttft: float | None = None
            if first is not None:
                this_ttft = first - arrival
                ttft.append(this_ttft)
            this_tpot: float | None = None
            if finish is not None:
                e2e.append(finish - arrival)
                if first is not None and r.output_tokens >= 2:
                    this_tpot = (finish - first) / (r.output_tokens - 1)
                    tpot.append(this_tpot)
            if (
                this_ttft is not None
                and this_ttft <= slo_ttft
                and (this_tpot is None or this_tpot <= slo_tbt)
            ):
                met += 1
                if finish is not None:
                    met_finish.append(finish)
        self.total += total
        self.completed += completed
        self.met += met
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        self.hit_tokens += hit_tokens
        self.bound_tokens += bound_tokens
        self.preemptions += preemptions
        self.queue.extend(queue)
        self.ttft.extend(ttft)
        self.tpot.extend(tpot)
        self.e2e.extend(e2e)
        kept = self.met_finish
        if kept is not None:
            kept.extend(met_finish)
            if len(kept) > self.exact_limit:
                self._count_per_second(kept)
                self.met_finish = None
        else:
            self._count_per_second(met_finish)

    def _count_per_second(self, finishes: Iterable[float]) -> None:
        counts = self.met_per_second
        for f in finishes:
            k = int(f)
            counts[k] = counts.get(k, 0) + 1

    @property
    def exact(self) -> bool:
        """Whether every figure is exact (no latency or timeline was folded into buckets)."""
        return self.met_finish is not None and all(
            d.exact for d in (self.queue, self.ttft, self.tpot, self.e2e)
        )

    def goodput_timeline(
        self, *, bucket_s: float, duration_s: float | None = None
    ) -> list[tuple[float, float]]:
        """As :func:`goodput_timeline` over the records added."""
        if bucket_s <= 0:
            raise ValueError("bucket_s must be positive")
        counts: dict[int, int] = {}
        last = -1
        if self.met_finish is not None:
            for f in self.met_finish:
                k = int(f // bucket_s)
                counts[k] = counts.get(k, 0) + 1
        else:
            for sec, c in self.met_per_second.items():
                k = int(sec // bucket_s)
                counts[k] = counts.get(k, 0) + c
        if counts:
            last = max(counts)
        if duration_s is not None and duration_s > 0:
            last = max(last, math.ceil(duration_s / bucket_s) - 1)
        return [(k * bucket_s, counts.get(k, 0) / bucket_s) for k in range(last + 1)]


def build_run_report(
    records: Iterable[RequestRecord],
    instances: Sequence[InstanceRecord],
    tbt: TbtHistogram,
    *,
    duration_s: float,
    wall_seconds: float,
    slo: Slo,
    extra: Mapping[str, Any] | None = None,
    timeline_bucket_s: float | None = None,
    aggregate: RunAggregate | None = None,
) -> dict[str, Any]:
    """A flat JSON-able summary of one run (keys listed in the module docs and the tests).

    ``extra`` is merged in last (its keys win). With ``timeline_bucket_s`` the report also carries
    ``goodput_timeline`` (see :func:`goodput_timeline`). With ``aggregate`` (a streamed run) the
    figures come from it and ``records`` is not read.
    """
    agg = aggregate
    if agg is None:
        agg = RunAggregate(slo)
        agg.add_all(records)
    completed = agg.completed
    met = agg.met
    prompt_tokens = agg.prompt_tokens
    output_tokens = agg.output_tokens
    total = agg.total
    duration = float(duration_s)
    queue, ttft, tpot, e2e = agg.queue, agg.ttft, agg.tpot, agg.e2e

    def rate(count: float) -> float | None:
        return count / duration if duration > 0 else None

    gpu_hours = math.fsum(i.alive_s for i in instances) / 3600.0
    gpu_cost = math.fsum(i.alive_s / 3600.0 * i.price_per_hour for i in instances)
    tokens = prompt_tokens + output_tokens

    utilisation: dict[str, float] = {}
    kv_usage_mean: dict[str, float | None] = {}
    for inst in sorted(instances, key=lambda i: i.instance_id):
        utilisation[inst.instance_id] = inst.busy_s / inst.alive_s if inst.alive_s > 0 else 0.0
        kv_usage_mean[inst.instance_id] = _mean([s.kv_usage for s in inst.samples])
    util_values = list(utilisation.values())

    report: dict[str, Any] = {
        "requests_total": total,
        "requests_completed": completed,
        "requests_failed": total - completed,
        "duration_s": duration,
        "wall_seconds": float(wall_seconds),
        "sim_seconds_per_wall_second": _ratio(duration, float(wall_seconds)),
        "throughput_rps": rate(completed),
        "output_tokens_per_s": rate(output_tokens),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "goodput_rps": rate(met),
        "slo_met": met,
        "slo_attainment": _ratio(met, total),
        "slo": slo.as_dict(),
        "ttft_mean_s": ttft.mean(),
        "ttft_p50_s": ttft.percentile(50),
        "ttft_p90_s": ttft.percentile(90),
        "ttft_p99_s": ttft.percentile(99),
        "tpot_mean_s": tpot.mean(),
        "tpot_p50_s": tpot.percentile(50),
        "tpot_p90_s": tpot.percentile(90),
        "tpot_p99_s": tpot.percentile(99),
        "tbt_p50_s": tbt.percentile(50),
        "tbt_p90_s": tbt.percentile(90),
        "tbt_p99_s": tbt.percentile(99),
        "queue_mean_s": queue.mean(),
        "queue_p50_s": queue.percentile(50),
        "queue_p99_s": queue.percentile(99),
        "e2e_mean_s": e2e.mean(),
        "e2e_p50_s": e2e.percentile(50),
        "e2e_p99_s": e2e.percentile(99),
        "prefix_hit_ratio": _ratio(agg.hit_tokens, prompt_tokens),
        "prefix_hit_bound": _ratio(agg.bound_tokens, prompt_tokens),
        "gpu_hours": gpu_hours,
        "gpu_cost_usd": gpu_cost,
        "cost_per_million_tokens": _ratio(gpu_cost, tokens / 1e6),
        "cost_per_request_usd": _ratio(gpu_cost, completed),
        "cost_per_slo_met_usd": _ratio(gpu_cost, met),  # cost per successful request (within the SLO)
        "preemptions": agg.preemptions,
        "adapter_loads": sum(i.adapter_loads for i in instances),
        "instances": len(instances),
        "utilisation": utilisation,
        "utilisation_max": max(util_values) if util_values else None,
        "utilisation_mean": _mean(util_values),
        "kv_usage_mean": kv_usage_mean,
        "failure_reasons": dict(sorted(agg.failure_reasons.items())),
        "route_reasons": dict(sorted(agg.route_reasons.items())),
    }
    if not agg.exact:
        report["percentiles"] = "log-bucketed (within 0.5 %)"
    if timeline_bucket_s is not None:
        report["goodput_timeline"] = [
            [t, g] for t, g in agg.goodput_timeline(bucket_s=timeline_bucket_s, duration_s=duration)
        ]
    if extra:
        report.update(extra)
    return report


def goodput_timeline(
    records: Iterable[RequestRecord],
    slo: Slo,
    *,
    bucket_s: float,
    duration_s: float | None = None,
) -> list[tuple[float, float]]:
    """``(bucket start s, SLO-meeting completions per second)`` by finish-time bucket.

    Buckets are ``[k * bucket_s, (k + 1) * bucket_s)`` from 0 up to the last finish (or up to
    ``duration_s`` when given, whichever is later); empty buckets give 0.0.
    """
    if bucket_s <= 0:
        raise ValueError("bucket_s must be positive")
    counts: dict[int, int] = {}
    last = -1
    for r in records:
        if r.finish_s is None or not slo.met(r):
            continue
        k = int(r.finish_s // bucket_s)
        counts[k] = counts.get(k, 0) + 1
        last = max(last, k)
    if duration_s is not None and duration_s > 0:
        last = max(last, math.ceil(duration_s / bucket_s) - 1)
    return [(k * bucket_s, counts.get(k, 0) / bucket_s) for k in range(last + 1)]


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def dumps_report(runs: Mapping[str, Mapping[str, Any]], *, scenario: Mapping[str, Any] | None = None) -> str:
    """The exact text :func:`write_report` writes (sorted keys, 2-space indent, final newline)."""
    doc = {"runs": {name: dict(run) for name, run in runs.items()}, "scenario": scenario}
    return json.dumps(doc, indent=2, sort_keys=True, default=_json_default) + "\n"


def write_report(
    out_dir: Path, runs: Mapping[str, Mapping[str, Any]], *, scenario: Mapping[str, Any] | None = None
) -> Path:
    """Write ``out_dir/report.json`` as ``{"runs": {name: report}, "scenario": ...}``; return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(dumps_report(runs, scenario=scenario), encoding="utf-8")
    return path
