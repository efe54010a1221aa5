"""The live side of a rehearsal: the stack started, the path probed, the run's workload driven
through the real gateway in real time, and the live run's report.

The fleet is ``tokenplane up``'s stack (:func:`tokenplane.demo.start_stack`): one emulator process
per instance, configured as the twin's engines are (batch limits, KV capacity, context length,
prefix caching), and ``tokenplane serve`` in front with the run's router.

First the calibration probe (:mod:`.probe`) measures the request path's fixed cost on the idle
stack; then the driver (:mod:`.driver`) runs the workload, its clients' retries and its faults. The
live run's records are :class:`~tokenplane.sim.records.RequestRecord` values and its report is built
by the twin's own :func:`~tokenplane.sim.report.build_run_report`, so both sides have the same
fields computed the same way. The probe's and the driver's names are re-exported here.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from tokenplane.demo import route_reasons, start_stack
from tokenplane.rehearse.driver import Driver, LiveRun
from tokenplane.rehearse.fleet import (
    emulator_args,
    gateway_settings,
    histogram_mean,
    histogram_totals,
    metric_sums,
)
from tokenplane.rehearse.probe import (
    GATEWAY_TTFT,
    INSTANCE_TTFT,
    PROBE_ID_BASE,
    PROBE_OUTPUT_TOKENS,
    PROBE_REQUESTS,
    PathProbe,
    probe_path,
    probe_prompt_sizes,
)
from tokenplane.sim.catalog import Catalog
from tokenplane.sim.records import InstanceRecord
from tokenplane.sim.report import RunAggregate, Slo, build_run_report
from tokenplane.sim.scenario import RunSettings
from tokenplane.sim.workloads.factory import build_workload
from tokenplane.sim.workloads.traces import traces_dir

__all__ = [
    "PROBE_ID_BASE",
    "PROBE_OUTPUT_TOKENS",
    "PROBE_REQUESTS",
    "Driver",
    "LiveRun",
    "PathProbe",
    "drive_live",
    "live_report",
    "probe_path",
    "probe_prompt_sizes",
]


async def drive_live(
    run: RunSettings,
    *,
    catalog: Catalog,
    traces: str | Path | None = None,
    workdir: Path | None = None,
    probe: bool = True,
) -> LiveRun:
    """Start the stack, probe the request path (unless ``probe`` is false), drive the run's
    workload through it, collect, stop everything."""
    import openai

    workload = build_workload(run.workload, traces=traces_dir(traces), seed=run.seed)
    tmp = Path(workdir or tempfile.mkdtemp(prefix="tokenplane-rehearse-"))
    tmp.mkdir(parents=True, exist_ok=True)
    sections, tenant = gateway_settings(run)
    gpu = catalog.gpu(run.fleet.gpu)
    async with (
        aiohttp.ClientSession() as session,
        start_stack(
            session,
            tmp,
            instances=run.fleet.instances,
            gpu=gpu.name,
            model=run.fleet.model,
            router=run.router if isinstance(run.router, dict) else {"name": run.router},
            seed=run.seed,
            emulator_args=emulator_args(run, catalog),
            gateway_config=sections,
            tenant=tenant,
        ) as stack,
    ):
        client = openai.AsyncOpenAI(
            base_url=stack.gateway + "/v1", api_key=stack.key, max_retries=0, timeout=3600
        )
        try:
            urls = [em.url for em in stack.emulators]
            path_probe: PathProbe | None = None
            if probe:
                prober = Driver(run, workload, client, stack, session)  # its own records and TBT
                path_probe = await probe_path(prober, probe_prompt_sizes(run, traces))
            # what the probe left in the counters, taken off what the workload run reports
            reasons0 = await route_reasons(session, stack.gateway)
            inst0 = await histogram_totals(session, urls, INSTANCE_TTFT)
            gw0 = await histogram_totals(session, [stack.gateway], GATEWAY_TTFT)
            driver = Driver(run, workload, client, stack, session)
            driver.out.path_probe = path_probe
            started = time.perf_counter()
            await driver.drive()
            driver.out.wall_s = time.perf_counter() - started
            driver.out.load_average = os.getloadavg()
            reasons = await route_reasons(session, stack.gateway)
            driver.out.route_reasons = {
                k: v - reasons0.get(k, 0) for k, v in reasons.items() if v - reasons0.get(k, 0)
            }
            driver.out.ttft_mean_by_hop_s = {
                "instance": await histogram_mean(session, urls, INSTANCE_TTFT, since=inst0),
                "gateway": await histogram_mean(session, [stack.gateway], GATEWAY_TTFT, since=gw0),
            }
            names = {"tokenplane_retries_total", "tokenplane_continuations_total"}
            got = await metric_sums(session, [stack.gateway], names)
            driver.out.gateway_retries = int(got["tokenplane_retries_total"])
            driver.out.continuations = int(got["tokenplane_continuations_total"])
        finally:
            await client.close()
    return driver.out


def live_report(run: RunSettings, live: LiveRun, catalog: Catalog, *, bucket_s: float) -> dict[str, Any]:
    """The live run's report: the twin's report function over the live records."""
    gpu = catalog.gpu(run.fleet.gpu)
    model = catalog.model(run.fleet.model)
    instances = [
        InstanceRecord(
            f"{gpu.name.lower()}-{i}", gpu.name, model.name, gpu.price_per_hour, alive_s=live.end_s
        )
        for i in range(run.fleet.instances)
    ]
    slo = Slo(ttft_s=run.slo.ttft_s, tbt_s=run.slo.tbt_s)
    agg = RunAggregate(slo)
    agg.add_all(live.records)
    extra: dict[str, Any] = {
        "router": run.router,
        "instances": run.fleet.instances,
        "gpu": run.fleet.gpu,
        "model": run.fleet.model,
        "engine": run.fleet.engine.kind,
        "seed": run.seed,
        "goodput_timeline": [list(p) for p in agg.goodput_timeline(bucket_s=bucket_s, duration_s=live.end_s)],
        "route_reasons": live.route_reasons,
        "faults_applied": live.faults_applied,
        "load_average": list(live.load_average),
        "ttft_mean_by_hop_s": live.ttft_mean_by_hop_s,
        # the client's retries and the gateway's (the twin counts both in ``retries``)
        "attempts": sum(r.attempts for r in live.records) + live.gateway_retries + live.continuations,
        "retries": sum(r.attempts - 1 for r in live.records) + live.gateway_retries,
        "continuations": live.continuations,
        "driver_late_mean_s": live.driver_late_mean_s,
        "driver_late_max_s": live.driver_late_max_s,
    }
    if live.path_probe is not None:
        extra["path_probe"] = live.path_probe.summary()
    return build_run_report(
        live.records,
        instances,
        live.tbt,
        duration_s=live.end_s,
        wall_seconds=live.wall_s,
        slo=slo,
        extra=extra,
        aggregate=agg,
    )
