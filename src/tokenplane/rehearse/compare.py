"""Twin against live: relative differences of the report fields, and the side-by-side table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

#: Report fields compared as ``(live - twin) / twin``, in the order the table prints them.
COMPARED = (
    "ttft_p50_s",
    "ttft_p99_s",
    "tbt_p50_s",
    "tbt_p99_s",
    "tpot_p50_s",
    "e2e_p50_s",
    "throughput_rps",
    "output_tokens_per_s",
    "goodput_rps",
    "slo_attainment",
    "prefix_hit_ratio",
    "prefix_hit_bound",
    "requests_total",
    "requests_completed",
    "attempts",
    "retries",
    "continuations",
    "duration_s",
)


def rel(twin: Any, live: Any) -> float | None:
    if not isinstance(twin, int | float) or not isinstance(live, int | float) or twin == 0:
        return None
    return (float(live) - float(twin)) / abs(float(twin))


def rel_diff(twin: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """Relative differences, live against twin, under the report's field names.

    ``prefix_hit_ratio_points`` is the absolute difference in percentage points; ``route_reasons``
    compares each reason's share of decisions (points); ``goodput_timeline`` each bucket's rate.
    """
    out: dict[str, Any] = {k: rel(twin.get(k), live.get(k)) for k in COMPARED}
    th, lh = twin.get("prefix_hit_ratio"), live.get("prefix_hit_ratio")
    out["prefix_hit_ratio_points"] = None if th is None or lh is None else 100.0 * (lh - th)
    tr: Mapping[str, int] = twin.get("route_reasons") or {}
    lr: Mapping[str, int] = live.get("route_reasons") or {}
    tn, ln = sum(tr.values()) or 1, sum(lr.values()) or 1
    out["route_reasons"] = {k: 100.0 * (lr.get(k, 0) / ln - tr.get(k, 0) / tn) for k in sorted({*tr, *lr})}
    tl, ll = twin.get("goodput_timeline") or [], live.get("goodput_timeline") or []
    out["goodput_timeline"] = [[t[0], rel(t[1], l_[1])] for t, l_ in zip(tl, ll, strict=False)]
    return out


def _num(v: Any, field: str) -> str:
    if v is None:
        return "-"
    if field.endswith("_s") and not field.endswith("_per_s") and field != "duration_s":
        return f"{v * 1000:.1f} ms"
    if field in ("prefix_hit_ratio", "prefix_hit_bound", "slo_attainment"):
        return f"{v:.1%}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return f"{v:.2f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def side_by_side(twin: Mapping[str, Any], live: Mapping[str, Any], diff: Mapping[str, Any]) -> list[Table]:
    t = Table(title="twin versus live")
    for col in ("field", "twin", "live", "live vs twin"):
        t.add_column(col, justify="left" if col == "field" else "right")
    for k in COMPARED:
        note = _pct(diff.get(k))
        if k == "prefix_hit_ratio" and diff.get("prefix_hit_ratio_points") is not None:
            note = f"{diff['prefix_hit_ratio_points']:+.1f} points"
        t.add_row(k, _num(twin.get(k), k), _num(live.get(k), k), note)
    reasons = Table(title="routing decisions by reason")
    for col in ("reason", "twin", "live", "share, live vs twin"):
        reasons.add_column(col, justify="left" if col == "reason" else "right")
    tr, lr = twin.get("route_reasons") or {}, live.get("route_reasons") or {}
    for k, d in diff["route_reasons"].items():
        reasons.add_row(k, str(tr.get(k, 0)), str(lr.get(k, 0)), f"{d:+.1f} points")
    timeline = Table(title="goodput over time (requests/s meeting the SLO)")
    for col in ("from s", "twin", "live", "live vs twin"):
        timeline.add_column(col, justify="right")
    tl, ll = twin.get("goodput_timeline") or [], live.get("goodput_timeline") or []
    for i in range(max(len(tl), len(ll))):
        tp = tl[i] if i < len(tl) else None
        lp = ll[i] if i < len(ll) else None
        start = (tp or lp)[0]  # type: ignore[index]
        tv = None if tp is None else tp[1]
        lv = None if lp is None else lp[1]
        timeline.add_row(
            f"{start:.0f}",
            "-" if tv is None else f"{tv:.2f}",
            "-" if lv is None else f"{lv:.2f}",
            _pct(rel(tv, lv)),
        )
    return [t, reasons, timeline]
