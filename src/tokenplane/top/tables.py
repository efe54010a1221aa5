"""One frame of ``tokenplane top``: the header and the rich tables drawn from two snapshots.

Missing fields and metric families are tolerated: a column or table that has nothing to show says
so or is left out. Families this module does not know (``tokenplane_queue_*``,
``tokenplane_breaker_*``, ``tokenplane_autoscaler_*``, retries, continuations, cost...) are listed
in a generic "control loop and other signals" table, counters as rates, histograms as rate, mean
and p99, gauges as values, so new features show up without a change here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tokenplane.top.deltas import counter_deltas, fraction_below, histogram_quantile, histograms, sum_by
from tokenplane.top.snapshot import Family, TopSnapshot, family_name

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

#: Default TTFT objective (seconds) for the attainment estimate; the twin's ``Slo`` default.
DEFAULT_SLO_TTFT_S = 2.0
#: A view older than this is marked stale: twice the gateway's default scrape timeout
#: (``scrape.timeout_s``), so at least one whole scrape failed since the last that landed.
STALE_VIEW_S = 10.0

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


def _age_cell(scraped_at: Any, now: float) -> str:
    """How old the gateway's view of the instance is (its last scrape that landed)."""
    if not isinstance(scraped_at, (int, float)):
        return "[dim]never[/]"
    age = max(0.0, now - float(scraped_at))
    text = f"{age:.1f}s" if age < 100 else f"{age:.0f}s"
    return f"[bold red]{text} stale[/]" if age > STALE_VIEW_S else text


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
        "tokenplane_instance_scrape_timestamp_seconds": "scraped_at",
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
    show_age = any("scraped_at" in r for r in rows)
    if show_age:
        table.add_column("view age", justify="right")
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
        if show_age:
            cells.append(_age_cell(r.get("scraped_at"), snap.wall_time))
        table.add_row(*cells)
    return table


def _tbt_family(snap: TopSnapshot) -> str | None:
    return next((n for n in TBT_CANDIDATES if n in snap.families), None)


def _models_table(snap: TopSnapshot, prev: TopSnapshot | None, dt: float | None, slo_ttft_s: float) -> Table:
    from rich.table import Table

    reqs = counter_deltas(snap, prev, REQUESTS + "_total")
    by_model: dict[str, dict[str, float]] = {}
    for s, d in reqs:
        m = by_model.setdefault(s.labels.get("model", ""), {"all": 0.0, "err": 0.0})
        m["all"] += d
        if s.labels.get("outcome") not in OK_OUTCOMES:
            m["err"] += d
    ttft = histograms(snap, prev, TTFT, ("model",))
    dur = histograms(snap, prev, DURATION, ("model",))
    tbt_name = _tbt_family(snap)
    tbt = histograms(snap, prev, tbt_name, ("model",)) if tbt_name else {}
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
            _fmt_pct(fraction_below(slo_ttft_s, t.bucket_list())) if t else "-",
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
        for key, h in sorted(histograms(snap, prev, family.name).items()):
            count = h.count or (h.bucket_list()[-1][1] if h.buckets else 0.0)
            rate = f"{count / dt:.2f}/s" if dt else f"n={_fmt_num(count)}"
            mean = h.sum / count if count > 0 else None
            p99 = histogram_quantile(0.99, h.bucket_list())
            rows.append(
                (family.name, _label_text(dict(key)), f"{rate}  mean {_fmt_num(mean)}  p99 {_fmt_num(p99)}")
            )
    elif family.type == "counter":
        for s, d in counter_deltas(snap, prev, family.name + "_total"):
            rows.append((s.name, _label_text(s.labels), _fmt_rate(d / dt) if dt else _fmt_num(s.value)))
    else:
        for s in family.samples:
            if s.name.endswith(("_created",)):
                continue
            rows.append((s.name, _label_text(s.labels), _fmt_num(s.value)))
    return rows


def _known(name: str) -> bool:
    name = family_name(name)
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

    reqs = counter_deltas(snap, prev, REQUESTS + "_total")
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
        _breakdown_table("outcomes", "outcome", sum_by(reqs, "outcome"), dt),
        _breakdown_table("routing decisions", "reason", sum_by(reqs, "reason"), dt),
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
