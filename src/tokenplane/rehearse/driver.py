"""The live driver: a rehearsal run's workload through the real gateway, in real time.

A fresh instance of the run's workload (same seed) is driven through the official ``openai``
client: open-loop arrivals at their times, closed-loop follow-ups (an agent's next step) from the
live finish times, exactly as the twin's fleet asks the workload for them. Every request streams,
asks for exactly the spec's output length (``ignore_eos``) and carries the spec's prefix structure
(:mod:`.prompts`).

Clients time out and retry per the run's ``clients``; faults hit the emulators at their times
(``slow``: ``POST /admin/faults``; ``lose``: the process is killed, and restarted after
``replace_after_s``). Each request is a :class:`~tokenplane.sim.records.RequestRecord`, as in the
twin. Times are seconds since the driver started; a request arrives when the client issues it (how
late the driver was against the workload's schedule is reported as
``driver_late_mean_s``/``driver_late_max_s``).

Streams are read through the client's streaming-response API (``with_streaming_response``) and
each SSE chunk is decoded by a msgspec struct of the three fields the driver reads: the client's
typed chunks (a pydantic model per token) cost the driver more than a loaded 2-core machine gives
it at a thousand tokens a second, and that lateness (350 ms mean, 2.6 s at worst, on the lost-GPU
rehearsal at load 30) would have been measured as the fleet's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from tokenplane.demo import MODEL, Stack
from tokenplane.rehearse.errors import RehearsalError
from tokenplane.rehearse.probe import PathProbe
from tokenplane.rehearse.prompts import prompt_text
from tokenplane.sim.faults import ClientSpec, FaultSpec
from tokenplane.sim.fleet import prefix_bound
from tokenplane.sim.records import RequestRecord, TbtHistogram
from tokenplane.sim.scenario import RunSettings
from tokenplane.sim.workloads.base import RequestSpec, Workload


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


@dataclass
class LiveRun:
    """What the driver measured; :func:`~tokenplane.rehearse.live.live_report` turns it into a report."""

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


class Driver:
    """The run's workload, its clients' retries and its faults, against a started stack; what it
    measures goes to :attr:`out`."""

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
            reason = await self.attempt(spec, rec, prompt)
            if not reason:
                rec.ok, rec.reason = True, ""
                return True
            rec.reason = reason
            if not retry or attempt >= c.max_attempts or (reason == "error" and not c.retry_on_error):
                return False
            if c.retry == "backoff":
                delay = min(c.backoff_max_s, c.backoff_base_s * 2 ** (attempt - 1))
                await asyncio.sleep(self.rng.uniform(0, delay))

    async def attempt(self, spec: RequestSpec, rec: RequestRecord, prompt: str) -> str:
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
