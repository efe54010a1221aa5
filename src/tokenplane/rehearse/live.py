"""The live side of a rehearsal: the run's workload through the real gateway, in real time.

The fleet is ``tokenplane up``'s stack (:func:`tokenplane.demo.start_stack`): one emulator process
per instance, configured as the twin's engines are (batch limits, KV capacity, context length,
prefix caching), and ``tokenplane serve`` in front with the run's router. A fresh instance of the
run's workload (same seed) is driven through the official ``openai`` client: open-loop arrivals at
their times, closed-loop follow-ups (an agent's next step) from the live finish times, exactly as
the twin's fleet asks the workload for them. Every request streams, asks for exactly the spec's
output length (``ignore_eos``) and carries the spec's prefix structure (:mod:`.prompts`).

Clients time out and retry per the run's ``clients``; faults hit the emulators at their times
(``slow``: ``POST /admin/faults``; ``lose``: the process is killed, and restarted after
``replace_after_s``). The live run's records are :class:`~tokenplane.sim.records.RequestRecord`
values and its report is built by the twin's own :func:`~tokenplane.sim.report.build_run_report`,
so both sides have the same fields computed the same way. Times are seconds since the driver
started; a request arrives when the client issues it (how late the driver was against the
workload's schedule is reported as ``driver_late_mean_s``/``driver_late_max_s``).

Before the workload, a calibration probe (:func:`probe_path`) measures the request path's fixed
cost on the idle stack: a few requests shaped like the workload's first ones (unique prompts, two
output tokens), one at a time through the same client code; for each, the client's time to the first
chunk less the emulator's own TTFT (its ``vllm:time_to_first_token_seconds`` before and after). The
median is the figure the twin runs with (``request_path.first_chunk_s``); nothing of the workload
run sets it. The probe's requests are left out of the routing reasons and per-hop means reported.

Streams are read through the client's streaming-response API (``with_streaming_response``) and
each SSE chunk is decoded by a msgspec struct of the three fields the driver reads: the client's
typed chunks (a pydantic model per token) cost the driver more than a loaded 2-core machine gives
it at a thousand tokens a second, and that lateness (350 ms mean, 2.6 s at worst, on the lost-GPU
rehearsal at load 30) would have been measured as the fleet's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from tokenplane.demo import MODEL, Stack, route_reasons, start_stack
from tokenplane.rehearse.errors import RehearsalError
from tokenplane.rehearse.fleet import (
    emulator_args,
    gateway_settings,
    histogram_mean,
    histogram_totals,
    metric_sums,
)
from tokenplane.rehearse.prompts import prompt_text
from tokenplane.sim.catalog import Catalog
from tokenplane.sim.faults import ClientSpec, FaultSpec
from tokenplane.sim.fleet import prefix_bound
from tokenplane.sim.records import InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.report import RunAggregate, Slo, build_run_report
from tokenplane.sim.scenario import RunSettings
from tokenplane.sim.workloads.base import RequestSpec, Workload
from tokenplane.sim.workloads.factory import build_workload
from tokenplane.sim.workloads.traces import traces_dir


class _Choice(msgspec.Struct):
    text: str = ""


class _Details(msgspec.Struct):
    cached_tokens: int = 0


class _Usage(msgspec.Struct):
    prompt_tokens_details: _Details | None = None


class _Chunk(msgspec.Struct):
    """What the driver reads of a streamed completion chunk (the rest is skipped undecoded)."""

    choices: list[_Choice] = []
    usage: _Usage | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


#: Probe requests: a multiple of the fleet size at least this (a round-robin router then starts the
#: workload where it would have without the probe), after one warm-up request per instance (not
#: counted: it opens the client's and the gateway's connections, which the workload's requests find
#: open).
PROBE_REQUESTS = 16
PROBE_OUTPUT_TOKENS = 2
#: Probe request ids: above any workload's, so their prompts share no tokens with the workload's.
PROBE_ID_BASE = 1 << 40
_INSTANCE_TTFT = "vllm:time_to_first_token_seconds"
_GATEWAY_TTFT = "tokenplane_ttft_seconds"


@dataclass
class PathProbe:
    """The calibration probe's per-request times to the first chunk, seen at three places."""

    client_ttft_s: list[float] = field(default_factory=list)
    gateway_ttft_s: list[float] = field(default_factory=list)
    instance_ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)

    @property
    def first_chunk_s(self) -> float:
        """The request path's fixed cost: median of (client TTFT - instance TTFT), never negative."""
        pairs = zip(self.client_ttft_s, self.instance_ttft_s, strict=True)
        return max(0.0, statistics.median(c - i for c, i in pairs))

    def summary(self) -> dict[str, Any]:
        med = statistics.median
        c, g, i = self.client_ttft_s, self.gateway_ttft_s, self.instance_ttft_s
        return {
            "requests": len(c),
            "prompt_tokens_median": statistics.median(self.prompt_tokens),
            "first_chunk_s": self.first_chunk_s,
            "client_ttft_median_s": med(c),
            "gateway_ttft_median_s": med(g),
            "instance_ttft_median_s": med(i),
            # the path in two parts: gateway <-> instance, and client + HTTP <-> gateway
            "gateway_hop_s": med([a - b for a, b in zip(g, i, strict=True)]),
            "client_hop_s": med([a - b for a, b in zip(c, g, strict=True)]),
            # the spread of the figure (quartiles of client - instance): a loaded machine widens it
            "first_chunk_quartiles_s": statistics.quantiles([a - b for a, b in zip(c, i, strict=True)], n=4),
        }


