"""Where prefill/decode disaggregation wins: each ``colocated-X`` run against ``disaggregated-X``.

Computed from the runs' reports (never written by hand): for every workload suffix ``X`` with
both runs, the GPU count of each (instances x tensor parallelism, to check the comparison is at
equal GPUs), and for TTFT p99, TBT p99, goodput within the SLO and the cost per request that met
the SLO, which side wins and by how much (the ratio of the worse figure to the better; within 1 %
neither does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

COLOCATED, DISAGGREGATED = "colocated-", "disaggregated-"
EVEN_WITHIN = 0.01  # figures within 1 % of each other: neither side wins
# report key, label, unit scale, unit, higher is better
METRICS: tuple[tuple[str, str, float, str, bool], ...] = (
    ("ttft_p99_s", "TTFT p99", 1000.0, " ms", False),
    ("tbt_p99_s", "TBT p99", 1000.0, " ms", False),
    ("goodput_rps", "goodput", 1.0, " req/s", True),
    ("cost_per_slo_met_usd", "cost per 1k SLO-met requests", 1000.0, " $", False),
)


def gpus(run: Mapping[str, Any]) -> int:
    groups = run.get("groups")
    if groups:
        return sum(int(g.get("instances", 0)) * int(g.get("tp", 1)) for g in groups)
    return int(run.get("instances", 0)) * int(run.get("tp", 1))


def compare(colocated: Mapping[str, Any], disaggregated: Mapping[str, Any]) -> dict[str, Any]:
    """Per metric: both figures, the winner (``disaggregated``, ``colocated``, or ``even`` within
    1 %) and the factor (worse / better, >= 1; None where a figure is missing or zero)."""
    out: dict[str, Any] = {"gpus": {"colocated": gpus(colocated), "disaggregated": gpus(disaggregated)}}
    for key, _, _, _, higher in METRICS:
        c, d = colocated.get(key), disaggregated.get(key)
        entry: dict[str, Any] = {"colocated": c, "disaggregated": d, "winner": None, "factor": None}
        if c is not None and d is not None:
            lo, hi = min(c, d), max(c, d)
            if hi == lo or (lo > 0 and hi / lo < 1 + EVEN_WITHIN):
                entry["winner"], entry["factor"] = "even", hi / lo if lo > 0 else 1.0
            else:
                d_better = d > c if higher else d < c
                entry["winner"] = "disaggregated" if d_better else "colocated"
                better, worse = (d, c) if d_better else (c, d)
                if higher:
                    better, worse = worse, better
                entry["factor"] = worse / better if better > 0 else None
        out[key] = entry
    return out


def comparisons(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{X: compare(colocated-X, disaggregated-X)}`` for every X that has both runs."""
    out = {}
    for name, run in runs.items():
        if name.startswith(COLOCATED):
            suffix = name[len(COLOCATED) :]
            other = runs.get(DISAGGREGATED + suffix)
            if other is not None:
                out[suffix] = compare(run, other)
    return out


def _fmt(value: Any, scale: float, unit: str) -> str:
    if value is None:
        return "-"
    if unit == " $":
        return f"${value * scale:.3g}"
    return f"{value * scale:.1f}{unit}"


def summary_lines(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per compared workload: who wins each metric and by how much."""
    lines = []
    for suffix, cmp in comparisons(runs).items():
        g = cmp["gpus"]
        equal = "equal GPUs" if g["colocated"] == g["disaggregated"] else "UNEQUAL GPUs"
        head = f"{suffix}: {g['colocated']} vs {g['disaggregated']} GPUs ({equal}):"
        parts = []
        for key, label, scale, unit, _ in METRICS:
            e = cmp[key]
            figures = f"{_fmt(e['colocated'], scale, unit)} -> {_fmt(e['disaggregated'], scale, unit)}"
            if e["winner"] is None:
                parts.append(f"{label} {figures} (n/a)")
            elif e["winner"] == "even":
                parts.append(f"{label} {figures} (even, within {EVEN_WITHIN:.0%})")
            else:
                factor = f" by {e['factor']:.2f}x" if e["factor"] is not None else ""
                parts.append(f"{label} {figures} ({e['winner']} wins{factor})")
        lines.append(head + " " + "; ".join(parts))
    return lines


def print_comparison(runs: Mapping[str, Mapping[str, Any]], console: Console) -> None:
    """Print :func:`summary_lines` under a heading (nothing when no run pair is there)."""
    lines = summary_lines(runs)
    if lines:
        console.print("where prefill/decode disaggregation wins (disaggregated vs colocated, from the runs):")
        for line in lines:
            console.print("  " + line, highlight=False)
