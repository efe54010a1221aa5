"""A soak with chaos: the gateway in front of emulated instances, mixed traffic, seeded faults.

Two stacks run side by side in one run, each a real ``tokenplane serve`` process in front of real
``python -m tokenplane.emulator`` processes: the *chaos* stack, on which a seeded schedule kills
(SIGKILL, then a restart on the same port), crashes mid-answer, stalls, slows, fails, hangs and
marks unhealthy the instances through their ``/admin/faults`` API, and restarts the gateway
(SIGTERM, then a new process on the same port); and the *calm* stack, which receives the same seeded
traffic with no fault. Both get the same arrivals at the same moments, so
``goodput_ratio_vs_fault_free`` is measured side by side on the same machine.

Traffic (open loop, Poisson arrivals, seeded): plain chat completions, streamed chat completions
(``stream_options.include_usage``) and agentic tasks of 2 to 5 sequential steps. Every request
carries workflow hints (``x-tokenplane-workflow-id``, ``-step``, ``-total-steps``): a single
request is a one-step workflow. The load is ``--load`` (default 0.7) of the fleet's nominal
capacity: ``instances x max_num_seqs`` batch slots over the mean service time of a request on
an emulated instance with a fixed step time (``prefill step + max_tokens steps``).

Checks (printed as JSON with ``--json``):

* ``requests_sent``, ``terminal_outcomes`` and ``lost``: a request is terminal when the client saw a
  complete answer, an HTTP error with an OpenAI error body, an error event in its stream, or a
  connection error while the gateway was being restarted; anything else (no answer within the
  client's timeout, a stream that ends without ``[DONE]`` or an error, an error without the
  OpenAI shape, a connection error while the gateway was up) is lost. ``lost_reasons`` counts
  why (per stack), ``lost_sent_at_s`` when the first and last lost request were sent,
  ``lost_examples`` the first five whole (replica, sent and ended times, reason), and
  ``failed_outcomes`` counts every answer other than ok by kind and detail.
* ``ledger_mismatches``: after the run every workflow is read back through
  ``GET /v1/workflows/{id}``: a task the client saw succeed must be ``succeeded`` with an ok
  attempt for each step; a step the client saw fail must have no ok attempt and its task must
  not be ``succeeded``. Workflows whose failing step ended in a gateway restart are not judged
  (``ledger_unverifiable``).
* ``rss_growth_pct`` / ``fd_growth``: the gateway's resident memory and open descriptors (less the
  client connections of the requests in flight at that moment), read from ``/proc``, from the end
  of the warm-up to the end of the run (the median of three samples at each end), per gateway
  process lifetime; the longest lifetime of the chaos gateway is reported,
  and the calm gateway's as ``calm_rss_growth_pct`` / ``calm_fd_growth``.
* TTFT p99 of streamed requests sent inside and outside fault windows.

Run: ``nice -n 10 python bench/soak.py --minutes 10 --json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from soak_stack import MODEL, ChaosEvent, Fleet, Gateway, Stack

from tokenplane.runloop import Terminated, run_stoppable

HEADER = "x-tokenplane-"
_TEXT = (
    "tensor kernel batch cache token prefix route queue shard replica latency budget agent tool search "
    "plan patch test review deploy metric trace window scheduler decode prefill"
)
WORDS = _TEXT.split()
ACTIONS = ("kill", "crash", "stall", "slow", "fail", "hang", "unhealthy", "gateway_restart")
ACTION_WEIGHTS = (0.15, 0.1, 0.15, 0.15, 0.15, 0.1, 0.1, 0.05)
SHARED_ACTIONS = {"redis_restart": 0.05, "pg_cut": 0.05}  # with --redis / --postgres


# -- traffic ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One arrival: ``steps`` sequential requests of one workflow."""

    at: float
    workflow_id: str
    kind: str  # chat | stream | agentic
    steps: int
    max_tokens: tuple[int, ...]
    streams: tuple[bool, ...]
    prompt: str