@dataclass
class LiveRun:
    """What the driver measured; :func:`run_live` turns it into a report."""

    records: list[RequestRecord] = field(default_factory=list)
    tbt: TbtHistogram = field(default_factory=TbtHistogram)
    route_reasons: dict[str, int] = field(default_factory=dict)
    end_s: float = 0.0
    wall_s: float = 0.0
    faults_applied: list[str] = field(default_factory=list)
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    ttft_mean_by_hop_s: dict[str, float | None] = field(default_factory=dict)
    driver_late_mean_s: float = 0.0
    gateway_retries: int = 0
    continuations: int = 0
    driver_late_max_s: float = 0.0
    path_probe: PathProbe | None = None


class _Driver:
    def __init__(
        self,
        run: RunSettings,
        workload: Workload,
        client: Any,
        stack: Stack,
        session: aiohttp.ClientSession,
    ) -> None:
        self.run = run
        self.workload = workload
        self.client = client
        self.stack = stack
        self.session = session
        self.clients = run.clients or ClientSpec()
        self.rng = random.Random(run.seed)
        self.out = LiveRun()
        # perf_counter, not the loop's clock: uvloop's ``loop.time()`` moves in whole milliseconds,
        # a seventh of a decode step on an H100.
        self.t0 = time.perf_counter()
        self.in_flight = 0
        self.arrivals_done = False
        self.idle = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.last_activity = 0.0
        self._seen_hashes: set[int] = set()
        self.late_sum = 0.0
        self.late_max = 0.0
        self.stopping = False  # the run's end: requests cut there have no follow-ups

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- workload ------------------------------------------------------------------------------
    async def feed(self) -> None:
        for spec in self.workload.arrivals():
            prompt = prompt_text(spec)  # before the arrival: the twin's client costs nothing
            await self._sleep_until(spec.arrival_s)
            self._start(spec, prompt)
        self.arrivals_done = True
        self._check_idle()

    def _start(self, spec: RequestSpec, prompt: str) -> None:
        self.in_flight += 1
        task = asyncio.create_task(self._request(spec, prompt))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _followup(self, spec: RequestSpec) -> None:
        prompt = prompt_text(spec)
        await self._sleep_until(spec.arrival_s)
        self.in_flight -= 1  # the follow-up's placeholder (taken when it was scheduled)
        self._start(spec, prompt)

    async def _sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    def _check_idle(self) -> None:
        if self.arrivals_done and self.in_flight == 0:
            self.idle.set()

    # -- one logical request -------------------------------------------------------------------
    async def _request(self, spec: RequestSpec, prompt: str) -> None:
        # The request enters the system when the client issues it: the driver's own lateness (a
        # loaded loop) is reported apart (``driver_late_*``), not counted as the fleet's latency.
        arrival = self.now()
        late = arrival - spec.arrival_s
        self.late_sum += max(0.0, late)
        self.late_max = max(self.late_max, late)
        rec = RequestRecord(spec.request_id, spec.tenant, arrival, spec.prompt_tokens, spec.output_tokens)
        rec.prefix_bound_tokens = self._prefix_bound(spec)
        self.out.records.append(rec)
        ok = False
        try:
            ok = await self._attempts(spec, rec, prompt)
        finally:
            end = self.now()
            if rec.finish_s is None and ok:
                rec.finish_s = end
            self.last_activity = max(self.last_activity, end)
            for nxt in [] if self.stopping else self.workload.on_finished(spec, end, ok):
                self.in_flight += 1
                task = asyncio.create_task(self._followup(nxt))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            self.in_flight -= 1
            self._check_idle()

    async def _attempts(self, spec: RequestSpec, rec: RequestRecord, prompt: str) -> bool:
        c = self.clients
        retry = c.retry != "none"
        attempt = 0
        while True:
            attempt += 1
            rec.attempts = attempt
            reason = await self._attempt(spec, rec, prompt)
            if not reason:
                rec.ok, rec.reason = True, ""
                return True
            rec.reason = reason
            if not retry or attempt >= c.max_attempts or (reason == "error" and not c.retry_on_error):
                return False
            if c.retry == "backoff":
                delay = min(c.backoff_max_s, c.backoff_base_s * 2 ** (attempt - 1))
                await asyncio.sleep(self.rng.uniform(0, delay))

    async def _attempt(self, spec: RequestSpec, rec: RequestRecord, prompt: str) -> str:
        """One attempt through the gateway; '' when the whole answer arrived, else why not."""
        headers: dict[str, str] = {}
        wf = spec.workflow
        if wf is not None:
            headers["x-tokenplane-workflow-id"] = wf.workflow_id
            headers["x-tokenplane-step"] = str(wf.step)
            if wf.total_steps is not None:
                headers["x-tokenplane-total-steps"] = str(wf.total_steps)
        tokens = 0
        last: float | None = None
        tbt = self.out.tbt
        try:
            async with asyncio.timeout(self.clients.timeout_s):
                async with self.client.completions.with_streaming_response.create(
                    model=MODEL,
                    prompt=prompt,
                    max_tokens=spec.output_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                    extra_headers=headers,
                ) as response:
                    async for line in response.iter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = _decode_chunk(line[6:])
                        choices = chunk.choices
                        if choices and choices[0].text:
                            t = self.now()
                            tokens += max(1, choices[0].text.count(" "))
                            if rec.first_token_s is None:
                                rec.first_token_s = t
                            elif last is not None:
                                tbt.add(t - last, 1)
                            last = t
                        if chunk.usage is not None:
                            details = chunk.usage.prompt_tokens_details
                            rec.prefix_hit_tokens = 0 if details is None else details.cached_tokens
        except TimeoutError:
            return "timeout"
        except Exception:  # a broken stream, a refused request: the client sees an error
            return "error"
        if tokens < spec.output_tokens:
            return "truncated"
        rec.finish_s = self.now()
        return ""

    def _prefix_bound(self, spec: RequestSpec) -> int:
        """As the twin's fleet computes it: what one infinite shared cache would hold."""
        return prefix_bound(spec, self._seen_hashes)

    # -- faults --------------------------------------------------------------------------------
    async def fault(self, f: FaultSpec) -> None:
        await self._sleep_until(f.at_s)
        em = self.stack.emulators[f.instance]
        if f.kind == "slow":
            await self._admin(em.url, {"slow_factor": f.factor})
            self.out.faults_applied.append(f"{self.now():.1f}s slow x{f.factor:g} {em.instance_id}")
            if f.duration_s is not None:
                await self._sleep_until(f.at_s + f.duration_s)
                await self._admin(em.url, {"slow_factor": 1.0})
                self.out.faults_applied.append(f"{self.now():.1f}s slow cleared {em.instance_id}")
        elif f.kind == "lose":
            self.stack.kill(f.instance)
            self.out.faults_applied.append(f"{self.now():.1f}s lost {em.instance_id}")
            if f.replace_after_s is not None:
                await self._sleep_until(f.at_s + f.replace_after_s)
                self.stack.restart(f.instance)
                self.out.faults_applied.append(f"{self.now():.1f}s replacement started {em.instance_id}")
        else:  # refused by sizing.rehearsal_run
            raise RehearsalError(f"{f.kind} faults are not rehearsed live")

    async def _admin(self, url: str, body: dict[str, Any]) -> None:
        async with self.session.post(url + "/admin/faults", json=body) as r:
            if r.status != 200:
                raise RehearsalError(f"{url}/admin/faults answered {r.status}: {await r.text()}")

    async def drive(self) -> None:
        faults = [asyncio.create_task(self.fault(f)) for f in self.run.faults]
        feeder = asyncio.create_task(self.feed())
        until = self.run.duration_s
        try:
            if until is None:
                await self.idle.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.idle.wait(), timeout=max(0.0, until - self.now()))
        finally:
            self.stopping = True
            for t in [feeder, *faults, *self.tasks]:
                t.cancel()
            await asyncio.gather(feeder, *faults, *list(self.tasks), return_exceptions=True)
            for f in faults:
                if f.done() and not f.cancelled() and f.exception() is not None:
                    raise f.exception()  # type: ignore[misc]
        self.out.end_s = until if until is not None else self.last_activity
        n = len(self.out.records)
        self.out.driver_late_mean_s = self.late_sum / n if n else 0.0
        self.out.driver_late_max_s = self.late_max
        for r in self.out.records:
            if not r.ok and not r.reason:
                r.reason = "unfinished"


