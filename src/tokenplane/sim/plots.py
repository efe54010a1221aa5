"""PNG charts of twin runs (matplotlib, Agg backend, nothing shown on screen).

Every line is cut to at most :data:`MAX_POINTS` points, so a million-request run plots in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenplane.sim.records import InstanceRecord, RequestRecord
from tokenplane.sim.report import Slo, goodput_timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["MAX_POINTS", "RunData", "plot_fleet_timeline", "plot_runs"]

#: Most points drawn per line.
MAX_POINTS = 5000
#: Above this many instances a timeline shows mean / min / max rather than one line each.
MAX_INSTANCE_LINES = 16
#: Time bins for the aggregated instance timelines and the goodput timeline.
TIMELINE_BINS = 200


@dataclass
class RunData:
    """What :func:`plot_runs` needs from one run."""

    records: Sequence[RequestRecord]
    instances: Sequence[InstanceRecord]
    report: Mapping[str, Any] = field(default_factory=dict)


def _downsample_xy(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    n = len(xs)
    if n <= MAX_POINTS:
        return list(xs), list(ys)
    idx = [round(i * (n - 1) / (MAX_POINTS - 1)) for i in range(MAX_POINTS)]
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _no_data(ax: Axes, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def _duration(data: RunData) -> float:
    duration = data.report.get("duration_s")
    if isinstance(duration, (int, float)) and duration > 0:
        return float(duration)
    last = 0.0
    for inst in data.instances:
        if inst.samples:
            last = max(last, inst.samples[-1].t_s)
    for r in data.records:
        if r.finish_s is not None and r.finish_s > last:
            last = r.finish_s
    return last


def _slo(data: RunData) -> Slo:
    slo = data.report.get("slo")
    if isinstance(slo, Mapping):
        return Slo(ttft_s=float(slo.get("ttft_s", 2.0)), tbt_s=float(slo.get("tbt_s", 0.1)))
    return Slo()


def _plot_ttft_cdf(ax: Axes, runs_data: Mapping[str, RunData]) -> None:
    any_data = False
    for name, data in runs_data.items():
        ttft = sorted(
            r.first_token_s - r.arrival_s for r in data.records if r.ok and r.first_token_s is not None
        )
        ttft = [t for t in ttft if t > 0]
        if not ttft:
            continue
        any_data = True
        n = len(ttft)
        xs, ys = _downsample_xy(ttft, [(i + 1) / n for i in range(n)])
        ax.step(xs, ys, where="post", label=f"{name} (n={n})")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of completed requests")
    ax.set_title("TTFT CDF")
    ax.set_ylim(0.0, 1.0)
    if any_data:
        ax.set_xscale("log")
        ax.legend(loc="lower right", fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
    else:
        _no_data(ax)


def _plot_latency_bars(ax: Axes, runs_data: Mapping[str, RunData]) -> None:
    metrics = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
    names = list(runs_data)
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        report = runs_data[name].report
        heights = [float(report.get(m) or 0.0) for m in metrics]
        positions = [i - 0.4 + width * (j + 0.5) for i in range(len(metrics))]
        ax.bar(positions, heights, width=width, label=name)
    ax.set_xticks(range(len(metrics)))
    ax.set_xticklabels(["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"])
    ax.set_ylabel("seconds")
    ax.set_title("latency percentiles (completed requests)")
    if names:
        ax.legend(fontsize="small")
    else:
        _no_data(ax)


def _instance_timeline(ax: Axes, data: RunData, attr: str, ylabel: str) -> None:
    series = [(inst.instance_id, inst.samples) for inst in data.instances if inst.samples]
    if not series:
        _no_data(ax)
        return
    if len(series) <= MAX_INSTANCE_LINES:
        for iid, samples in sorted(series):
            xs, ys = _downsample_xy([s.t_s for s in samples], [float(getattr(s, attr)) for s in samples])
            ax.plot(xs, ys, linewidth=0.8, label=iid)
        ax.legend(fontsize="x-small", ncol=2, loc="upper right")
    else:
        # Per time bin: each instance's mean, then mean / min / max across the instances seen there.
        end = max(samples[-1].t_s for _, samples in series)
        width = end / TIMELINE_BINS if end > 0 else 1.0
        bins: dict[int, list[float]] = {}
        for _, samples in series:
            sums: dict[int, list[float]] = {}
            for s in samples:
                k = min(int(s.t_s / width), TIMELINE_BINS - 1)
                acc = sums.setdefault(k, [0.0, 0.0])
                acc[0] += float(getattr(s, attr))
                acc[1] += 1.0
            for k, (total, count) in sums.items():
                bins.setdefault(k, []).append(total / count)
        keys = sorted(bins)
        xs = [(k + 0.5) * width for k in keys]
        ax.plot(xs, [sum(bins[k]) / len(bins[k]) for k in keys], label="mean", linewidth=1.2)
        ax.plot(xs, [max(bins[k]) for k in keys], label="max", linewidth=0.8)
        ax.plot(xs, [min(bins[k]) for k in keys], label="min", linewidth=0.8)
        ax.legend(fontsize="x-small", loc="upper right", title=f"{len(series)} instances")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0.0)


def _plot_goodput(ax: Axes, runs_data: Mapping[str, RunData]) -> None:
    any_data = False
    for name, data in runs_data.items():
        duration = _duration(data)
        if duration <= 0:
            continue
        points = goodput_timeline(data.records, _slo(data), bucket_s=duration / TIMELINE_BINS)
        if not points:
            continue
        any_data = True
        ax.plot([t for t, _ in points], [g for _, g in points], label=name, linewidth=1.0)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("goodput (req/s meeting SLO)")
    ax.set_title("goodput over time (by finish time)")
    if any_data:
        ax.legend(fontsize="small")
    else:
        _no_data(ax)


def plot_runs(out_dir: Path, runs_data: Mapping[str, RunData]) -> list[Path]:
    """Write the run charts as PNGs into ``out_dir`` (created if needed); return their paths.

    Files: ``ttft_cdf.png``, ``latency_percentiles.png``, ``utilisation.png``, ``kv_usage.png``,
    ``goodput_timeline.png``. Runs with no data draw an empty panel saying so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Figure, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(8, 5))
    _plot_ttft_cdf(ax, runs_data)
    save(fig, "ttft_cdf.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    _plot_latency_bars(ax, runs_data)
    save(fig, "latency_percentiles.png")

    for filename, attr, label in (
        ("utilisation.png", "busy_fraction", "busy fraction"),
        ("kv_usage.png", "kv_usage", "KV cache use"),
    ):
        n = max(1, len(runs_data))
        fig, axes = plt.subplots(n, 1, figsize=(9, 2.6 * n + 0.6), squeeze=False)
        if not runs_data:
            _no_data(axes[0][0])
        for row, (name, data) in enumerate(runs_data.items()):
            ax = axes[row][0]
            _instance_timeline(ax, data, attr, label)
            ax.set_title(name, fontsize="medium")
        axes[-1][0].set_xlabel("simulated time (s)")
        save(fig, filename)

    fig, ax = plt.subplots(figsize=(8, 5))
    _plot_goodput(ax, runs_data)
    save(fig, "goodput_timeline.png")
    fleet_png = plot_fleet_timeline(out_dir, runs_data)
    if fleet_png is not None:
        written.append(fleet_png)
    return written


def plot_fleet_timeline(out_dir: Path, runs_data: Mapping[str, RunData]) -> Path | None:
    """``fleet_timeline.png`` for the runs whose report carries ``fleet_timeline`` (autoscaled runs).

    One panel per run: instances serving (solid) and warming (dashed: cold starts plus activations)
    over time; demand (arrivals per second, from ``demand_timeline``) on a second axis; and a
    bottom panel with TTFT-SLO attainment per arrival bucket (``slo_timeline``) for every run.
    Returns None (and writes nothing) when no run has a fleet timeline.
    """
    runs = {n: d for n, d in runs_data.items() if d.report.get("fleet_timeline")}
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(runs)
    fig, axes = plt.subplots(n + 1, 1, figsize=(10, 2.8 * (n + 1) + 0.6), squeeze=False, sharex=True)
    for row, (name, data) in enumerate(runs.items()):
        ax = axes[row][0]
        timeline = data.report["fleet_timeline"]
        xs = [float(p[0]) for p in timeline]
        xs_s, serving = _downsample_xy(xs, [float(p[1]) for p in timeline])
        _, warming = _downsample_xy(xs, [float(p[2]) for p in timeline])
        ax.step(xs_s, serving, where="post", label="serving", linewidth=1.2)
        ax.step(xs_s, warming, where="post", label="warming", linestyle="--", linewidth=0.9)
        ax.set_ylabel("instances")
        ax.set_ylim(bottom=0)
        gpu_h = data.report.get("gpu_hours")
        att = data.report.get("ttft_slo_attainment")
        title = name
        if isinstance(gpu_h, (int, float)):
            title += f"  ·  {gpu_h:.1f} GPU-h"
        if isinstance(att, (int, float)):
            title += f"  ·  TTFT SLO met {att:.1%}"
        ax.set_title(title, fontsize="medium")
        demand = data.report.get("demand_timeline") or []
        if demand:
            ax2 = ax.twinx()
            dx, dy = _downsample_xy([float(p[0]) for p in demand], [float(p[1]) for p in demand])
            ax2.plot(dx, dy, color="grey", alpha=0.5, linewidth=0.8, label="demand")
            ax2.set_ylabel("arrivals / s", color="grey")
            ax2.set_ylim(bottom=0)
        ax.legend(fontsize="x-small", loc="upper left")
    ax = axes[n][0]
    for name, data in runs.items():
        points = [p for p in data.report.get("slo_timeline") or [] if p[1] is not None]
        if points:
            xs2, ys2 = _downsample_xy([float(p[0]) for p in points], [float(p[1]) for p in points])
            ax.plot(xs2, ys2, label=name, linewidth=0.9)
    ax.set_ylabel("TTFT SLO attainment")
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("simulated time (s)")
    ax.legend(fontsize="x-small", loc="lower left")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fleet_timeline.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
