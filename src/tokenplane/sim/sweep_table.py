"""A sweep's table: ``sweep.csv`` and ``sweep.json`` (one row per variant) and the rich table the
command prints. :mod:`tokenplane.sim.sweep_plots` draws its plots."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenplane.sim.sweep import SweepResult


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def write_table(out_dir: Path, result: SweepResult) -> list[Path]:
    """``sweep.csv`` (one row per variant) and ``sweep.json`` (the same rows with the sweep's settings)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = columns(result.rows)
    csv_path = out_dir / "sweep.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=cols)
        writer.writeheader()
        for r in result.rows:
            writer.writerow({k: "" if r.get(k) is None else r.get(k) for k in cols})
    json_path = out_dir / "sweep.json"
    doc = {
        "name": result.spec.name,
        "scenario": result.spec.scenario,
        "axes": result.spec.axes,
        "reference": result.spec.reference,
        "engine": result.engine,
        "workers": result.workers,
        "wall_s": result.wall_s,
        "rows": result.rows,
    }
    json_path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return [csv_path, json_path]


def sweep_table(result: SweepResult) -> Any:
    """A rich table, one row per variant: the axes, the run and the headline figures."""
    from rich.table import Table

    spec = result.spec
    table = Table(
        title=f"sweep {spec.name}: {len(result.rows)} variants, {result.wall_s:.1f} s ({result.engine})"
    )
    heads = [*spec.axes, "run", "goodput rps", "tail goodput", "SLO att.", "TTFT p99 ms", "cost $", "pareto"]
    if spec.reference:
        heads.insert(-1, "tail vs ref")
    for h in heads:
        table.add_column(h, justify="left" if h in spec.axes or h == "run" else "right")

    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in result.rows:
        cells = [str(r.get(a)) for a in spec.axes] + [
            str(r["run"]),
            num(r.get("goodput_rps"), ".2f"),
            num(r.get("tail_goodput_rps"), ".2f"),
            num(None if r.get("slo_attainment") is None else r["slo_attainment"] * 100, ".1f") + "%",
            num(None if r.get("ttft_p99_s") is None else r["ttft_p99_s"] * 1000, ".0f"),
            num(r.get("gpu_cost_usd"), ".2f"),
        ]
        if spec.reference:
            v = r.get("tail_goodput_vs_reference")
            cells.append("-" if v is None else f"{v * 100:.0f}%")
        cells.append("*" if r.get("pareto") else "")
        table.add_row(*cells)
    return table