async def probe_path(driver: _Driver, prompt_tokens: list[int]) -> PathProbe:
    """Send one request per entry of ``prompt_tokens``, one at a time on the idle stack, through
    the driver's own client code; time each one's first chunk at the client, the gateway and the
    instance (the histograms' sums just before and after each request)."""
    session, stack = driver.session, driver.stack
    urls, gateway = [em.url for em in stack.emulators], [stack.gateway]
    out = PathProbe()
    for k, tokens in enumerate(prompt_tokens[: len(stack.emulators)]):  # warm-up, not counted
        spec = RequestSpec(PROBE_ID_BASE - 1 - k, 0.0, tokens, PROBE_OUTPUT_TOKENS, (), 16, tenant="probe")
        rec = RequestRecord(spec.request_id, spec.tenant, driver.now(), tokens, PROBE_OUTPUT_TOKENS)
        await driver._attempt(spec, rec, prompt_text(spec))
    for k, tokens in enumerate(prompt_tokens):
        spec = RequestSpec(PROBE_ID_BASE + k, 0.0, tokens, PROBE_OUTPUT_TOKENS, (), 16, tenant="probe")
        prompt = prompt_text(spec)
        inst0, _ = await histogram_totals(session, urls, _INSTANCE_TTFT)
        gw0, _ = await histogram_totals(session, gateway, _GATEWAY_TTFT)
        rec = RequestRecord(spec.request_id, spec.tenant, driver.now(), tokens, PROBE_OUTPUT_TOKENS)
        reason = await driver._attempt(spec, rec, prompt)
        if reason or rec.first_token_s is None:
            raise RehearsalError(f"the calibration probe's request {k} failed ({reason or 'no token'})")
        inst1, _ = await histogram_totals(session, urls, _INSTANCE_TTFT)
        gw1, _ = await histogram_totals(session, gateway, _GATEWAY_TTFT)
        out.client_ttft_s.append(rec.first_token_s - rec.arrival_s)
        out.gateway_ttft_s.append(gw1 - gw0)
        out.instance_ttft_s.append(inst1 - inst0)
        out.prompt_tokens.append(tokens)
        await asyncio.sleep(0.02)  # let the instance go idle again
    return out


