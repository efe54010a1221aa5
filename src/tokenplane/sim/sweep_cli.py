"""``tokenplane sweep``: load a sweep file, run its variants, print and write the table and plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console

from tokenplane.sim.sweep import SweepError, load_sweep, run_sweep, sweep_table, write_table


def sweep_command(
    sweep_file: Path,
    *,
    out: Path,
    workers: int | None,
    ray: str | None,
    traces: Path | None,
    plots: bool,
    as_json: bool,
) -> int:
    """Run a sweep; 0 when every variant ran, 2 when the sweep file is invalid."""
    err = Console(stderr=True)
    try:
        spec = load_sweep(sweep_file)
    except SweepError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    if workers is not None and workers < 1:
        err.print("[bold red]error:[/] --workers must be at least 1", highlight=False)
        return 2
    console = Console(stderr=True) if as_json else Console() if sys.stdout.isatty() else Console(width=200)

    def done(n: int, total: int) -> None:
        if sys.stderr.isatty():
            err.print(f"\r{n}/{total} variants", end="")

    result = run_sweep(spec, workers=workers, ray_address=ray, traces=traces, done=done)
    files = write_table(out, result)
    if plots:
        from tokenplane.sim.sweep_plots import plot_sweep

        files += plot_sweep(out, result)
    if as_json:
        print(json.dumps({"wall_s": result.wall_s, "rows": result.rows}, sort_keys=True, default=str))
    else:
        console.print(sweep_table(result))
    console.print(f"files: {', '.join(str(f) for f in files)}")
    return 0