def workload(seed: int, duration_s: float, rps: float, fleet: Fleet) -> list[Task]:
    """Seeded Poisson arrivals of requests at ``rps`` (an agentic task counts its steps)."""
    rng = random.Random(seed)
    tasks: list[Task] = []
    t = 0.0
    run = secrets.token_hex(3)
    mean_steps = 0.4 * 1 + 0.3 * 1 + 0.3 * 3.5
    while True:
        t += rng.expovariate(rps / mean_steps)
        if t >= duration_s:
            return tasks
        u = rng.random()
        kind = "chat" if u < 0.4 else "stream" if u < 0.7 else "agentic"
        steps = rng.randint(2, 5) if kind == "agentic" else 1
        tokens = tuple(rng.randint(*fleet.max_tokens) for _ in range(steps))
        streams = tuple(kind == "stream" or (kind == "agentic" and rng.random() < 0.5) for _ in range(steps))
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
        tasks.append(Task(t, f"soak-{run}-{len(tasks)}", kind, steps, tokens, streams, prompt))


@dataclass
class Outcome:
    workflow_id: str
    step: int
    sent_t: float
    kind: str  # ok | http_error | stream_error | restart_error | lost
    detail: str = ""
    ttft_s: float | None = None
    stream: bool = False
    gateway: str = ""  # the replica that was asked
    ended_t: float | None = None


def _error_shaped(body: bytes) -> bool:
    with contextlib.suppress(ValueError):
        err = json.loads(body).get("error")
        return isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err
    return False


async def one_request(
    http: aiohttp.ClientSession,
    gw: Gateway,
    key: str,
    task: Task,
    step: int,
    t0: float,
    timeout_s: float,
) -> Outcome:
    stream = task.streams[step - 1]
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a careful agent."},
            {"role": "user", "content": f"step {step}: {task.prompt}"},
        ],
        "max_tokens": task.max_tokens[step - 1],
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {
        "Authorization": f"Bearer {key}",
        HEADER + "workflow-id": task.workflow_id,
        HEADER + "step": str(step),
        HEADER + "total-steps": str(task.steps),
    }
    sent = time.monotonic() - t0
    out = Outcome(task.workflow_id, step, sent, "lost", stream=stream, gateway=gw.name)
    done = False
    gw.in_flight += 1
    try:
        async with asyncio.timeout(timeout_s):
            async with http.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    raw = await r.read()
                    if _error_shaped(raw):
                        out.kind, out.detail = "http_error", str(r.status)
                    else:
                        out.detail = f"status {r.status} without the OpenAI error shape"
                    return out
                if not stream:
                    data = await r.json()
                    if data.get("choices"):
                        out.kind = "ok"
                    else:
                        out.detail = "a 200 without choices"
                    return out
                async for line in r.content:
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:].strip()
                    if payload == b"[DONE]":
                        done = True
                        continue  # read on to the end of the body, as the openai client does
                    event = json.loads(payload)
                    if "error" in event:
                        out.kind, out.detail = "stream_error", str(event["error"].get("type"))
                        return out
                    if out.ttft_s is None and any(
                        c.get("delta", {}).get("content") for c in event.get("choices", ())
                    ):
                        out.ttft_s = time.monotonic() - t0 - sent
                if done:
                    out.kind = "ok"
                elif gw.in_restart(sent, time.monotonic() - t0):
                    out.kind, out.detail = "restart_error", "stream cut while the gateway restarted"
                else:
                    out.detail = "stream ended without [DONE] or an error"
                return out
    except TimeoutError:
        out.detail = f"no terminal answer within {timeout_s} s"
    except (aiohttp.ClientError, ConnectionError, ValueError) as exc:
        if done:  # the whole answer came; the connection broke after it
            out.kind = "ok"
        elif gw.in_restart(sent, time.monotonic() - t0):
            out.kind, out.detail = "restart_error", type(exc).__name__
        else:
            out.detail = f"{type(exc).__name__}: {exc}"
    finally:
        gw.in_flight -= 1
        out.ended_t = time.monotonic() - t0
    return out


