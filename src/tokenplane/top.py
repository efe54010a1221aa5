"""``tokenplane top``: a live terminal view of a running gateway.

Each poll reads two endpoints of the gateway, concurrently:

* ``GET /v1/instances``: every instance's view (readiness, health, in-flight work by this gateway,
  running / waiting and KV usage as last scraped, prefix-cache counters, and whatever later
  features add: breaker state, pool, weight readiness).
* ``GET /metrics``: the gateway's Prometheus text, parsed with :mod:`prometheus_client.parser`.

:func:`render` turns a :class:`TopSnapshot` and the one before it into rich tables. Rates are
deltas between the two polls divided by the time between them; a counter that went down (the
gateway restarted) counts from zero. Latency percentiles are estimated from the histogram buckets'
deltas, interpolating linearly inside a bucket as Prometheus' ``histogram_quantile`` does. Without
a previous snapshot the cumulative values since the gateway started are shown instead.

Missing fields and metric families are tolerated: a column or table that has nothing to show says
so or is left out. Families this module does not know (``tokenplane_queue_*``,
``tokenplane_breaker_*``, ``tokenplane_autoscaler_*``, retries, continuations, cost...) are listed
in a generic "control loop and other signals" table, counters as rates, histograms as rate, mean
and p99, gauges as values, so new features show up without a change here.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

__all__ = [
    "Sample",
    "TopSnapshot",
    "histogram_quantile",
    "render",
    "snapshot",
    "top",
]

#: Default TTFT objective (seconds) for the attainment estimate; the twin's ``Slo`` default.
DEFAULT_SLO_TTFT_S = 2.0

REQUESTS = "tokenplane_requests"
TTFT = "tokenplane_ttft_seconds"
DURATION = "tokenplane_request_duration_seconds"
#: Candidate names for a time-between-tokens histogram (the first one present is shown).
TBT_CANDIDATES = ("tokenplane_time_between_tokens_seconds", "tokenplane_tbt_seconds")
INSTANCE_PREFIX = "tokenplane_instance_"
#: Prefixes of families shown in the SLO table rather than among the other signals.
SLO_MARKERS = ("tokenplane_slo_",)
#: Families shown first among the other signals (the control loop's state).
CONTROL_PREFIXES = ("tokenplane_queue_", "tokenplane_breaker_", "tokenplane_autoscaler_")
#: Most rows of the "other signals" table.
MAX_OTHER_ROWS = 40
#: Breaker state field names tried, in order, in an instance's ``/v1/instances`` entry.
BREAKER_FIELDS = ("breaker", "breaker_state", "circuit", "circuit_state")
OK_OUTCOMES = frozenset({"ok"})
#: ``tokenplane_breaker_state{instance}`` values (the gateway's resilience metrics).
BREAKER_VALUES = {0.0: "closed", 1.0: "half_open", 2.0: "open"}


@dataclass(frozen=True)
class Sample:
    """One sample line: its full name (``_total``, ``_bucket``... included), labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Family:
    """One metric family (name without ``_total`` for counters, as the parser gives it)."""

    name: str
    type: str
    samples: tuple[Sample, ...]


@dataclass
class TopSnapshot:
    """What one poll of the gateway saw."""

    gateway_url: str
    taken_at: float  # time.monotonic() at the end of the poll
    wall_time: float  # time.time(), for display
    instances: list[dict[str, Any]] = field(default_factory=list)
    families: dict[str, Family] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    instances_ok: bool = False
    metrics_ok: bool = False

    @property
    def reachable(self) -> bool:
        return self.instances_ok or self.metrics_ok

    def samples(self, sample_name: str) -> list[Sample]:
        """Every sample with exactly this name (e.g. ``tokenplane_requests_total``)."""
        out: list[Sample] = []
        for name in dict.fromkeys((_family_name(sample_name), sample_name)):
            family = self.families.get(name)
            if family is not None:
                out += [s for s in family.samples if s.name == sample_name]
        return out


def _family_name(sample_name: str) -> str:
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


