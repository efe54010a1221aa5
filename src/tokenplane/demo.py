"""The main job: a gateway in front of an emulated fleet, driven by agentic users.

``tokenplane up`` starts ``instances`` emulated GPU instances and the gateway as real processes on
loopback ports, then runs ``users`` agentic users through the gateway with the official ``openai``
client. Each user works through tasks of ``steps`` steps: every step streams a completion whose
prompt is the task's whole conversation so far (a shared system prompt, the previous answers and
tool results), so prefixes are shared and grow, as in a coding agent. At the end it prints what
the control plane did: routing decisions by reason, requests per instance, TTFT and the share of
prompt tokens the instances served from their prefix caches. Everything stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.gateway.config import hash_key

MODEL = "llama-3-8b"
WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "kernel",
    "cache",
    "route",
    "batch",
    "token",
    "queue",
    "budget",
    "stream",
    "retry",
    "shard",
    "tensor",
    "prefix",
    "decode",
    "prefill",
    "latency",
    "tenant",
    "window",
)
# A demo fleet is small: trip prefix-affinity's imbalance fallback after a few requests' skew (its
# default, 32, is for fleets serving hundreds of concurrent streams).
ROUTER_PARAMS: dict[str, dict[str, Any]] = {"prefix-affinity": {"balance_abs_threshold": 4}}


@dataclass
class DemoResult:
    requests: int = 0
    errors: int = 0
    tasks_completed: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    wall_s: float = 0.0
    route_reasons: dict[str, int] = field(default_factory=dict)
    per_instance: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def prefix_hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _wait_healthy(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], what: str
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before becoming healthy")
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{what} did not become healthy at {url} within 60 s")


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    fh = log.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", *args], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


async def _user(
    client: Any,
    uid: int,
    *,
    tasks: int,
    steps: int,
    system: str,
    max_tokens: int,
    seed: int,
    out: DemoResult,
    ttfts: list[float],
) -> None:
    rng = random.Random(f"{seed}:{uid}")
    for task in range(tasks):
        messages: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {uid}.{task}: " + _words(rng, 120)},
        ]
        ok = True
        for step in range(1, steps + 1):
            started = time.perf_counter()
            first: float | None = None
            text: list[str] = []
            try:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers={
                        "x-tokenplane-workflow-id": f"user{uid}-task{task}",
                        "x-tokenplane-step": str(step),
                        "x-tokenplane-total-steps": str(steps),
                    },
                )
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        if first is None:
                            first = time.perf_counter() - started
                        text.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        out.prompt_tokens += chunk.usage.prompt_tokens
                        out.output_tokens += chunk.usage.completion_tokens
                        details = getattr(chunk.usage, "prompt_tokens_details", None)
                        out.cached_tokens += getattr(details, "cached_tokens", 0) or 0
            except Exception:  # any failure of a step is counted; the user moves on to the next task
                out.requests += 1
                out.errors += 1
                ok = False
                break
            out.requests += 1
            if first is not None:
                ttfts.append(first)
            messages.append({"role": "assistant", "content": "".join(text)})
            messages.append({"role": "user", "content": "Tool result: " + _words(rng, rng.randint(40, 160))})
            await asyncio.sleep(rng.uniform(0.05, 0.3))  # the tool runs, the agent thinks
        if ok:
            out.tasks_completed += 1


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


async def route_reasons(session: aiohttp.ClientSession, gateway: str) -> dict[str, int]:
    """The gateway's routing decisions by reason, from its ``tokenplane_requests_total`` counter."""
    async with session.get(gateway + "/metrics") as r:
        text = await r.text()
    reasons: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text):
        if fam.name == "tokenplane_requests":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    reasons[s.labels.get("reason", "none")] += int(s.value)
    return dict(sorted(reasons.items()))


async def _collect(session: aiohttp.ClientSession, gateway: str, result: DemoResult) -> None:
    result.route_reasons = await route_reasons(session, gateway)
    async with session.get(gateway + "/v1/instances") as r:
        instances = await r.json()
    for inst in instances.get("data", []):
        result.per_instance[inst["instance_id"]] = {
            "url": inst.get("url"),
            "prefix_cache_hits": inst.get("prefix_cache_hits"),
            "prefix_cache_queries": inst.get("prefix_cache_queries"),
            "healthy": inst.get("healthy"),
        }
    for iid, info in result.per_instance.items():
        async with session.get(str(info["url"]) + "/metrics") as r:
            text = await r.text()
        for fam in text_string_to_metric_families(text):
            if fam.name == "vllm:request_success":
                info["requests"] = int(sum(s.value for s in fam.samples if s.name.endswith("_total")))
        result.per_instance[iid] = info


@dataclass
class EmulatorProc:
    """One emulated instance of a :class:`Stack`: its gateway id, URL, and the process serving it."""

    instance_id: str
    url: str
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes]


@dataclass
class Stack:
    """Emulators and a gateway running as processes; ``key`` is the demo tenant's API key."""

    gateway: str
    key: str
    emulators: list[EmulatorProc]
    procs: list[subprocess.Popen[bytes]]

    def kill(self, index: int) -> None:
        """SIGKILL emulator ``index`` (a GPU lost with everything in flight)."""
        em = self.emulators[index]
        if em.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(em.proc.pid, signal.SIGKILL)
            em.proc.wait()

    def restart(self, index: int) -> subprocess.Popen[bytes]:
        """Start emulator ``index`` again on its port (a replacement: empty caches)."""
        em = self.emulators[index]
        em.proc = _spawn(em.args, em.log)
        self.procs.append(em.proc)
        return em.proc