# -- chaos --------------------------------------------------------------------------------------------


def chaos_schedule(
    seed: int,
    duration_s: float,
    emulators: list[str],
    mean_gap_s: float,
    gateways: tuple[str, ...] = ("gateway",),
    shared: tuple[str, ...] = (),
) -> list[ChaosEvent]:
    """Seeded faults; at most ``len(emulators) - 1`` instances faulted at once, one gateway restart
    at a time, none in the first 10 % or the last 10 % of the run (warm-up and drain). ``gateways``:
    the replicas a restart picks from; ``shared``: the extra actions (``SHARED_ACTIONS``) on what
    replicas share, one at a time."""
    rng = random.Random(seed ^ 0xC4A05)
    actions = ACTIONS + tuple(a for a in SHARED_ACTIONS if a in shared)
    weights = ACTION_WEIGHTS + tuple(SHARED_ACTIONS[a] for a in actions[len(ACTIONS) :])
    events: list[ChaosEvent] = []
    busy: dict[str, float] = {}
    t = max(5.0, duration_s * 0.1)
    while True:
        t += rng.expovariate(1.0 / mean_gap_s)
        if t >= duration_s * 0.9:
            return events
        action = rng.choices(actions, weights)[0]
        d = round(
            max(1.0, rng.uniform(4.0, 15.0) * min(1.0, duration_s / 120)), 1
        )  # short runs: short faults
        if action == "gateway_restart":
            if busy.get("gateway", 0) > t or busy.get("shared", 0) > t:
                continue
            busy["gateway"] = t + min(10.0, duration_s / 4)
            target = gateways[0] if len(gateways) == 1 else rng.choice(gateways)
            events.append(ChaosEvent(round(t, 2), action, target, 0.0))
            continue
        if action in SHARED_ACTIONS:
            # Not while a replica restarts: one that stops while the database is cut off loses the
            # ledger writes it still had queued (ledger/aio.py, close_timeout_s), a known limit.
            if busy.get("shared", 0) > t or busy.get("gateway", 0) > t:
                continue
            busy["shared"] = t + d + min(3.0, d)
            events.append(ChaosEvent(round(t, 2), action, action.split("_")[0], d))
            continue
        free = [e for e in emulators if busy.get(e, 0) <= t]
        if len(free) <= 1:
            continue
        target = rng.choice(free)
        busy[target] = t + d + min(3.0, d)
        params: dict[str, Any] = {}
        if action == "stall":
            params = {"die_after_tokens": rng.randint(1, 6), "stall": True, "die_count": rng.randint(1, 4)}
        elif action == "crash":
            params = {"die_after_tokens": rng.randint(1, 6), "exit_process": True, "die_count": 1}
        elif action == "slow":
            params = {"slow_factor": rng.choice((2.0, 4.0, 8.0))}
        elif action == "fail":
            params = {"error_status": rng.choice((500, 502, 503)), "error_count": rng.randint(1, 20)}
        elif action == "hang":
            params = {"hang": True, "hang_count": rng.randint(1, 4)}
        elif action == "unhealthy":
            params = {"unhealthy": True}
        events.append(ChaosEvent(round(t, 2), action, target, d, params))


# -- the run ------------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))], 4)