# -- polling ------------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, Family]:
    """Prometheus text exposition → families by name (``_created`` samples dropped)."""
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        samples = tuple(
            Sample(s.name, dict(s.labels), float(s.value))
            for s in fam.samples
            if not s.name.endswith("_created")
        )
        if not samples and fam.name.endswith("_created"):
            continue  # the client library's creation timestamps, parsed as families of their own
        seen = out.get(fam.name)
        if seen is not None:  # untyped samples come one family per line: gather them
            out[fam.name] = Family(fam.name, seen.type, seen.samples + samples)
        else:
            out[fam.name] = Family(fam.name, fam.type, samples)
    return out


async def _get(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> tuple[int, str]:
    async with session.get(url, headers=headers) as resp:
        return resp.status, await resp.text()


async def snapshot(
    gateway_url: str,
    *,
    session: aiohttp.ClientSession | None = None,
    api_key: str | None = None,
    timeout_s: float = 5.0,
) -> TopSnapshot:
    """Poll ``/v1/instances`` and ``/metrics`` once; failures end up in ``errors``, never raised."""
    base = gateway_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    own = session is None
    sess = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    snap = TopSnapshot(gateway_url=base, taken_at=0.0, wall_time=0.0)
    try:
        results = await asyncio.gather(
            _get(sess, base + "/v1/instances", headers),
            _get(sess, base + "/metrics", headers),
            return_exceptions=True,
        )
    finally:
        if own:
            await sess.close()
    snap.taken_at = time.monotonic()
    snap.wall_time = time.time()
    inst, metrics = results
    if isinstance(inst, BaseException):
        snap.errors.append(f"/v1/instances: {_describe_error(inst)}")
    elif inst[0] != 200:
        snap.errors.append(f"/v1/instances: HTTP {inst[0]}")
    else:
        try:
            doc = json.loads(inst[1])
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, list):
                raise ValueError("no 'data' list")
            snap.instances = [d for d in data if isinstance(d, dict)]
            snap.instances_ok = True
        except ValueError as exc:
            snap.errors.append(f"/v1/instances: unreadable answer ({exc})")
    if isinstance(metrics, BaseException):
        snap.errors.append(f"/metrics: {_describe_error(metrics)}")
    elif metrics[0] != 200:
        snap.errors.append(f"/metrics: HTTP {metrics[0]}")
    else:
        try:
            snap.families = parse_metrics(metrics[1])
            snap.metrics_ok = True
        except ValueError as exc:
            snap.errors.append(f"/metrics: unreadable exposition ({exc})")
    return snap


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


# -- arithmetic ---------------------------------------------------------------------------------

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


def _counter_deltas(
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


def _sum_by(items: Iterable[tuple[Sample, float]], label: str) -> dict[str, float]:
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


def _fraction_below(threshold: float, buckets: Sequence[tuple[float, float]]) -> float | None:
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
class _Hist:
    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    sum: float = 0.0

    def bucket_list(self) -> list[tuple[float, float]]:
        return sorted(self.buckets.items())


def _histograms(
    cur: TopSnapshot, prev: TopSnapshot | None, family: str, group_by: Sequence[str] | None = None
) -> dict[LabelKey, _Hist]:
    """Histogram deltas since ``prev``, summed into groups of ``group_by`` labels (all labels if None)."""
    out: dict[LabelKey, _Hist] = {}

    def group(labels: Mapping[str, str]) -> LabelKey:
        if group_by is None:
            return _key(labels, drop=("le",))
        return tuple((k, labels.get(k, "")) for k in group_by)

    for s, d in _counter_deltas(cur, prev, family + "_bucket"):
        h = out.setdefault(group(s.labels), _Hist())
        le = _le(s.labels.get("le", "+Inf"))
        h.buckets[le] = h.buckets.get(le, 0.0) + d
    for s, d in _counter_deltas(cur, prev, family + "_count"):
        out.setdefault(group(s.labels), _Hist()).count += d
    for s, d in _counter_deltas(cur, prev, family + "_sum"):
        out.setdefault(group(s.labels), _Hist()).sum += d
    return out


# -- rendering ----------------------------------------------------------------------------------


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1.0:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _fmt_num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == int(value) and abs(value) < 1e12:
        return str(int(value))
    return f"{value:.3g}"


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}/s"


