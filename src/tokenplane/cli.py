"""The ``tokenplane`` command line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="tokenplane: an inference control plane and its fleet digital twin.",
)
err = Console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


CATALOG_HELP = (
    "Catalogue YAML (gpus:/models:, a model may be a Hugging Face config.json) added to the built-in one."
)


def _catalog(path: Path | None) -> Any:
    """The built-in catalogue, with ``path``'s entries merged in when given."""
    from tokenplane.sim.catalog import Catalog

    return Catalog.default() if path is None else Catalog.from_yaml(path)


def default_scenario_text() -> str:
    return resources.files("tokenplane").joinpath("data/default-scenario.yaml").read_text()


@app.command()
def up(
    instances: Annotated[int, typer.Option(help="Emulated GPU instances.")] = 4,
    users: Annotated[int, typer.Option(help="Concurrent agentic users.")] = 16,
    tasks: Annotated[int, typer.Option(help="Tasks per user.")] = 1,
    steps: Annotated[int, typer.Option(help="Steps (model calls) per task.")] = 5,
    router: Annotated[str, typer.Option(help="Routing policy of the gateway.")] = "prefix-affinity",
    speed: Annotated[float, typer.Option(help="Emulated seconds per wall second.")] = 1.0,
    out: Annotated[Path | None, typer.Option("--out", help="Also write DIR/up.json.")] = None,
) -> None:
    """The main job: gateway + emulated fleet + agentic users; prints what the control plane did."""
    from tokenplane.demo import print_result, run_demo, write_result
    from tokenplane.runloop import Terminated, run_stoppable

    console = Console() if sys.stdout.isatty() else Console(width=120)
    console.print(
        f"starting {instances} emulated H100 instances and the gateway ({router}); "
        f"{users} agentic users x {tasks} task(s) x {steps} steps"
    )
    try:
        result = run_stoppable(
            run_demo(instances=instances, users=users, tasks=tasks, steps=steps, router=router, speed=speed)
        )
    except Terminated as exc:
        _fail(str(exc), code=143)
        return
    except RuntimeError as exc:
        _fail(str(exc), code=1)
        return
    print_result(result, console)
    if out is not None:
        console.print(f"summary: {write_result(result, out)}")
    if result.errors:
        raise typer.Exit(1)


@app.command()
def simulate(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario YAML; the embedded default scenario when omitted.")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for report.json and plots.")] = Path("out"),
    policy: Annotated[
        str | None, typer.Option("--policy", help="Run only the first run, routed by this policy.")
    ] = None,
    run: Annotated[list[str] | None, typer.Option("--run", help="Only the named run(s).")] = None,
    traces: Annotated[
        Path | None, typer.Option("--traces", help="Public traces folder (default ../shared/traces).")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    progress: Annotated[bool | None, typer.Option(help="Show a progress bar (default: on a TTY).")] = None,
    catalog_file: Annotated[Path | None, typer.Option("--catalog", help=CATALOG_HELP)] = None,
    stream: Annotated[
        bool, typer.Option("--stream", help="Streaming aggregates: memory bounded by requests in flight.")
    ] = False,
    records: Annotated[
        Path | None,
        typer.Option("--records", help="With --stream: each request's record as a JSON line to FILE."),
    ] = None,
) -> None:
    """Simulate a scenario in virtual time and write DIR/report.json, plots and a summary table."""
    from tokenplane.core.errors import InvalidPolicyConfig
    from tokenplane.sim.catalog import CatalogError, UnknownHardware
    from tokenplane.sim.plots import RunData, plot_runs
    from tokenplane.sim.progress import progress_bar
    from tokenplane.sim.report import print_summary, write_report
    from tokenplane.sim.runner import run_scenario
    from tokenplane.sim.scenario import ScenarioError, load_scenario, parse_scenario, with_policy
    from tokenplane.sim.workloads.traces import TraceNotFound

    try:
        base = _catalog(catalog_file)
        if scenario is None:
            sc = parse_scenario(
                yaml.safe_load(default_scenario_text()), source="<embedded default>", catalog=base
            )
        else:
            sc = load_scenario(scenario, catalog=base)
        if run:
            unknown = set(run) - {r.name for r in sc.runs}
            if unknown:
                _fail(f"unknown run(s) {sorted(unknown)}; scenario has {[r.name for r in sc.runs]}")
            sc = sc.model_copy(update={"runs": [r for r in sc.runs if r.name in run]})
        if policy:
            sc = with_policy(sc, policy)
    except (ScenarioError, CatalogError) as exc:
        _fail(str(exc))
        return
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} exists and is not a folder")
    show = sys.stderr.isatty() if progress is None else progress
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(
        f"[bold]{sc.name}[/]: {len(sc.runs)} run(s)" + (f" — {sc.description}" if sc.description else "")
    )

    bars: list[Any] = []

    def make_progress(name: str) -> Any:
        if not show:
            return None
        cm = progress_bar(None, True, description=name)
        bar = cm.__enter__()
        bars.append(cm)
        return bar.update

    if records is not None and not stream:
        _fail("--records needs --stream (without it every record is kept in memory for the plots)")
    records_file = None
    if records is not None:
        records.parent.mkdir(parents=True, exist_ok=True)
        records_file = _records_path(records, many=len(sc.runs) > 1)
    try:
        outcomes = run_scenario(
            sc,
            traces=traces,
            progress=make_progress,
            catalog=base,
            stream_records=stream,
            records_file=records_file,
        )
    except (InvalidPolicyConfig, UnknownHardware, CatalogError, TraceNotFound, ValueError) as exc:
        _fail(str(exc))
        return
    finally:
        for cm in bars:
            cm.__exit__(None, None, None)
    runs = {name: o.report for name, o in outcomes.items()}
    path = write_report(out, runs, scenario={"name": sc.name, "source": sc.source})
    print_summary(runs, console)
    if stream:
        if records_file is not None:
            console.print(f"records: {', '.join(str(records_file(n)) for n in runs)}")
    elif plots:
        files = plot_runs(
            out,
            {name: RunData(o.result.records, o.result.instances, o.report) for name, o in outcomes.items()},
        )
        console.print(f"plots: {', '.join(str(f) for f in files)}")
        from tokenplane.sim.html_report import write_html_report

        console.print(f"html: {write_html_report(out, runs, files, scenario=sc.name)}")
    console.print(f"report: {path}")