def _growth(
    gw: Gateway, warmup_s: float, curve_every_s: float = 60.0
) -> tuple[float | None, int | None, list[dict[str, Any]]]:
    per: list[dict[str, Any]] = []
    for samples, full_at in zip(gw.lifetimes, gw.index_full_at, strict=True):
        if not samples:
            continue
        start = samples[0][0]
        after = [s for s in samples if s[0] >= start + warmup_s]
        if len(after) < 6:
            continue
        head, tail = after[:3], after[-3:]
        rss0 = statistics.median(s[1] for s in head)
        rss1 = statistics.median(s[1] for s in tail)
        fd0 = statistics.median(s[2] for s in head)
        fd1 = statistics.median(s[2] for s in tail)
        curve, next_t = [], start
        for t, rss, fds in samples:
            if t >= next_t:
                curve.append([round(t / 60, 1), round(rss / 1024, 1), fds])
                next_t = t + curve_every_s
        per.append(
            {
                "curve_min_mb_fds": curve,
                "from_s": round(after[0][0], 1),
                "to_s": round(after[-1][0], 1),
                "rss_kb": [int(rss0), int(rss1)],
                "rss_growth_pct": round((rss1 - rss0) / rss0 * 100, 2),
                "fds": [int(fd0), int(fd1)],
                "fd_growth": int(fd1 - fd0),
                **_after_index_full(samples, full_at),
            }
        )
    if not per:
        return None, None, per
    longest = max(per, key=lambda p: p["to_s"] - p["from_s"])
    return longest["rss_growth_pct"], longest["fd_growth"], per


def _after_index_full(samples: list[tuple[float, int, int]], full_at: float | None) -> dict[str, Any]:
    """RSS growth from the moment the prefix index was full (every instance at its KV cache size)."""
    after = [s for s in samples if full_at is not None and s[0] >= full_at]
    if len(after) < 6:
        return {"index_full_at_s": full_at, "rss_growth_pct_after_index_full": None}
    rss0 = statistics.median(s[1] for s in after[:3])
    rss1 = statistics.median(s[1] for s in after[-3:])
    return {
        "index_full_at_s": round(after[0][0], 1),
        "rss_growth_pct_after_index_full": round((rss1 - rss0) / rss0 * 100, 2),
    }


def _growth_of(
    gateways: list[Gateway], warmup_s: float
) -> tuple[float | None, int | None, list[dict[str, Any]]]:
    """:func:`_growth` of one gateway, or the worst of several replicas (each lifetime named)."""
    worst_rss: float | None = None
    worst_fds: int | None = None
    every: list[dict[str, Any]] = []
    for g in gateways:
        rss, fds, per = _growth(g, warmup_s)
        if len(gateways) > 1:
            per = [{"process": g.name, **p} for p in per]
        every.extend(per)
        if rss is not None and (worst_rss is None or rss > worst_rss):
            worst_rss = rss
        if fds is not None and (worst_fds is None or fds > worst_fds):
            worst_fds = fds
    return worst_rss, worst_fds, every


async def check_ledger(
    http: aiohttp.ClientSession, stack: Stack, key: str, tasks: list[Task], outcomes: list[Outcome]
) -> tuple[int, int, list[dict[str, Any]]]:
    """Compare what each client saw with ``GET /v1/workflows/{id}``; returns (mismatches,
    unverifiable, the first mismatches)."""
    by_wf: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_wf.setdefault(o.workflow_id, []).append(o)
    steps = {t.workflow_id: t.steps for t in tasks}
    mismatches = unverifiable = 0
    examples: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(16)

    async def check(wf: str, seen: list[Outcome]) -> None:
        nonlocal mismatches, unverifiable
        seen.sort(key=lambda o: o.step)
        last = seen[-1]
        if last.kind in ("restart_error", "lost"):
            unverifiable += 1
            return
        async with (
            sem,
            http.get(
                stack.gateway.url + f"/v1/workflows/{wf}", headers={"Authorization": f"Bearer {key}"}
            ) as r,
        ):
            data = await r.json() if r.status == 200 else None
        problem = None
        ok_steps = {a["step"] for a in (data or {}).get("attempt_log", ()) if a["ok"]}
        if last.kind == "ok":
            want = set(range(1, steps[wf] + 1))
            if data is None:
                problem = f"the client saw {steps[wf]} steps succeed; the ledger has no workflow"
            elif data.get("outcome") != "succeeded" or not want <= ok_steps:
                problem = (
                    f"the client saw success; the ledger says {data.get('outcome')}"
                    f" with ok steps {sorted(ok_steps)}"
                )
        else:
            if data is not None and (data.get("outcome") == "succeeded" or last.step in ok_steps):
                problem = (
                    f"the client saw step {last.step} fail ({last.kind} {last.detail});"
                    f" the ledger says {data.get('outcome')}, ok steps {sorted(ok_steps)}"
                )
            if data is None and last.step > 1:
                problem = f"the client saw {last.step - 1} steps succeed; the ledger has no workflow"
        if problem:
            mismatches += 1
            if len(examples) < 10:
                examples.append({"workflow_id": wf, "problem": problem})

    await asyncio.gather(*(check(wf, seen) for wf, seen in by_wf.items()))
    return mismatches, unverifiable, examples


