"""A self-contained ``report.html`` for twin runs: one file to open, mail or attach.

Everything is inline: the CSS in a ``<style>`` element, the PNG plots as ``data:image/png;base64``
URIs, no script and no external reference, so the page reads the same offline and in a mail
client. It holds the scenario name, a summary table of the headline fields per run (only the
columns some run has), the plots, and each run's full report as a collapsed table of its scalar
fields (lists and mappings are summarised by their size; ``report.json`` keeps the data).
"""

from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["SUMMARY_FIELDS", "write_html_report"]

#: Summary columns, in order: (report key, header, format). Absent in every run → column left out.
SUMMARY_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("requests_total", "requests", "int"),
    ("requests_completed", "completed", "int"),
    ("requests_failed", "failed", "int"),
    ("throughput_rps", "throughput rps", "f2"),
    ("goodput_rps", "goodput rps", "f2"),
    ("slo_attainment", "SLO attainment", "pct"),
    ("ttft_p50_s", "TTFT p50", "ms"),
    ("ttft_p99_s", "TTFT p99", "ms"),
    ("tbt_p50_s", "TBT p50", "ms"),
    ("tbt_p99_s", "TBT p99", "ms"),
    ("e2e_p99_s", "E2E p99", "ms"),
    ("prefix_hit_ratio", "prefix hit", "pct"),
    ("utilisation_max", "util max", "pct"),
    ("gpu_hours", "GPU-hours", "f2"),
    ("cost_usd", "cost $", "f2"),
    ("cost_per_million_tokens", "$/Mtok", "f3"),
)

_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1d2330; background: #fafbfc; margin: 2em auto; max-width: 1200px; padding: 0 1.5em; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #d8dde6; padding-bottom: .3em; }
.meta { color: #5b6475; margin-top: 0; }
table { border-collapse: collapse; margin: .8em 0; background: #fff; }
th, td { border: 1px solid #d8dde6; padding: .35em .7em; }
th { background: #eef1f6; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.name { font-weight: 600; }
figure { margin: 1.2em 0; background: #fff; border: 1px solid #d8dde6; padding: .8em; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: #5b6475; text-align: center; margin-top: .4em; }
details { margin: .6em 0; }
summary { cursor: pointer; font-weight: 600; }
""".strip()


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _format(value: Any, kind: str) -> str:
    v = _num(value)
    if v is None:
        return "-" if value is None else html.escape(str(value))
    if kind == "int":
        return f"{round(v):,}"
    if kind == "pct":
        return f"{v * 100:.1f}%"
    if kind == "ms":
        return f"{v * 1000:.1f} ms"
    if kind == "f3":
        return f"{v:.3f}"
    return f"{v:.2f}"


def _scalar(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"{len(value)} entries"
    if isinstance(value, (list, tuple)):
        return f"{len(value)} items"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _summary_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    cols = [f for f in SUMMARY_FIELDS if any(f[0] in r for r in runs.values())]
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in cols)
    rows = []
    for name, run in runs.items():
        cells = "".join(f'<td class="num">{_format(run.get(k), kind)}</td>' for k, _, kind in cols)
        rows.append(f'<tr><td class="name">{html.escape(str(name))}</td>{cells}</tr>')
    return f"<table><thead><tr><th>run</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _run_details(name: str, run: Mapping[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_scalar(v))}</td></tr>"
        for k, v in sorted(run.items(), key=lambda kv: str(kv[0]))
    )
    return (
        f"<details><summary>{html.escape(str(name))}: every field</summary>"
        f"<table><tbody>{rows}</tbody></table></details>"
    )


def _caption(path: Path) -> str:
    return path.stem.replace("_", " ")


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    caption = html.escape(_caption(path))
    return (
        f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _scenario_name(scenario: str | Mapping[str, Any] | None) -> str | None:
    if scenario is None:
        return None
    if isinstance(scenario, Mapping):
        name = scenario.get("name")
        return None if name is None else str(name)
    return str(scenario)


def write_html_report(
    out_dir: Path,
    runs: Mapping[str, Mapping[str, Any]],
    images: Iterable[Path],
    *,
    scenario: str | Mapping[str, Any] | None = None,
    title: str | None = None,
    filename: str = "report.html",
) -> Path:
    """Write ``out_dir/report.html`` (self-contained) and return its path.

    ``runs``: run name → report (as in ``report.json``). ``images``: PNG files (the plots, e.g.
    what :func:`~tokenplane.sim.plots.plot_runs` returned), embedded in the given order; files
    that are missing or not PNGs are skipped. ``scenario``: its name, or the mapping
    :func:`~tokenplane.sim.report.write_report` stores (its ``name`` is shown).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = _scenario_name(scenario)
    heading = title or (f"tokenplane twin: {name}" if name else "tokenplane twin report")
    pngs = [Path(p) for p in images if Path(p).is_file() and Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    meta = [f"{len(runs)} run(s)"]
    if name:
        meta.insert(0, f"scenario <strong>{html.escape(name)}</strong>")
    meta.append(f"written {html.escape(stamp)}")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(heading)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(heading)}</h1>",
        f'<p class="meta">{" · ".join(meta)}</p>',
        "<h2>Summary</h2>",
        _summary_table(runs) if runs else "<p>No runs.</p>",
    ]
    if pngs:
        parts.append("<h2>Plots</h2>")
        parts += [_figure(p) for p in pngs]
    if runs:
        parts.append("<h2>Runs</h2>")
        parts += [_run_details(str(n), r) for n, r in runs.items()]
    parts.append("</body></html>")
    path = out_dir / filename
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path
