"""``tokenplane rehearse SCENARIO``: the same run live and in the twin, side by side.

The live side runs first: its calibration probe (:func:`tokenplane.rehearse.probe.probe_path`,
idle stack, before the workload) measures the request path's fixed cost, and the twin then runs
with it as ``request_path.first_chunk_s`` (``path_s`` gives a figure instead and skips the probe).
The twin also runs without it (``path.twin_without``), so the report shows what the path explains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from tokenplane.rehearse.compare import rel, rel_diff, side_by_side
from tokenplane.rehearse.errors import RehearsalError
from tokenplane.rehearse.live import drive_live, live_report
from tokenplane.rehearse.sizing import DEFAULT_SCALE, pick_run, rehearsal_run
from tokenplane.runloop import Terminated, new_event_loop, run_stoppable
from tokenplane.sim.catalog import Catalog
from tokenplane.sim.report import RunAggregate, Slo
from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import RequestPathSettings, RunSettings, Scenario

#: Goodput-over-time buckets per run (both sides use the twin run's bucket width).
TIMELINE_BUCKETS = 12
#: The fields of the twin without the path shown beside the figures with it.
PATH_FIELDS = ("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "tbt_p50_s", "throughput_rps", "prefix_hit_ratio")


def rehearse(
    scenario: Scenario,
    *,
    run_name: str | None = None,
    scale: float = DEFAULT_SCALE,
    instances: int | None = None,
    duration: float | None = None,
    catalog: Catalog | None = None,
    traces: str | Path | None = None,
    workdir: Path | None = None,
    path_s: float | None = None,
) -> dict[str, Any]:
    """``{"run", "path", "twin", "live", "rel_diff"}``: both sides' reports and their differences.

    ``path_s``: the request path's fixed cost for the twin, in seconds; ``None`` measures it with
    the live side's calibration probe before the workload runs."""
    catalog = catalog or Catalog.default()
    if scenario.catalog:
        catalog = catalog.with_overrides(scenario.catalog)
    run = rehearsal_run(pick_run(scenario, run_name), scale=scale, instances=instances, duration=duration)
    if path_s is not None and not path_s >= 0:
        raise RehearsalError(f"--path-s must be >= 0, got {path_s}")
    live = run_stoppable(
        drive_live(
            run, catalog=catalog, traces=traces or scenario.traces, workdir=workdir, probe=path_s is None
        ),
        loop_factory=new_event_loop,  # uvloop, as the servers run
    )
    probe = live.path_probe
    used = path_s if path_s is not None else probe.first_chunk_s if probe is not None else 0.0
    paid = run.model_copy(update={"request_path": RequestPathSettings(first_chunk_s=used)})
    twin = twin_report(scenario, paid, catalog, traces=traces)
    bare = twin_report(
        scenario, run.model_copy(update={"request_path": RequestPathSettings()}), catalog, traces=traces
    )
    bucket = float(twin["goodput_bucket_s"])
    live_rep = live_report(run, live, catalog, bucket_s=bucket)
    live_rep["goodput_bucket_s"] = bucket
    without = {k: bare.get(k) for k in PATH_FIELDS}
    return {
        "path": {
            "first_chunk_s": used,
            "source": "calibration probe on the idle live stack" if path_s is None else "given (--path-s)",
            "probe": None if probe is None else probe.summary(),
            "twin_without": without,
            "rel_diff_without": {k: rel(without[k], live_rep.get(k)) for k in PATH_FIELDS},
            "prefix_hit_ratio_points_without": _points(
                without["prefix_hit_ratio"], live_rep.get("prefix_hit_ratio")
            ),
        },
        "run": {
            "scenario": scenario.name,
            "name": run.name,
            "router": run.router,
            "instances": run.fleet.instances,
            "workload": run.workload,
            "faults": [f.model_dump() for f in run.faults],
            "scale": scale,
        },
        "twin": twin,
        "live": live_rep,
        "rel_diff": rel_diff(twin, live_rep),
    }


def _points(twin: float | None, live: float | None) -> float | None:
    return None if twin is None or live is None else 100.0 * (live - twin)


def twin_report(
    scenario: Scenario, run: RunSettings, catalog: Catalog, *, traces: str | Path | None = None
) -> dict[str, Any]:
    """The twin's report of ``run``, its goodput timeline in :data:`TIMELINE_BUCKETS` buckets."""
    one = scenario.model_copy(update={"runs": [run], "catalog": {}})
    outcome = run_scenario(one, traces=traces, catalog=catalog)[run.name]
    report = dict(outcome.report)
    bucket = max(1.0, outcome.result.duration_s / TIMELINE_BUCKETS)
    agg = RunAggregate(Slo(ttft_s=run.slo.ttft_s, tbt_s=run.slo.tbt_s))
    agg.add_all(outcome.result.records)
    report["goodput_timeline"] = [
        list(p) for p in agg.goodput_timeline(bucket_s=bucket, duration_s=outcome.result.duration_s)
    ]
    report["goodput_bucket_s"] = bucket
    return report