async def drive(
    http: aiohttp.ClientSession,
    stack: Stack,
    key: str,
    tasks: list[Task],
    t0: float,
    timeout_s: float,
    outcomes: list[Outcome],
) -> list[Outcome]:

    async def run_task(task: Task) -> None:
        await asyncio.sleep(max(0.0, t0 + task.at - time.monotonic()))
        for step in range(1, task.steps + 1):
            o = await one_request(http, stack.pick(), key, task, step, t0, timeout_s)
            outcomes.append(o)
            if o.kind != "ok":
                return

    await asyncio.gather(*(run_task(t) for t in tasks))
    return outcomes


def summarize(stack: Stack, outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    for o in outcomes:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1

    def inside(o: Outcome) -> bool:
        return any(s <= o.sent_t <= e for s, e in stack.fault_windows)

    lost = [o for o in outcomes if o.kind == "lost"]
    why: dict[str, int] = {}
    for o in lost:
        why[o.detail] = why.get(o.detail, 0) + 1
    failed: dict[str, int] = {}
    for o in outcomes:
        if o.kind != "ok":
            key = f"{o.kind}: {o.detail}"
            failed[key] = failed.get(key, 0) + 1
    ttft_in = [o.ttft_s for o in outcomes if o.ttft_s is not None and inside(o)]
    ttft_out = [o.ttft_s for o in outcomes if o.ttft_s is not None and not inside(o)]
    return {
        "requests_sent": len(outcomes),
        "terminal_outcomes": len(outcomes) - kinds.get("lost", 0),
        "lost": kinds.get("lost", 0),
        "outcomes": kinds,
        # why each lost request was lost (the ten commonest reasons) and when the lost ones were sent
        "lost_reasons": dict(sorted(why.items(), key=lambda kv: -kv[1])[:10]),
        "lost_sent_at_s": [round(min(o.sent_t for o in lost), 1), round(max(o.sent_t for o in lost), 1)]
        if lost
        else None,
        # the first lost requests whole, to tell a race from a bug: which replica, when, what
        "lost_examples": [
            {
                "workflow_id": o.workflow_id,
                "step": o.step,
                "stream": o.stream,
                "gateway": o.gateway,
                "sent_t": round(o.sent_t, 2),
                "ended_t": None if o.ended_t is None else round(o.ended_t, 2),
                "detail": o.detail,
            }
            for o in sorted(lost, key=lambda o: o.sent_t)[:5]
        ],
        "failed_outcomes": dict(sorted(failed.items(), key=lambda kv: -kv[1])[:10]),
        "goodput_rps": round(kinds.get("ok", 0) / wall_s, 3),
        "ttft_p99_in_fault_windows_s": _pct(ttft_in, 99),
        "ttft_p99_outside_fault_windows_s": _pct(ttft_out, 99),
        "ttft_samples_in_out": [len(ttft_in), len(ttft_out)],
    }


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    duration_s = args.seconds if args.seconds else args.minutes * 60.0
    fleet = Fleet(
        instances=args.instances,
        max_num_seqs=args.max_num_seqs,
        step_ms=args.step_ms,
        kv_capacity_tokens=args.kv_capacity_tokens,
    )
    rps = args.rps if args.rps else args.load * fleet.capacity_rps()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tokenplane-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    key = "tp-soak-" + secrets.token_hex(8)
    tasks = workload(args.seed, duration_s, rps, fleet)
    shape = {"replicas": args.replicas, "redis": args.redis, "postgres": args.postgres}
    chaos = Stack("chaos", fleet, args.seed, workdir, key, **shape)
    calm = Stack("calm", fleet, args.seed, workdir, key, **shape) if args.baseline else None
    stacks = [s for s in (chaos, calm) if s is not None]
    shared = tuple(a for a, on in (("redis_restart", args.redis), ("pg_cut", args.postgres)) if on)
    schedule = chaos_schedule(
        args.seed,
        duration_s,
        [e.name for e in chaos.emulators],
        args.chaos_gap_s,
        tuple(g.name for g in chaos.gateways) if args.replicas > 1 else ("gateway",),
        shared,
    )
    if not args.chaos:
        schedule = []
    warmup_s = max(10.0, duration_s * 0.1)
    timeout = aiohttp.ClientTimeout(total=None, connect=5)
    # A connection per request (many clients, as at a public edge): the gateway's descriptors then
    # hold one client connection per request in flight, which the samples subtract.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    result: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        try:
            for s in stacks:
                if args.tracemalloc:
                    for g in s.gateways:
                        g.heap_dir = workdir / f"{g.name}-heap"
                await s.start(http)
            t0 = time.monotonic()
            done = False

            seen: list[list[Outcome]] = [[] for _ in stacks]
            gateways = [g for s in stacks for g in s.gateways]

            async def sampler() -> None:
                last_report = last_heap = 0.0
                while not done:
                    now = time.monotonic() - t0
                    for g in gateways:
                        g.sample(now)
                    await asyncio.gather(*(g.read_index(http, now) for g in gateways))
                    if args.tracemalloc and (now - last_heap >= args.heap_every_s or last_heap == 0.0):
                        last_heap = now
                        for g in gateways:
                            g.dump_heap(now)
                    if now - last_report >= 60:
                        last_report = now
                        lost = [sum(o.kind == "lost" for o in out) for out in seen]
                        print(
                            f"soak: {now / 60:.1f} min, requests done {[len(o) for o in seen]}, lost {lost}",
                            file=sys.stderr,
                            flush=True,
                        )
                    await asyncio.sleep(args.sample_s)

            async def run_chaos() -> None:
                pending: list[Awaitable[None]] = []
                for ev in schedule:
                    await asyncio.sleep(max(0.0, t0 + ev.t - time.monotonic()))
                    pending.append(asyncio.ensure_future(chaos.apply(http, ev, t0)))
                await asyncio.gather(*pending)

            bg = [
                asyncio.ensure_future(sampler()),
                asyncio.ensure_future(chaos.supervise(http, lambda: done)),
            ]
            chaos_task = asyncio.ensure_future(run_chaos())
            runs = await asyncio.gather(
                *(
                    drive(http, s, key, tasks, t0, args.client_timeout_s, out)
                    for s, out in zip(stacks, seen, strict=True)
                )
            )
            await chaos_task
            wall_s = time.monotonic() - t0
            for g in gateways:
                g.sample(wall_s)
                g.dump_heap(wall_s)
            done = True
            await asyncio.gather(*bg)
            # the ledger writes without waiting (on PostgreSQL, after a cut, from a buffer)
            await asyncio.sleep(1.0 if not args.postgres else 5.0)
            mismatches, unverifiable, examples = await check_ledger(http, chaos, key, tasks, runs[0])
            rss, fds, lifetimes = _growth_of(chaos.gateways, warmup_s)
            result = {
                "minutes": round(duration_s / 60, 2),
                "seed": args.seed,
                "load": args.load if not args.rps else None,
                "offered_rps": round(rps, 3),
                "fleet": {**asdict(fleet), "nominal_capacity_rps": round(fleet.capacity_rps(), 3)},
                **summarize(chaos, runs[0], wall_s),
                "ledger_mismatches": mismatches,
                "ledger_unverifiable": unverifiable,
                "ledger_mismatch_examples": examples,
                "rss_growth_pct": rss,
                "fd_growth": fds,
                # from when the prefix index was full, in each lifetime long enough to say
                "rss_growth_pct_after_index_full": max(
                    (
                        p["rss_growth_pct_after_index_full"]
                        for p in lifetimes
                        if p["rss_growth_pct_after_index_full"] is not None
                    ),
                    default=None,
                ),
                "gateway_lifetimes": lifetimes,
                "emulator_restarts": sum(e.restarts for e in chaos.emulators),
            }
            if args.replicas > 1 or args.redis or args.postgres:
                result["stack"] = {
                    **shape,
                    "redis_restarts": chaos.redis.restarts if chaos.redis is not None else None,
                }
            if calm is not None:
                calm_summary = summarize(calm, runs[1], wall_s)
                crss, cfds, clifetimes = _growth_of(calm.gateways, warmup_s)
                calm_summary["ledger_mismatches"] = (await check_ledger(http, calm, key, tasks, runs[1]))[0]
                result["fault_free"] = calm_summary
                result["goodput_ratio_vs_fault_free"] = (
                    round(result["goodput_rps"] / calm_summary["goodput_rps"], 4)
                    if calm_summary["goodput_rps"]
                    else None
                )
                # The fleet is the bottleneck by design: the gateway's CPU share says how far it is
                # from its own limit at this load.
                result["calm_gateway_cpu_pct"] = round(
                    sum(sum(g.cpu_s) for g in calm.gateways) / wall_s * 100, 1
                )
                result["calm_rss_growth_pct"] = crss
                result["calm_fd_growth"] = cfds
                result["calm_rss_growth_pct_after_index_full"] = max(
                    (p["rss_growth_pct_after_index_full"] for p in clifetimes if p["index_full_at_s"]),
                    default=None,
                )
                result["calm_gateway_lifetimes"] = clifetimes
            if args.tracemalloc:
                await asyncio.sleep(3.0)  # the last snapshots are being written
                result["heap_growth"] = {g.name: g.heap_growth(warmup_s) for g in gateways}
            counts: dict[str, int] = {}
            for ev in schedule:
                counts[ev.action] = counts.get(ev.action, 0) + 1
            result["chaos_counts"] = counts
            result["chaos_schedule"] = [asdict(ev) for ev in schedule]
            result["workdir"] = str(workdir)
        finally:
            for s in stacks:
                await s.stop()
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=None, help="overrides --minutes (short runs)")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--load", type=float, default=0.7, help="offered load, a share of nominal capacity")
    p.add_argument("--rps", type=float, default=None, help="offered requests per second (overrides --load)")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=40.0)
    p.add_argument("--kv-capacity-tokens", type=int, default=None, help="each emulated instance's KV cache")
    p.add_argument("--chaos-gap-s", type=float, default=20.0, help="mean seconds between faults")
    p.add_argument("--replicas", type=int, default=1, help="gateway replicas (round robin between them)")
    p.add_argument("--redis", action="store_true", help="replicas share a private redis-server")
    p.add_argument("--postgres", action="store_true", help="the ledger on a fresh PostgreSQL database")
    p.add_argument("--no-chaos", dest="chaos", action="store_false")
    p.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the fault-free stack")
    p.add_argument("--client-timeout-s", type=float, default=90.0)
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--workdir", default=None)
    p.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace the gateways' heaps; print what grew after the warm-up (slows the gateway)",
    )
    p.add_argument("--heap-every-s", type=float, default=120.0, help="seconds between heap snapshots")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = run_stoppable(soak(args))  # SIGTERM, as Ctrl-C, stops what the soak started
    except (Terminated, KeyboardInterrupt) as stopped:
        print("soak: stopped before the end; the processes it started are stopped", file=sys.stderr)
        return 143 if isinstance(stopped, Terminated) else 130
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            if k not in ("chaos_schedule", "gateway_lifetimes", "fault_free"):
                print(f"{k}: {v}")
    ok = result.get("lost") == 0 and result.get("ledger_mismatches") == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