def _yn(value: Any) -> str:
    if value is None:
        return "[dim]-[/]"
    return "[green]yes[/]" if value else "[bold red]no[/]"


def _kv_cell(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    pct = float(value) * 100
    colour = "green" if pct < 70 else "yellow" if pct < 90 else "red"
    filled = max(0, min(10, round(pct / 10)))
    return f"[{colour}]{'█' * filled}{'·' * (10 - filled)}[/] {pct:5.1f}%"


def _breaker_cell(state: Any) -> str:
    if state is None:
        return "[dim]-[/]"
    text = str(state)
    colour = {"closed": "green", "open": "bold red", "half_open": "yellow", "half-open": "yellow"}.get(
        text.lower(), "white"
    )
    return f"[{colour}]{text}[/]"


def _instance_rows(snap: TopSnapshot) -> list[dict[str, Any]]:
    """Instances from ``/v1/instances``; failing that, rebuilt from the ``tokenplane_instance_*`` gauges."""
    if snap.instances:
        return snap.instances
    rows: dict[str, dict[str, Any]] = {}
    mapping = {
        "tokenplane_instance_in_flight_requests": "outstanding_requests",
        "tokenplane_instance_in_flight_tokens": "outstanding_tokens",
        "tokenplane_instance_running": "running",
        "tokenplane_instance_waiting": "waiting",
        "tokenplane_instance_kv_usage": "kv_usage",
        "tokenplane_instance_prefix_cache_hits": "prefix_cache_hits",
        "tokenplane_instance_prefix_cache_queries": "prefix_cache_queries",
        "tokenplane_instance_healthy": "healthy",
    }
    for metric, key in mapping.items():
        for s in snap.samples(metric):
            iid = s.labels.get("instance")
            if iid is None:
                continue
            row = rows.setdefault(iid, {"instance_id": iid, "model": s.labels.get("model", "")})
            row[key] = bool(s.value) if key == "healthy" else s.value
    return list(rows.values())


def _breaker_states(snap: TopSnapshot) -> dict[str, str]:
    """Breaker state per instance from ``tokenplane_breaker_state*`` gauges, when exported."""
    out: dict[str, str] = {}
    for family in snap.families.values():
        if not family.name.startswith("tokenplane_breaker_state"):
            continue
        for s in family.samples:
            iid = s.labels.get("instance")
            if iid is None:
                continue
            if "state" in s.labels:
                if s.value:
                    out[iid] = s.labels["state"]
            else:
                out.setdefault(iid, BREAKER_VALUES.get(s.value, _fmt_num(s.value)))
    return out


def _prefix_hit_rate(inst: Mapping[str, Any], before: Mapping[str, Any] | None) -> float | None:
    hits, queries = inst.get("prefix_cache_hits"), inst.get("prefix_cache_queries")
    if not isinstance(hits, (int, float)) or not isinstance(queries, (int, float)):
        return None
    if before is not None:
        ph, pq = before.get("prefix_cache_hits"), before.get("prefix_cache_queries")
        if isinstance(ph, (int, float)) and isinstance(pq, (int, float)) and queries >= pq and hits >= ph:
            dq = queries - pq
            if dq > 0:
                return (hits - ph) / dq
            # No lookups in the interval: the cumulative ratio below.
    return hits / queries if queries > 0 else None


def _instances_table(snap: TopSnapshot, prev: TopSnapshot | None) -> Table:
    from rich.table import Table

    rows = _instance_rows(snap)
    before = {str(i.get("instance_id")): i for i in _instance_rows(prev)} if prev is not None else {}
    breakers = _breaker_states(snap)
    show_breaker = bool(breakers) or any(any(f in r for f in BREAKER_FIELDS) for r in rows)
    show_pool = any("pool" in r or "pool" in (r.get("labels") or {}) for r in rows)
    show_weights = any(r.get("weights") not in (None, "warm") for r in rows)
    table = Table(title="instances", title_justify="left", expand=False, pad_edge=False)
    table.add_column("model")
    if show_pool:
        table.add_column("pool")
    table.add_column("instance")
    table.add_column("gpu")
    if show_weights:
        table.add_column("weights")
    table.add_column("ready", justify="center")
    table.add_column("healthy", justify="center")
    if show_breaker:
        table.add_column("breaker", justify="center")
    table.add_column("in-flight", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("running", justify="right")
    table.add_column("waiting", justify="right")
    table.add_column("KV", justify="left")
    table.add_column("prefix hit", justify="right")
    if not rows:
        table.add_row("[dim](no instances reported)[/]")
        return table
    ordered = sorted(rows, key=lambda r: (str(r.get("model", "")), str(r.get("instance_id", ""))))
    last_model: str | None = None
    for r in ordered:
        iid = str(r.get("instance_id", "?"))
        model = str(r.get("model", ""))
        cells: list[str] = [model if model != last_model else ""]
        if last_model is not None and model != last_model:
            table.add_section()
        last_model = model
        if show_pool:
            cells.append(str(r.get("pool") or (r.get("labels") or {}).get("pool") or "-"))
        cells += [iid, str(r.get("gpu") or "-")]
        if show_weights:
            cells.append(str(r.get("weights") or "-"))
        cells += [_yn(r.get("ready")), _yn(r.get("healthy"))]
        if show_breaker:
            state = next((r[f] for f in BREAKER_FIELDS if f in r), None)
            if isinstance(state, Mapping):
                state = state.get("state")
            cells.append(_breaker_cell(state if state is not None else breakers.get(iid)))
        cells += [
            _fmt_num(r.get("outstanding_requests")),
            _fmt_num(r.get("outstanding_tokens")),
            _fmt_num(r.get("running")),
            _fmt_num(r.get("waiting")),
            _kv_cell(r.get("kv_usage")),
            _fmt_pct(_prefix_hit_rate(r, before.get(iid))),
        ]
        table.add_row(*cells)
    return table


def _tbt_family(snap: TopSnapshot) -> str | None:
    return next((n for n in TBT_CANDIDATES if n in snap.families), None)


def _models_table(snap: TopSnapshot, prev: TopSnapshot | None, dt: float | None, slo_ttft_s: float) -> Table:
    from rich.table import Table

    reqs = _counter_deltas(snap, prev, REQUESTS + "_total")
    by_model: dict[str, dict[str, float]] = {}
    for s, d in reqs:
        m = by_model.setdefault(s.labels.get("model", ""), {"all": 0.0, "err": 0.0})
        m["all"] += d
        if s.labels.get("outcome") not in OK_OUTCOMES:
            m["err"] += d
    ttft = _histograms(snap, prev, TTFT, ("model",))
    dur = _histograms(snap, prev, DURATION, ("model",))
    tbt_name = _tbt_family(snap)
    tbt = _histograms(snap, prev, tbt_name, ("model",)) if tbt_name else {}
    models = sorted(set(by_model) | {dict(k).get("model", "") for k in (*ttft, *dur, *tbt)})
    per = "req/s" if dt else "requests"
    table = Table(title="traffic by model" + ("" if dt else " (since start)"), title_justify="left")
    table.add_column("model")
    table.add_column(per, justify="right")
    table.add_column("errors", justify="right")
    table.add_column("TTFT p50", justify="right")
    table.add_column("TTFT p99", justify="right")
    table.add_column(f"TTFT≤{slo_ttft_s:g}s", justify="right")
    if tbt_name:
        table.add_column("TBT p50", justify="right")
        table.add_column("TBT p99", justify="right")
    table.add_column("E2E p50", justify="right")
    table.add_column("E2E p99", justify="right")
    if not models:
        table.add_row("[dim](no requests yet)[/]")
        return table
    for model in models:
        key = (("model", model),)
        counts = by_model.get(model, {"all": 0.0, "err": 0.0})
        total = counts["all"] / dt if dt else counts["all"]
        errors = _fmt_pct(counts["err"] / counts["all"]) if counts["all"] > 0 else "-"
        t = ttft.get(key)
        e = dur.get(key)
        cells = [
            model or "[dim](none)[/]",
            f"{total:.2f}" if dt else _fmt_num(total),
            errors,
            _fmt_s(histogram_quantile(0.5, t.bucket_list())) if t else "-",
            _fmt_s(histogram_quantile(0.99, t.bucket_list())) if t else "-",
            _fmt_pct(_fraction_below(slo_ttft_s, t.bucket_list())) if t else "-",
        ]
        if tbt_name:
            b = tbt.get(key)
            cells += [
                _fmt_s(histogram_quantile(0.5, b.bucket_list())) if b else "-",
                _fmt_s(histogram_quantile(0.99, b.bucket_list())) if b else "-",
            ]
        cells += [
            _fmt_s(histogram_quantile(0.5, e.bucket_list())) if e else "-",
            _fmt_s(histogram_quantile(0.99, e.bucket_list())) if e else "-",
        ]
        table.add_row(*cells)
    return table


def _breakdown_table(title: str, label: str, counts: Mapping[str, float], dt: float | None) -> Table:
    from rich.table import Table

    table = Table(title=title + ("" if dt else " (since start)"), title_justify="left")
    table.add_column(label)
    table.add_column("req/s" if dt else "requests", justify="right")
    table.add_column("share", justify="right")
    total = sum(counts.values())
    shown = {k: v for k, v in counts.items() if v > 0}
    if not shown:
        table.add_row("[dim](none in this interval)[/]" if dt else "[dim](none yet)[/]", "", "")
        return table
    for k, v in sorted(shown.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add_row(
            k or "-", f"{v / dt:.2f}" if dt else _fmt_num(v), _fmt_pct(v / total if total else None)
        )
    return table


def _label_text(labels: Mapping[str, str], drop: Iterable[str] = ()) -> str:
    dropped = set(drop)
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in dropped)


def _family_rows(
    snap: TopSnapshot, prev: TopSnapshot | None, family: Family, dt: float | None
) -> list[tuple[str, str, str]]:
    """(name, labels, value text) rows for one family, whatever its type."""
    rows: list[tuple[str, str, str]] = []
    if family.type == "histogram":
        for key, h in sorted(_histograms(snap, prev, family.name).items()):
            count = h.count or (h.bucket_list()[-1][1] if h.buckets else 0.0)
            rate = f"{count / dt:.2f}/s" if dt else f"n={_fmt_num(count)}"
            mean = h.sum / count if count > 0 else None
            p99 = histogram_quantile(0.99, h.bucket_list())
            rows.append(
                (family.name, _label_text(dict(key)), f"{rate}  mean {_fmt_num(mean)}  p99 {_fmt_num(p99)}")
            )
    elif family.type == "counter":
        for s, d in _counter_deltas(snap, prev, family.name + "_total"):
            rows.append((s.name, _label_text(s.labels), _fmt_rate(d / dt) if dt else _fmt_num(s.value)))
    else:
        for s in family.samples:
            if s.name.endswith(("_created",)):
                continue
            rows.append((s.name, _label_text(s.labels), _fmt_num(s.value)))
    return rows


def _known(name: str) -> bool:
    name = _family_name(name)
    return (
        name in (REQUESTS, TTFT, DURATION, *TBT_CANDIDATES)
        or name.startswith(INSTANCE_PREFIX)
        or name.startswith(SLO_MARKERS)
    )


def _other_table(snap: TopSnapshot, prev: TopSnapshot | None, dt: float | None) -> Table | None:
    from rich.table import Table

    names = [
        n for n, f in snap.families.items() if n.startswith("tokenplane_") and f.samples and not _known(n)
    ]
    if not names:
        return None
    names.sort(key=lambda n: (not n.startswith(CONTROL_PREFIXES), n))
    table = Table(title="queue, breakers, autoscaler and other signals", title_justify="left")
    table.add_column("metric")
    table.add_column("labels")
    table.add_column("value" if not dt else "value / rate", justify="right")
    n = 0
    for name in names:
        for row in _family_rows(snap, prev, snap.families[name], dt):
            if n >= MAX_OTHER_ROWS:
                table.add_row("[dim]…[/]", "", "")
                return table
            table.add_row(*row)
            n += 1
    return table


def _slo_table(snap: TopSnapshot, prev: TopSnapshot | None, dt: float | None) -> Table | None:
    from rich.table import Table

    fams = [f for n, f in sorted(snap.families.items()) if n.startswith(SLO_MARKERS)]
    if not fams:
        return None
    table = Table(title="SLO attainment", title_justify="left")
    table.add_column("metric")
    table.add_column("labels")
    table.add_column("value", justify="right")
    for f in fams:
        for name, labels, value in _family_rows(snap, prev, f, dt):
            table.add_row(name, labels, value)
    return table


def render(
    snap: TopSnapshot, previous: TopSnapshot | None = None, *, slo_ttft_s: float = DEFAULT_SLO_TTFT_S
) -> RenderableType:
    """One frame: a header, traffic by model, outcomes, routing decisions, instances and extras."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    dt: float | None = None
    if previous is not None and previous.metrics_ok and snap.metrics_ok:
        span = snap.taken_at - previous.taken_at
        dt = span if span > 0 else None
    prev = previous if dt is not None else None

    reqs = _counter_deltas(snap, prev, REQUESTS + "_total")
    total = sum(d for _, d in reqs)
    errors = sum(d for s, d in reqs if s.labels.get("outcome") not in OK_OUTCOMES)
    instances = _instance_rows(snap)
    healthy = sum(1 for i in instances if i.get("healthy"))
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.wall_time)) if snap.wall_time else "-"

    header = Text()
    header.append("tokenplane top", style="bold")
    header.append(f"  {snap.gateway_url}  {stamp}")
    if not snap.reachable:
        header.append("  UNREACHABLE", style="bold red")
    header.append("\n")
    header.append(f"instances {healthy}/{len(instances)} healthy   ")
    if dt:
        header.append(f"requests {total / dt:.2f}/s   ", style="bold")
        header.append(f"errors {errors / dt:.2f}/s ({_fmt_pct(errors / total if total else None)})   ")
        header.append(f"over the last {dt:.1f} s", style="dim")
    else:
        header.append(f"requests {_fmt_num(total)} since start   errors {_fmt_num(errors)}   ")
        header.append("(rates from the next poll)", style="dim")

    parts: list[RenderableType] = [header, _models_table(snap, prev, dt, slo_ttft_s)]
    grid = Table.grid(padding=(0, 3))
    grid.add_row(
        _breakdown_table("outcomes", "outcome", _sum_by(reqs, "outcome"), dt),
        _breakdown_table("routing decisions", "reason", _sum_by(reqs, "reason"), dt),
    )
    parts += [grid, _instances_table(snap, prev)]
    slo = _slo_table(snap, prev, dt)
    if slo is not None:
        parts.append(slo)
    other = _other_table(snap, prev, dt)
    if other is not None:
        parts.append(other)
    for e in snap.errors:
        parts.append(Text(f"error: {e}", style="red"))
    return Group(*parts)


# -- the command --------------------------------------------------------------------------------


async def _run(gateway: str, interval: float, once: bool, console: Console, api_key: str | None) -> int:
    from rich.live import Live

    interval = max(interval, 0.05)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(5.0, interval))) as session:
        first = await snapshot(gateway, session=session, api_key=api_key)
        if once:
            if first.reachable:
                await asyncio.sleep(interval)
                second = await snapshot(gateway, session=session, api_key=api_key)
                console.print(render(second, first))
                return 0 if second.reachable else 1
            console.print(render(first))
            return 1
        prev = first
        with Live(render(first), console=console, auto_refresh=False, screen=False) as live:
            while True:
                await asyncio.sleep(interval)
                snap = await snapshot(gateway, session=session, api_key=api_key)
                live.update(render(snap, prev), refresh=True)
                prev = snap


def top(
    gateway: str,
    interval: float = 1.0,
    once: bool = False,
    *,
    console: Console | None = None,
    api_key: str | None = None,
) -> None:
    """Show the gateway live until Ctrl-C; with ``once``, one frame (two polls ``interval`` apart).

    With ``once`` an unreachable gateway exits with status 1 (``SystemExit``).
    """
    from rich.console import Console

    console = console or Console()
    try:
        code = asyncio.run(_run(gateway, interval, once, console, api_key))
    except KeyboardInterrupt:
        return
    if code:
        raise SystemExit(code)