def _records_path(path: Path, *, many: bool) -> Callable[[str], Path]:
    """FILE for one run; FILE's stem + ``.RUN`` + suffix for each of several."""

    def name(run: str) -> Path:
        return path.with_name(f"{path.stem}.{run}{path.suffix}") if many else path

    return name


@app.command()
def validate(
    measurements: Annotated[
        list[Path] | None,
        typer.Option("--measurements", help="A vLLM run folder (requests.jsonl, meta.json); repeatable."),
    ] = None,
    traces: Annotated[Path | None, typer.Option("--traces", help="Public traces folder.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    catalog_file: Annotated[Path | None, typer.Option("--catalog", help=CATALOG_HELP)] = None,
) -> None:
    """Replay real vLLM runs in the twin and compare simulated with measured TTFT and TPOT."""
    from tokenplane.sim.catalog import CatalogError
    from tokenplane.sim.validation import ValidationError, print_validation, validate_runs

    try:
        results = validate_runs(measurements, traces=traces, catalog=_catalog(catalog_file))
    except (ValidationError, CatalogError) as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps({"runs": results}, indent=2, sort_keys=True))
    else:
        print_validation(results, Console())


@app.command()
def serve(
    config: Annotated[Path, typer.Argument(help="Gateway config YAML (tenants, models, instances).")],
    host: Annotated[str | None, typer.Option(help="Override listen.host.")] = None,
    port: Annotated[int | None, typer.Option(help="Override listen.port.")] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Gateway processes on one port (SO_REUSEPORT). They share only what the backends "
            "share (ledger.url, a SQLite ledger file); the memory backend gives each worker its own state.",
        ),
    ] = 1,
    worker: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run the OpenAI-compatible gateway in front of the configured instances."""
    from tokenplane.gateway import ConfigError
    from tokenplane.gateway.serve import serve as run_gateway
    from tokenplane.ledger import LedgerError

    try:
        run_gateway(config, host, port, workers=workers, worker=worker)
    except (ConfigError, LedgerError) as exc:  # LedgerError: the ledger's database cannot be opened
        _fail(str(exc))


@app.command()
def plan(
    spec: Annotated[Path, typer.Argument(help="Capacity-planning spec YAML.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for plan.json and plan.png.")] = Path("out/plan"),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    catalog_file: Annotated[Path | None, typer.Option("--catalog", help=CATALOG_HELP)] = None,
) -> None:
    """Find the cheapest fleet that meets the SLOs for an agentic demand, with the twin."""
    from tokenplane.planning import load_plan_spec
    from tokenplane.planning import plan as run_plan
    from tokenplane.sim.catalog import CatalogError, UnknownHardware

    try:
        result = run_plan(load_plan_spec(spec), catalog=_catalog(catalog_file), out_dir=out)
    except (ValueError, UnknownHardware, CatalogError) as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        typer.echo(result.summary())


@app.command()
def emulate(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    gpu: Annotated[str, typer.Option(help="GPU from the catalogue.")] = "H100",
    model: Annotated[str, typer.Option(help="Model from the catalogue.")] = "llama-3-8b",
    served_model_name: Annotated[str | None, typer.Option(help="Name clients use.")] = None,
    tp: Annotated[int, typer.Option(help="Tensor parallelism.")] = 1,
    max_num_seqs: Annotated[int, typer.Option(help="Batch slots.")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Token budget per step.")] = 2048,
    kv_capacity_tokens: Annotated[
        int | None, typer.Option(help="KV cache size (default: sized from HBM).")
    ] = None,
    speed: Annotated[float, typer.Option(help="Virtual seconds per wall second.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed for generated text.")] = 0,
    runtime: Annotated[
        str, typer.Option(help="Whose metric names /metrics publishes: vllm, sglang or llamacpp.")
    ] = "vllm",
    lora_modules: Annotated[list[str] | None, typer.Option(help="LoRA adapter served as a model.")] = None,
    max_loras: Annotated[int, typer.Option(help="LoRA adapters resident at once.")] = 1,
    kv_transfer_config: Annotated[
        str | None,
        typer.Option(
            help='vLLM\'s KV connector JSON, e.g. {"kv_connector":"NixlConnector","kv_role":"kv_both"}.'
        ),
    ] = None,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer folder: tokenize as vLLM does.")] = None,
    kv_events_endpoint: Annotated[
        str | None, typer.Option(help="Publish vLLM KV events to this ZMQ endpoint.")
    ] = None,
) -> None:
    """Serve one emulated GPU instance in real time (OpenAI API, vLLM metrics, fault injection)."""
    from tokenplane.emulator.cli import emulate as run_emulator
    from tokenplane.emulator.kv_transfer import parse_kv_transfer_config

    try:
        kv_transfer = parse_kv_transfer_config(kv_transfer_config) if kv_transfer_config else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kv-transfer-config") from None

    run_emulator(
        port,
        host,
        gpu,
        model,
        served_model_name,
        tp,
        max_num_seqs,
        max_num_batched_tokens,
        kv_capacity_tokens,
        speed,
        seed,
        runtime=runtime,
        lora_modules=lora_modules or (),
        max_loras=max_loras,
        kv_transfer=kv_transfer,
        tokenizer=tokenizer,
        kv_events_endpoint=kv_events_endpoint,
    )


@app.command()
def top(
    gateway: Annotated[str, typer.Option(help="The gateway's base URL.")] = "http://127.0.0.1:8080",
    interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """A live terminal view of a running gateway: instances, rates, latency, queue, decisions."""
    from tokenplane.top import top as run_top

    run_top(gateway, interval, once)


@app.command("replicas-demo")
def replicas_demo(
    replicas: Annotated[int, typer.Option(min=1, help="Gateway replicas.")] = 2,
    seconds: Annotated[float, typer.Option(min=0.5, help="How long to drive requests.")] = 5.0,
    redis: Annotated[str, typer.Option(help="The Redis the replicas share.")] = "redis://127.0.0.1:6379/0",
) -> None:
    """Several gateway replicas on one Redis: a tenant's limits hold across all of them."""
    import asyncio

    from tokenplane.shared_state.demo import report, run_demo

    typer.echo(report(asyncio.run(run_demo(replicas=replicas, seconds=seconds, redis_url=redis))))


