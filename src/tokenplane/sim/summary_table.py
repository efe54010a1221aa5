"""The console summary of twin runs: one row per run with its headline numbers (latencies in
milliseconds), then the disaggregated runs' comparison (:mod:`tokenplane.sim.disagg_report`). Reads
the flat reports :func:`~tokenplane.sim.report.build_run_report` makes; also importable from
:mod:`tokenplane.sim.report`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return format(int(value) if spec == "d" else value, spec)
    return str(value)


def _fmt_ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _fmt_pct(value: Any) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def summary_table(runs: Mapping[str, Mapping[str, Any]]) -> Table:
    """One row per run with the headline numbers (latencies in milliseconds)."""
    from rich.table import Table

    table = Table(title="tokenplane twin runs")
    for header in (
        "run",
        "requests",
        "thru rps",
        "out tok/s",
        "goodput rps",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TBT p50 ms",
        "TBT p99 ms",
        "prefix hit",
        "hit bound",
        "util max",
        "$/Mtok",
        "wall s",
    ):
        table.add_column(header, justify="left" if header == "run" else "right")
    for name, run in runs.items():
        completed = run.get("requests_completed")
        total = run.get("requests_total")
        requests = f"{_fmt(completed, 'd')}/{_fmt(total, 'd')}" if total is not None else _fmt(completed, "d")
        table.add_row(
            str(name),
            requests,
            _fmt(run.get("throughput_rps"), ".2f"),
            _fmt(run.get("output_tokens_per_s"), ".0f"),
            _fmt(run.get("goodput_rps"), ".2f"),
            _fmt_ms(run.get("ttft_p50_s")),
            _fmt_ms(run.get("ttft_p99_s")),
            _fmt_ms(run.get("tbt_p50_s")),
            _fmt_ms(run.get("tbt_p99_s")),
            _fmt_pct(run.get("prefix_hit_ratio")),
            _fmt_pct(run.get("prefix_hit_bound")),
            _fmt_pct(run.get("utilisation_max")),
            _fmt(run.get("cost_per_million_tokens"), ".3f"),
            _fmt(run.get("wall_seconds"), ".2f"),
        )
    return table


def print_summary(runs: Mapping[str, Mapping[str, Any]], console: Console | None = None) -> None:
    """Print :func:`summary_table` to ``console`` (a fresh stdout console by default)."""
    if console is None:
        from rich.console import Console

        console = Console()
    console.print(summary_table(runs))
    from tokenplane.sim.disagg_report import print_comparison

    print_comparison(runs, console)