@contextlib.asynccontextmanager
async def start_stack(
    session: aiohttp.ClientSession,
    workdir: Path,
    *,
    instances: int,
    gpu: str = "H100",
    router: Any = "prefix-affinity",
    speed: float = 1.0,
    seed: int = 7,
    model: str = MODEL,
    emulator_args: list[str] | None = None,
    gateway_config: dict[str, Any] | None = None,
    tenant: dict[str, Any] | None = None,
) -> AsyncIterator[Stack]:
    """``instances`` emulators (extra ``emulator_args`` each) and ``tokenplane serve`` in front of
    them, healthy on loopback ports; all stopped on exit. ``router`` is the model's router entry (a
    name or ``{name, params}``); ``gateway_config`` is merged into the gateway's config at top level,
    ``tenant`` into the one tenant's entry. The gateway serves ``model`` as ``MODEL``."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        emulators = []
        for i in range(instances):
            port = _free_port()
            args = [
                "tokenplane.emulator",
                "--port",
                str(port),
                "--gpu",
                gpu,
                "--model",
                model,
                "--served-model-name",
                MODEL,
                "--speed",
                str(speed),
                "--seed",
                str(seed + i),
                *(emulator_args or []),
            ]
            log = workdir / f"emulator-{i}.log"
            proc = _spawn(args, log)
            procs.append(proc)
            emulators.append(EmulatorProc(f"{gpu.lower()}-{i}", f"http://127.0.0.1:{port}", args, log, proc))
        key = "tp-demo-" + secrets.token_hex(8)
        gw_port = _free_port()
        route = router
        if not isinstance(router, dict):
            route = {"name": router, "params": ROUTER_PARAMS.get(router, {})}
        config: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": gw_port},
            "tenants": [
                {"name": "demo", "priority": "interactive", "api_keys": [hash_key(key)], **(tenant or {})}
            ],
            "models": [{"name": MODEL, "aliases": ["demo"], "router": route}],
            "instances": [
                {"id": em.instance_id, "url": em.url, "model": MODEL, "kind": "emulated", "gpu": gpu}
                for em in emulators
            ],
            "scrape": {"interval_s": 0.5},
            "health": {"interval_s": 1.0},
            **(gateway_config or {}),
        }
        cfg_path = workdir / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        gateway = f"http://127.0.0.1:{gw_port}"
        gw = _spawn(["tokenplane", "serve", str(cfg_path)], workdir / "gateway.log")
        procs.append(gw)
        for em in emulators:
            await _wait_healthy(session, em.url, em.proc, f"emulator {em.url}")
        await _wait_healthy(session, gateway, gw, "gateway")
        yield Stack(gateway, key, emulators, procs)
    finally:
        _stop(procs)


async def run_demo(
    *,
    instances: int = 4,
    users: int = 8,
    tasks: int = 1,
    steps: int = 5,
    max_tokens: int = 48,
    speed: float = 1.0,
    router: str = "prefix-affinity",
    gpu: str = "H100",
    seed: int = 7,
    workdir: Path | None = None,
) -> DemoResult:
    """Bring the fleet and the gateway up, drive the users, collect the figures, tear down."""
    import openai

    tmp = Path(workdir or tempfile.mkdtemp(prefix="tokenplane-up-"))
    tmp.mkdir(parents=True, exist_ok=True)
    result = DemoResult()
    started = time.perf_counter()
    stack_args: dict[str, Any] = {"instances": instances, "gpu": gpu, "router": router, "seed": seed}
    async with aiohttp.ClientSession() as session, start_stack(session, tmp, speed=speed, **stack_args) as st:
        gateway, stack = st.gateway, st
        client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=stack.key, max_retries=0, timeout=60)
        system = "You are a careful coding agent. " + _words(random.Random(seed), 900)
        ttfts: list[float] = []
        await asyncio.gather(
            *(
                _user(
                    client,
                    u,
                    tasks=tasks,
                    steps=steps,
                    system=system,
                    max_tokens=max_tokens,
                    seed=seed,
                    out=result,
                    ttfts=ttfts,
                )
                for u in range(users)
            )
        )
        await client.close()
        result.ttft_p50_s = _percentile(ttfts, 50)
        result.ttft_p99_s = _percentile(ttfts, 99)
        await _collect(session, gateway, result)
    result.wall_s = time.perf_counter() - started
    return result


def print_result(result: DemoResult, console: Any) -> None:
    from rich.table import Table

    console.print(
        f"[bold]{result.requests}[/] requests ({result.errors} failed), "
        f"{result.tasks_completed} tasks completed, in {result.wall_s:.1f} s"
    )
    ttft50 = "-" if result.ttft_p50_s is None else f"{result.ttft_p50_s * 1000:.0f} ms"
    ttft99 = "-" if result.ttft_p99_s is None else f"{result.ttft_p99_s * 1000:.0f} ms"
    console.print(
        f"TTFT p50 {ttft50}, p99 {ttft99}; prompt tokens served from prefix caches: "
        f"{result.cached_tokens:,} of {result.prompt_tokens:,} ({result.prefix_hit_ratio:.0%})"
    )
    reasons = Table(title="routing decisions by reason")
    reasons.add_column("reason")
    reasons.add_column("requests", justify="right")
    for reason, n in result.route_reasons.items():
        reasons.add_row(reason, str(n))
    console.print(reasons)
    inst = Table(title="instances")
    for col in ("instance", "requests", "prefix-cache hit tokens", "queried tokens"):
        inst.add_column(col, justify="left" if col == "instance" else "right")
    for iid, info in result.per_instance.items():
        inst.add_row(
            iid,
            str(info.get("requests", "-")),
            str(info.get("prefix_cache_hits", "-")),
            str(info.get("prefix_cache_queries", "-")),
        )
    console.print(inst)


def write_result(result: DemoResult, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "up.json"
    data = asdict(result) | {"prefix_hit_ratio": result.prefix_hit_ratio}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