def print_rehearsal(result: dict[str, Any], console: Console) -> None:
    run = result["run"]
    console.print(
        f"[bold]{run['scenario']}[/] run [bold]{run['name']}[/]: {run['instances']} instances, "
        f"router {run['router']}, load x{run['scale']:g}; "
        f"live took {result['live']['wall_seconds']:.1f} s at load average "
        f"{result['live']['load_average'][0]:.1f}"
    )
    for f in result["live"].get("faults_applied", []):
        console.print(f"  live fault: {f}")
    live = result["live"]
    hops = live.get("ttft_mean_by_hop_s") or {}

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    console.print(
        f"TTFT mean: twin {ms(result['twin'].get('ttft_mean_s'))}; live at the instance "
        f"{ms(hops.get('instance'))}, at the gateway {ms(hops.get('gateway'))}, at the client "
        f"{ms(live.get('ttft_mean_s'))} (the driver issued requests {ms(live.get('driver_late_mean_s'))} "
        "late on average)"
    )
    path = result.get("path")
    if path is not None:
        probe = path.get("probe")
        how = path["source"]
        if probe is not None:
            how = (
                f"probe of {probe['requests']} idle requests: client TTFT "
                f"{ms(probe['client_ttft_median_s'])} - instance TTFT "
                f"{ms(probe['instance_ttft_median_s'])} (median); gateway hop "
                f"{ms(probe['gateway_hop_s'])}, client + HTTP {ms(probe['client_hop_s'])}"
            )
        console.print(f"request path: the twin ran with first_chunk_s = {ms(path['first_chunk_s'])} ({how})")
        d = path["rel_diff_without"]
        console.print(
            "  twin without it: TTFT p50 "
            f"{ms(path['twin_without']['ttft_p50_s'])} (live {_pct(d['ttft_p50_s'])}), TTFT p99 "
            f"{ms(path['twin_without']['ttft_p99_s'])} (live {_pct(d['ttft_p99_s'])}), throughput "
            f"live {_pct(d['throughput_rps'])}"
        )
        inst, gw, client = hops.get("instance"), hops.get("gateway"), live.get("ttft_mean_s")
        if probe is not None and inst is not None and gw is not None and client is not None:
            # the path under the workload's load against the idle probe: what a fixed cost leaves out
            console.print(
                f"  during the run (means): gateway hop {ms(gw - inst)} "
                f"(probe {ms(probe['gateway_hop_s'])}), client + HTTP {ms(client - gw)} "
                f"(probe {ms(probe['client_hop_s'])}); a client hop above the probe's is the "
                "driver (one process for every client) short of CPU"
            )
    for table in side_by_side(result["twin"], result["live"], result["rel_diff"]):
        console.print(table)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def dumps(result: dict[str, Any]) -> str:
    """The ``--json`` document: ``{"twin", "live", "rel_diff"}`` (and the rehearsed ``run``)."""
    doc = {
        "twin": result["twin"],
        "live": result["live"],
        "rel_diff": result["rel_diff"],
        "run": result["run"],
        "path": result.get("path"),
    }
    return json.dumps(doc, indent=2, default=str)


def rehearse_command(
    scenario_file: Path | None,
    *,
    run_name: str | None,
    scale: float,
    instances: int | None,
    duration: float | None,
    as_json: bool,
    catalog_file: Path | None = None,
    traces: Path | None = None,
    out: Path | None = None,
    path_s: float | None = None,
) -> int:
    """The CLI's body: load, rehearse, print; the exit code (2 on a refused scenario)."""
    import sys
    from importlib import resources

    import yaml

    from tokenplane.sim.catalog import CatalogError
    from tokenplane.sim.scenario import ScenarioError, load_scenario, parse_scenario

    err = Console(stderr=True)
    try:
        base = Catalog.default() if catalog_file is None else Catalog.from_yaml(catalog_file)
        if scenario_file is None:
            text = resources.files("tokenplane").joinpath("data/default-scenario.yaml").read_text()
            sc = parse_scenario(yaml.safe_load(text), source="<embedded default>", catalog=base)
        else:
            sc = load_scenario(scenario_file, catalog=base)
        result = rehearse(
            sc,
            run_name=run_name,
            scale=scale,
            instances=instances,
            duration=duration,
            catalog=base,
            traces=traces,
            path_s=path_s,
        )
    except (ScenarioError, CatalogError, RehearsalError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    except Terminated as exc:
        err.print(str(exc), highlight=False)
        return 143
    doc = dumps(result)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "rehearse.json").write_text(doc + "\n")
    if as_json:
        sys.stdout.write(doc + "\n")
    else:
        print_rehearsal(result, Console() if sys.stdout.isatty() else Console(width=160))
    return 0