def probe_prompt_sizes(run: RunSettings, traces: str | Path | None) -> list[int]:
    """Prompt sizes for the probe: those of the workload's first requests (its shape, not its
    measured outcome), :data:`PROBE_REQUESTS` rounded up to a multiple of the fleet size."""
    n = -(-PROBE_REQUESTS // run.fleet.instances) * run.fleet.instances
    fresh = build_workload(run.workload, traces=traces_dir(traces), seed=run.seed)
    sizes = [spec.prompt_tokens for spec in itertools.islice(fresh.arrivals(), n)]
    return [max(16, sizes[k % len(sizes)]) for k in range(n)] if sizes else [512] * n


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
                prober = _Driver(run, workload, client, stack, session)  # its own records and TBT
                path_probe = await probe_path(prober, probe_prompt_sizes(run, traces))
            # what the probe left in the counters, taken off what the workload run reports
            reasons0 = await route_reasons(session, stack.gateway)
            inst0 = await histogram_totals(session, urls, _INSTANCE_TTFT)
            gw0 = await histogram_totals(session, [stack.gateway], _GATEWAY_TTFT)
            driver = _Driver(run, workload, client, stack, session)
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
                "instance": await histogram_mean(session, urls, _INSTANCE_TTFT, since=inst0),
                "gateway": await histogram_mean(session, [stack.gateway], _GATEWAY_TTFT, since=gw0),
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
