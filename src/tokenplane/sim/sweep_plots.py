"""PNG charts of a sweep (matplotlib, Agg): the Pareto front of cost against SLO attainment, and heat
maps of one figure over two axes (one panel per run and per point of the other axes)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenplane.sim.sweep import HeatmapSpec, SweepResult

__all__ = ["plot_heatmap", "plot_pareto", "plot_sweep"]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def plot_pareto(out_dir: Path, result: SweepResult) -> Path:
    """``pareto.png``: every variant as a point (one colour per run), the front joined by a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key = result.spec.pareto.get("x", "gpu_cost_usd")
    y_key = result.spec.pareto.get("y", "slo_attainment")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    runs = list(dict.fromkeys(str(r["run"]) for r in result.rows))
    for run in runs:
        pts = [(r[x_key], r[y_key]) for r in result.rows if r["run"] == run and r.get(x_key) is not None]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=run, alpha=0.75, s=28)
    front = sorted((r[x_key], r[y_key]) for r in result.rows if r.get("pareto") and r.get(x_key) is not None)
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], color="black", lw=1.2, label="Pareto front")
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    ax.set_title(f"{result.spec.name}: {y_key} against {x_key} ({len(result.rows)} variants)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = out_dir / "pareto.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell(rows: Sequence[Mapping[str, Any]], want: Mapping[str, Any], value: str) -> float | None:
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            v = r.get(value)
            return None if v is None else float(v)
    return None


def plot_heatmap(out_dir: Path, result: SweepResult, hm: HeatmapSpec, index: int) -> Path:
    """``heatmap-<i>-<value>.png``: rows of panels are runs, columns the points of the other axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = result.spec
    runs = [r for r in dict.fromkeys(str(r["run"]) for r in result.rows)]
    if hm.value.endswith("_vs_reference"):
        runs = [r for r in runs if r != spec.reference] or runs
    others = [a for a in spec.axes if a not in (hm.x, hm.y)]
    other_points = list(itertools.product(*(spec.axes[a] for a in others))) or [()]
    xs, ys = spec.axes[hm.x], spec.axes[hm.y]
    ratio = hm.value.endswith("_vs_reference") or hm.value in ("slo_attainment",)
    fig, axes = plt.subplots(
        len(runs),
        len(other_points),
        figsize=(1.2 + 0.9 * len(xs) * len(other_points) + 1.5, 1.2 + (0.7 * len(ys) + 1.2) * len(runs)),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for i, run in enumerate(runs):
        for j, op in enumerate(other_points):
            ax = axes[i][j]
            fixed = {**dict(zip(others, op, strict=True)), "run": run}
            grid = [[_cell(result.rows, {**fixed, hm.x: x, hm.y: y}, hm.value) for x in xs] for y in ys]
            data = [[float("nan") if v is None else v for v in row] for row in grid]
            image = ax.imshow(
                data,
                origin="lower",
                aspect="auto",
                cmap="RdYlGn",
                vmin=0.0 if ratio else None,
                vmax=1.0 if ratio else None,
            )
            for yi, row in enumerate(grid):
                for xi, v in enumerate(row):
                    if v is not None:
                        text = f"{v * 100:.0f}%" if ratio else f"{v:.3g}"
                        ax.text(xi, yi, text, ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(xs)), [str(x) for x in xs], fontsize=7)
            ax.set_yticks(range(len(ys)), [str(y) for y in ys], fontsize=7)
            ax.set_xlabel(hm.x, fontsize=8)
            ax.set_ylabel(hm.y, fontsize=8)
            title = run + (
                "" if not others else "\n" + ", ".join(f"{k}={v}" for k, v in fixed.items() if k != "run")
            )
            ax.set_title(title, fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label=hm.value)
    fig.suptitle(f"{spec.name}: {hm.value}", fontsize=10)
    path = out_dir / f"heatmap-{index}-{_slug(hm.value)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(out_dir: Path, result: SweepResult) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [plot_pareto(out_dir, result)]
    for i, hm in enumerate(result.spec.heatmaps):
        files.append(plot_heatmap(out_dir, result, hm, i))
    return files
