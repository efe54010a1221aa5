"""What a plan found: one :class:`FleetPoint` per verified fleet size, one :class:`GpuPlan` per GPU
type, the :class:`PlanResult` (``plan.json`` is its :meth:`~PlanResult.as_dict`) and its plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class FleetPoint:
    """One verified fleet size."""

    instances: int
    cost_per_hour: float
    slo_attainment: float
    all_completed: bool
    meets_slo: bool


@dataclass(slots=True)
class GpuPlan:
    """What the search found for one GPU type."""

    gpu: str
    price_per_hour: float
    """Per instance (GPU price x tp)."""
    capacity_rps: float | None = None
    capacity_tokens_per_s: float | None = None
    closed_form_instances: int | None = None
    points: list[FleetPoint] = field(default_factory=list)
    chosen: FleetPoint | None = None
    note: str = ""


@dataclass(slots=True)
class PlanResult:
    """The chosen fleet and how it was found; :meth:`as_dict` is what ``plan --json`` prints."""

    name: str
    model: str
    request_rate_rps: float
    required_tokens_per_s: float
    tasks_per_hour: float
    gpu_type: str | None
    gpus: int | None
    cost_per_hour: float | None
    headroom: float | None
    slo_attainment: float | None
    task_success_rate: float | None
    cost_per_successful_task: float | None
    cost_per_million_tokens: float | None
    per_gpu: list[GpuPlan]
    plot: Path | None
    wall_seconds: float

    @property
    def feasible(self) -> bool:
        return self.gpu_type is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "gpu_type": self.gpu_type,
            "gpus": self.gpus,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_successful_task": self.cost_per_successful_task,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "headroom": self.headroom,
            "slo_attainment": self.slo_attainment,
            "task_success_rate": self.task_success_rate,
            "request_rate_rps": self.request_rate_rps,
            "required_tokens_per_s": self.required_tokens_per_s,
            "tasks_per_hour": self.tasks_per_hour,
            "candidates": [
                {
                    "gpu_type": g.gpu,
                    "price_per_hour": g.price_per_hour,
                    "capacity_rps": g.capacity_rps,
                    "capacity_tokens_per_s": g.capacity_tokens_per_s,
                    "closed_form_instances": g.closed_form_instances,
                    "chosen_instances": g.chosen.instances if g.chosen else None,
                    "note": g.note,
                    "fleet_sizes": [
                        {
                            "instances": p.instances,
                            "cost_per_hour": p.cost_per_hour,
                            "slo_attainment": p.slo_attainment,
                            "meets_slo": p.meets_slo,
                        }
                        for p in g.points
                    ],
                }
                for g in self.per_gpu
            ],
            "plot": str(self.plot) if self.plot else None,
            "wall_seconds": self.wall_seconds,
        }

    def summary(self) -> str:
        """One human line, e.g. for the CLI."""
        if not self.feasible:
            return f"{self.name}: no GPU type in the catalogue meets the SLOs at this demand"
        return (
            f"{self.name}: {self.gpus} x {self.gpu_type} at ${self.cost_per_hour:.2f}/h for "
            f"{self.required_tokens_per_s:,.0f} tokens/s ({self.request_rate_rps:.2f} calls/s); "
            f"headroom {self.headroom:.0%}; cost per successful task ${self.cost_per_successful_task:.4f}"
        )


def plot_costs(result: PlanResult, path: Path) -> Path:
    """``plan.png``: cost per hour against fleet size for every GPU type (filled: meets the SLOs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for g in result.per_gpu:
        if not g.points:
            continue
        xs = [p.instances for p in g.points]
        ys = [p.cost_per_hour for p in g.points]
        (line,) = ax.plot(xs, ys, "-", label=f"{g.gpu} (${g.price_per_hour:.2f}/h each)")
        for p in g.points:
            ax.plot(
                p.instances,
                p.cost_per_hour,
                "o",
                color=line.get_color(),
                markerfacecolor=line.get_color() if p.meets_slo else "none",
            )
    if result.gpus is not None and result.cost_per_hour is not None:
        ax.plot(result.gpus, result.cost_per_hour, "*", color="black", markersize=16, label="chosen")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("fleet size (instances)")
    ax.set_ylabel("cost ($/h)")
    ax.set_title(f"{result.name}: {result.required_tokens_per_s:,.0f} tokens/s; filled = meets SLOs")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