@app.command()
def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="Sweep YAML: a base scenario and axes of values.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for sweep.csv/json and plots.")] = Path(
        "out/sweep"
    ),
    workers: Annotated[int | None, typer.Option(help="Local worker processes (default: cores).")] = None,
    ray: Annotated[
        str | None, typer.Option("--ray", help="Run on this Ray cluster ('local': start one).")
    ] = None,
    traces: Annotated[Path | None, typer.Option("--traces", help="Public traces folder.")] = None,
    plots: Annotated[bool, typer.Option(help="Write the Pareto and heat-map PNGs.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as one JSON object.")] = False,
) -> None:
    """Run a grid of scenario variants in parallel (local processes or Ray); one table, Pareto plots."""
    from tokenplane.sim.sweep_cli import sweep_command

    code = sweep_command(
        sweep_file, out=out, workers=workers, ray=ray, traces=traces, plots=plots, as_json=as_json
    )
    if code:
        raise typer.Exit(code)


@app.command()
def rehearse(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario YAML; the embedded default scenario when omitted.")
    ] = None,
    run: Annotated[str | None, typer.Option("--run", help="Which run (default: the first).")] = None,
    scale: Annotated[float, typer.Option(help="Load factor: agentic users or open-loop rate.")] = 0.25,
    instances: Annotated[int | None, typer.Option(help="Fleet size (default: the scenario's).")] = None,
    duration: Annotated[
        float | None, typer.Option(help="Open-loop arrival span in s; the run and faults compress to it.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {twin, live, rel_diff} as JSON.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write DIR/rehearse.json.")] = None,
    catalog_file: Annotated[Path | None, typer.Option("--catalog", help=CATALOG_HELP)] = None,
    traces: Annotated[Path | None, typer.Option("--traces", help="Public traces folder.")] = None,
    path_s: Annotated[
        float | None,
        typer.Option(
            "--path-s",
            help="The request path's fixed cost (s) for the twin; default: measured by a calibration "
            "probe on the idle live stack before the workload.",
        ),
    ] = None,
) -> None:
    """Run a scenario's run live (gateway + emulators in real time), then in the twin, side by side."""
    from tokenplane.rehearse.command import rehearse_command

    code = rehearse_command(
        scenario,
        run_name=run,
        scale=scale,
        instances=instances,
        duration=duration,
        as_json=as_json,
        catalog_file=catalog_file,
        traces=traces,
        out=out,
        path_s=path_s,
    )
    if code:
        raise typer.Exit(code)


@app.command("example-scenario")
def example_scenario() -> None:
    """Print the embedded default scenario, a starting point for your own."""
    typer.echo(default_scenario_text())


def main() -> None:  # pragma: no cover
    app()
