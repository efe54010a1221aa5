"""What the gateway adds: CPU per request and latency, against a bare aiohttp proxy and direct access.

Three kinds of separate processes, on the same fake upstreams, side by side in one run:

* a fast fake OpenAI upstream (``_fake_upstream.py``, raw asyncio protocol) listening on 4 ports
  (4 "instances"), answering JSON or SSE streams of ``--chunks`` events (zero delay, or
  ``--decode-ms`` between events in the decode-like scenario);
* the proxies under test: a bare aiohttp reverse proxy (``_bare_proxy.py``, round-robin, no parsing:
  the baseline), the floor (``_floor_proxy.py``: a raw asyncio protocol server over tokenplane's own
  upstream client, what the transport alone costs in Python here) and ``tokenplane serve`` with a
  generated config (prefix-affinity routing over the 4 instances, one tenant with a hashed key and
  a concurrency limit, scraping and health checks on); with ``--routers``, also the Rust routers
  (sglang-router, vllm-router) with their cache-aware policy;
* a closed-loop load generator (this file with ``--_loadgen``) at a fixed concurrency, one
  keep-alive connection per worker. It is a raw asyncio protocol client rather than aiohttp: it
  shares a core with the upstream, and at 256 decode-like streams it reads ~25,000 chunks a second,
  which an aiohttp client could not do on a fraction of a core without queueing and thereby
  inflating the latencies measured. Prompts are distinct (a request counter in the user message)
  with shared prefixes (16 system prompts).

Pinning (where ``os.sched_setaffinity`` works and there are 2+ CPUs): upstream and load generator on
one CPU, the proxies on another, so the proxy under test has a core to itself.

For every scenario the load generator runs direct → bare proxy → floor → gateway, each for a warm-up and
then a measurement window. Measured in the window: completed requests, requests/s, TTFT and total
latency p50/p99 (client side), and the proxy process's CPU seconds (``utime + stime`` from
``/proc/<pid>/stat``) divided by the requests completed. "Added" latency is through-proxy minus
direct, at the same percentile.

Scenarios: ``ns-c1``, ``ns-c32``, ``ns-c256`` (non-stream), ``s-c1``, ``s-c32``, ``s-c256`` (streams
of ``--chunks`` events, zero delay), ``decode-c256`` (streams with ``--decode-ms`` between events).
``--quick`` runs ``ns-c1``, ``ns-c32``, ``s-c1``, ``decode-c256`` with short windows (~30 s).

Usage::

    python bench/gateway_overhead.py            # a table (~2.5 minutes)
    python bench/gateway_overhead.py --quick    # ~30 s
    python bench/gateway_overhead.py --json     # one JSON object keyed by scenario, plus "summary"
    git worktree add /tmp/base HEAD~5 && python bench/gateway_overhead.py --baseline-src /tmp/base
        # also that commit's gateway, measured just before and just after this one (A/B ratio)
    python bench/gateway_overhead.py --scenarios ns-c32 --baseline-src /tmp/base --ab-rounds 8 --window 3
        # and 8 interleaved rounds of the gateway, the bare proxy and the baseline: the median of
        # the per-round ratios (gateway/bare, gateway/baseline)
    python bench/gateway_overhead.py --scenarios ns-c32,decode-c256 --server-split
        # also aiohttp's server over tokenplane's client: where the gateway's CPU goes
    python -m venv /tmp/rvenv && /tmp/rvenv/bin/pip install sglang-router vllm-router
    python bench/gateway_overhead.py --scenarios ns-c32,decode-c256 \
        --routers /tmp/rvenv/bin/sglang-router,/tmp/rvenv/bin/vllm-router
        # also the Rust routers in front of the same upstreams (cache-aware policy), just before
        # the gateway: "within 2x of the Rust routers" measured on this machine, in this run
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _proc_cpu import proc_cpu_s  # noqa: E402  (re-exported: other benches import it from here)

MODEL = "bench-model"
API_KEY = "sk-bench-0123456789"
N_UPSTREAMS = 4
N_PREFIXES = 16

FULL = ["ns-c1", "ns-c32", "ns-c256", "s-c1", "s-c32", "s-c256", "decode-c256"]
QUICK = ["ns-c1", "ns-c32", "s-c1", "decode-c256"]


def _scenario(name: str) -> tuple[str, int]:
    kind, c = name.split("-c")
    return kind, int(c)


# ---------------------------------------------------------------------------------------------
# Load generator (runs in its own process)
# ---------------------------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 client connection: send a request, parse one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.fut: asyncio.Future[tuple[bool, float, float]] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("connection lost"))

    def send(self, data: bytes) -> asyncio.Future[tuple[bool, float, float]]:
        assert self.transport is not None
        self.fut = asyncio.get_running_loop().create_future()
        self.headers_done = False
        self.status_ok = False
        self.length = -1
        self.first = 0.0
        self.last = b""
        self.transport.write(data)
        return self.fut

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self.buf
        buf += data
        if self.fut is None:
            return
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            self.status_ok = head[9:12] == b"200"
            i = head.find(b"content-length:")
            if i >= 0:
                j = head.find(b"\r\n", i)
                self.length = int(head[i + 15 : j if j >= 0 else len(head)])
            del buf[: end + 4]
            self.headers_done = True
        if self.length >= 0:
            if len(buf) < self.length:
                return
            ok = self.status_ok and buf[:1] == b"{"
            del buf[: self.length]
            self._finish(ok, now, now)
            return
        pos = 0
        while True:  # chunked
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol], 16)
            if len(buf) < eol + 2 + size + 2:
                break
            if size == 0:
                del buf[: eol + 4]
                ok = self.status_ok and self.last.endswith(b"data: [DONE]\n\n")
                self._finish(ok, self.first or now, now)
                return
            if not self.first:
                self.first = now
            self.last = bytes(buf[eol + 2 : eol + 2 + size])
            pos = eol + 4 + size
        if pos:
            del buf[:pos]

    def _finish(self, ok: bool, first: float, end: float) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_result((ok, first, end))


def _bodies(stream: bool, prompt_chars: int) -> tuple[list[bytes], bytes]:
    """Per shared prefix, the body up to the request counter; and the body after it."""
    import msgspec

    heads = []
    tail = b""
    for k in range(N_PREFIXES):
        system = (f"You are assistant #{k}. " + "Follow the house rules carefully. " * 64)[:prompt_chars]
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "Question @@N@@: summarise the previous answer in one line."},
            ],
            "max_tokens": 64,
            "temperature": 0.7,
        }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        head, tail = msgspec.json.encode(body).split(b"@@N@@")
        heads.append(head)
    return heads, tail


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _request_head(auth: bool) -> bytes:
    """The load generator's request line and headers, without Content-Length."""
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + (
        b"Authorization: Bearer " + API_KEY.encode() + b"\r\n" if auth else b""
    )


def _request(head: bytes, heads: list[bytes], tail: bytes, n: int) -> bytes:
    """Request number ``n`` as it goes on the wire: shared prefix ``n % N_PREFIXES``, its own suffix."""
    body = heads[n % N_PREFIXES] + str(n).encode() + tail
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def _run_target(target: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    kind, conc = _scenario(spec["scenario"])
    heads, tail = _bodies(kind != "ns", spec["prompt_chars"])
    req_head = _request_head(target["auth"])
    counter = itertools.count()
    loop = asyncio.get_running_loop()
    state = {"measuring": False, "stop": False}
    ttft: list[float] = []
    total: list[float] = []
    errors = [0]
    ports = target["ports"]

    async def worker(i: int) -> None:
        conn: _Conn | None = None
        # Spread the first requests over one stream's duration, so that long streams do not run
        # in synchronised waves (a window would then catch a biased share of them).
        await asyncio.sleep(spec["stagger_s"] * i / conc)
        while not state["stop"]:
            if conn is None or conn.lost:
                _, conn = await loop.create_connection(_Conn, "127.0.0.1", ports[i % len(ports)])
                conn.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
            data = _request(req_head, heads, tail, next(counter))
            t0 = time.perf_counter()
            try:
                ok, first, end = await conn.send(data)
            except ConnectionError:
                ok, first, end = False, 0.0, 0.0
                conn = None
            if state["measuring"]:
                if ok:
                    ttft.append(first - t0)
                    total.append(end - t0)
                else:
                    errors[0] += 1
            if not ok and state["stop"] is False:
                await asyncio.sleep(0.01)
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    tasks = [asyncio.create_task(worker(i)) for i in range(conc)]
    await asyncio.sleep(spec["warmup_s"])
    pid = target["pid"]
    cpu0 = proc_cpu_s(pid)
    t0 = time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(spec["window_s"])
    state["measuring"] = False
    cpu1 = proc_cpu_s(pid)
    wall = time.perf_counter() - t0
    state["stop"] = True
    _, pending = await asyncio.wait(tasks, timeout=2.0)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    n = len(total)
    ms = 1000.0
    return {
        "requests": n,
        "errors": errors[0],
        "rps": n / wall,
        "cpu_s": cpu1 - cpu0,
        "cpu_ms_per_req": (cpu1 - cpu0) * ms / n if n else float("nan"),
        "ttft_p50_ms": _pct(ttft, 0.5) * ms,
        "ttft_p99_ms": _pct(ttft, 0.99) * ms,
        "total_p50_ms": _pct(total, 0.5) * ms,
        "total_p99_ms": _pct(total, 0.99) * ms,
    }


async def _loadgen(spec: dict[str, Any]) -> None:
    out = {}
    for target in spec["targets"]:
        out[target["name"]] = await _run_target(target, spec)
        await asyncio.sleep(0.3)  # let the proxy notice closed connections before the next target
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _cpus() -> tuple[int | None, int | None]:
    """(CPU for upstream + load generator, CPU for the proxies), or Nones when pinning is impossible."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def _spawn(args: list[str], cpu: int | None, **kw: Any) -> subprocess.Popen[bytes]:
    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    return subprocess.Popen(args, preexec_fn=pin, **kw)


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


ROUTERS = ("sglang-router", "vllm-router")


def _router_argv(path: Path, port: int, metrics_port: int, urls: list[str], policy: str) -> list[str]:
    """The command line of a Rust router (by its executable's name) in front of ``urls``, quiet,
    with its Prometheus exporter on a port of its own (both default to 29000)."""
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls, "--policy", policy]
    common += ["--prometheus-port", str(metrics_port)]
    if path.name == "sglang-router":
        return [str(path), "launch", *common, "--log-level", "warn"]
    return [str(path), *common, "--log-level", "warning"]


def _gateway_config(upstream_ports: list[int], port: int) -> dict[str, Any]:
    from tokenplane.gateway.config import hash_key

    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "tenants": [
            {
                "name": "bench",
                "priority": "interactive",
                "api_keys": [hash_key(API_KEY)],
                "max_concurrency": 4096,
            }
        ],
        "models": [{"name": MODEL, "router": {"name": "prefix-affinity"}}],
        "instances": [
            {
                "id": f"up-{i}",
                "url": f"http://127.0.0.1:{p}",
                "model": MODEL,
                "kind": "vllm",
                "gpu": "H100",
                "price_per_hour": 2.5,
            }
            for i, p in enumerate(upstream_ports)
        ],
        "scrape": {"interval_s": 1.0},
        "health": {"interval_s": 2.0},
    }


class Fleet:
    """The upstream process (for one upstream setting) and both proxies in front of it."""

    def __init__(
        self,
        chunks: int,
        delay_ms: float,
        cpus: tuple[int | None, int | None],
        tmp: Path,
        baseline_src: Path | None = None,
        server_split: bool = False,
        ab_rounds: int = 1,
        routers: list[Path] | None = None,
        router_policy: str = "cache_aware",
    ) -> None:
        import yaml

        lg_cpu, proxy_cpu = cpus
        self.ab_rounds = ab_rounds
        py = sys.executable
        self.up_ports = _free_ports(N_UPSTREAMS)
        self.bare_port, self.floor_port, self.gw_port = _free_ports(3)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.upstream = _spawn(
            [py, str(HERE / "_fake_upstream.py"), "--ports", ",".join(map(str, self.up_ports)),
             "--chunks", str(chunks), "--delay-ms", str(delay_ms)],
            lg_cpu, **quiet,
        )  # fmt: skip
        urls = ",".join(f"http://127.0.0.1:{p}" for p in self.up_ports)
        self.bare = _spawn(
            [py, str(HERE / "_bare_proxy.py"), "--port", str(self.bare_port), "--upstreams", urls],
            proxy_cpu, **quiet,
        )  # fmt: skip
        self.floor = _spawn(
            [py, str(HERE / "_floor_proxy.py"), "--port", str(self.floor_port), "--upstreams", urls],
            proxy_cpu, **quiet,
        )  # fmt: skip
        cfg = tmp / f"gateway-{self.gw_port}.yaml"
        cfg.write_text(yaml.safe_dump(_gateway_config(self.up_ports, self.gw_port)))
        cli = Path(py).parent / "tokenplane"
        serve = [str(cli)] if cli.exists() else [py, "-c", "from tokenplane.cli import main; main()"]
        self.gateway = _spawn([*serve, "serve", str(cfg)], proxy_cpu, **quiet)
        self.procs = [self.upstream, self.bare, self.floor, self.gateway]
        self.server: subprocess.Popen[bytes] | None = None
        post_only = [(self.bare_port, self.bare), (self.floor_port, self.floor)]
        if server_split:  # aiohttp's server over tokenplane's client: the framework's share
            self.server_port = _free_ports(1)[0]
            self.server = _spawn(
                [py, str(HERE / "_bare_proxy.py"), "--port", str(self.server_port), "--upstreams", urls,
                 "--client", "tokenplane"],
                proxy_cpu, **quiet,
            )  # fmt: skip
            self.procs.append(self.server)
            post_only.append((self.server_port, self.server))
        self.routers: list[tuple[str, int, subprocess.Popen[bytes]]] = []
        for path in routers or []:
            port, metrics_port = _free_ports(2)
            argv = _router_argv(path, port, metrics_port, urls.split(","), router_policy)
            proc = _spawn(argv, proxy_cpu, **quiet)
            self.routers.append((path.name, port, proc))
            self.procs.append(proc)
            post_only.append((port, proc))
        self.baseline: subprocess.Popen[bytes] | None = None
        if baseline_src is not None:  # the same gateway config, served by another source tree
            self.bl_port = _free_ports(1)[0]
            bl_cfg = tmp / f"gateway-{self.bl_port}.yaml"
            bl_cfg.write_text(yaml.safe_dump(_gateway_config(self.up_ports, self.bl_port)))
            env = {**os.environ, "PYTHONPATH": str(baseline_src / "src")}
            self.baseline = _spawn([*serve, "serve", str(bl_cfg)], proxy_cpu, env=env, **quiet)
            self.procs.append(self.baseline)
        try:
            _wait_http(f"http://127.0.0.1:{self.up_ports[0]}/health", self.upstream)
            _wait_http(f"http://127.0.0.1:{self.gw_port}/health", self.gateway)
            if self.baseline is not None:
                _wait_http(f"http://127.0.0.1:{self.bl_port}/health", self.baseline)
            # the bare and floor proxies answer POST only: wait for their ports to accept
            for port, proc in post_only:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise
                        time.sleep(0.1)
        except BaseException:
            self.close()
            raise

    def targets(self) -> list[dict[str, Any]]:
        bare = {"name": "bare", "ports": [self.bare_port], "pid": self.bare.pid, "auth": False}
        out = [
            {"name": "direct", "ports": self.up_ports, "pid": self.upstream.pid, "auth": False},
            bare,
            {"name": "floor", "ports": [self.floor_port], "pid": self.floor.pid, "auth": False},
        ]
        if self.server is not None:
            out.append(
                {"name": "aio-server", "ports": [self.server_port], "pid": self.server.pid, "auth": False}
            )
        partners = [bare]  # what the gateway is compared with in interleaved rounds
        for name, port, proc in self.routers:  # just before the gateway: the least drift between them
            router = {"name": name, "ports": [port], "pid": proc.pid, "auth": False}
            out.append(router)
            partners.append(router)
        gateway = {"name": "gateway", "ports": [self.gw_port], "pid": self.gateway.pid, "auth": True}
        around: list[dict[str, Any]] = []
        if self.baseline is not None:
            baseline = {"name": "baseline", "ports": [self.bl_port], "pid": self.baseline.pid, "auth": True}
            out.append(baseline)
            around.append(dict(baseline, name="baseline2"))
            partners.insert(0, baseline)
        rounds = []
        for i in range(self.ab_rounds if self.ab_rounds > 1 else 0):  # order alternating
            group = [dict(t, name=f"ab-{t['name']}-{i}") for t in partners]
            group.append(dict(gateway, name=f"ab-gateway-{i}"))
            rounds += group if i % 2 == 0 else group[::-1]
        return [*out, gateway, *around, *rounds]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _run_scenario(
    fleet: Fleet,
    scenario: str,
    warmup_s: float,
    window_s: float,
    prompt_chars: int,
    lg_cpu: int | None,
    chunks: int,
    decode_ms: float,
) -> dict[str, Any]:
    kind = _scenario(scenario)[0]
    stagger = chunks * decode_ms / 1000 if kind == "decode" else 0.0
    if kind == "decode":  # long streams: a window of several stream durations, after a full ramp
        warmup = max(warmup_s, stagger + 0.5)
        window = max(window_s, 6 * stagger)
    else:
        warmup, window = warmup_s, window_s
    spec = {
        "scenario": scenario,
        "stagger_s": stagger,
        "targets": fleet.targets(),
        "warmup_s": warmup,
        "window_s": window,
        "prompt_chars": prompt_chars,
    }
    p = _spawn(
        [sys.executable, str(Path(__file__).resolve()), "--_loadgen", json.dumps(spec)],
        lg_cpu,
        stdout=subprocess.PIPE,
    )
    out, _ = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"load generator failed for {scenario}")
    return dict(json.loads(out))


def _summarise(name: str, r: dict[str, Any]) -> dict[str, Any]:
    d, b, f, g = r["direct"], r["bare"], r["floor"], r["gateway"]
    out: dict[str, Any] = {
        "rps": g["rps"],
        "errors": g["errors"],
        "gateway_cpu_ms_per_req": g["cpu_ms_per_req"],
        "bare_cpu_ms_per_req": b["cpu_ms_per_req"],
        "cpu_ratio_gateway_over_bare": g["cpu_ms_per_req"] / b["cpu_ms_per_req"],
        "floor_cpu_ms_per_req": f["cpu_ms_per_req"],
    }
    for router in ROUTERS:
        if router in r:
            key = router.replace("-", "_")
            out[f"{key}_cpu_ms_per_req"] = r[router]["cpu_ms_per_req"]
            out[f"cpu_ratio_gateway_over_{key}"] = g["cpu_ms_per_req"] / r[router]["cpu_ms_per_req"]
    if "baseline" in r:  # measured before and after the gateway: drift on both sides
        bl = (r["baseline"]["cpu_ms_per_req"] + r["baseline2"]["cpu_ms_per_req"]) / 2
        out["baseline_cpu_ms_per_req"] = bl
        out["cpu_ratio_gateway_over_baseline"] = g["cpu_ms_per_req"] / bl
    if "ab-gateway-0" in r:  # --ab-rounds: one ratio per round, each from a side-by-side pair
        n = sum(1 for k in r if k.startswith("ab-gateway-"))
        gw = [r[f"ab-gateway-{i}"]["cpu_ms_per_req"] for i in range(n)]
        out["ab_rounds"] = n
        out["ab_gateway_cpu_ms_per_req_median"] = statistics.median(gw)
        for partner in ("baseline", "bare", *ROUTERS):
            if f"ab-{partner}-0" not in r:
                continue
            key = partner.replace("-", "_")
            other = [r[f"ab-{partner}-{i}"]["cpu_ms_per_req"] for i in range(n)]
            ratios = [x / y for x, y in zip(gw, other, strict=True)]
            out[f"ab_{key}_cpu_ms_per_req_median"] = statistics.median(other)
            out[f"cpu_ratio_gateway_over_{key}_median"] = statistics.median(ratios)
            out[f"cpu_ratio_gateway_over_{key}_min_max"] = (min(ratios), max(ratios))
    proxies = [("", g), ("bare_", b), ("floor_", f)]
    proxies += [(f"{t.replace('-', '_')}_", r[t]) for t in ROUTERS if t in r]
    for who, x in proxies:
        for m in ("ttft", "total"):
            for q in ("p50", "p99"):
                out[f"{who}added_{m}_{q}_ms"] = x[f"{m}_{q}_ms"] - d[f"{m}_{q}_ms"]
    out["raw"] = r
    return out


def _partner_figures(f: dict[str, float], s: dict[str, Any], unit: str, suffix: str) -> None:
    """The Rust routers', the baseline's and the bare proxy's CPU, and the gateway's over theirs,
    under flat names."""
    for key in ("baseline", "bare", *(t.replace("-", "_") for t in ROUTERS)):
        ratio = f"cpu_ratio_gateway_over_{key}"
        if f"{key}_cpu_ms_per_req" in s:
            f[f"{key}_cpu_ms_per_{unit}_{suffix}"] = s[f"{key}_cpu_ms_per_req"]
            f[f"{ratio}_{suffix}"] = s[ratio]
        if f"{ratio}_median" in s:
            f[f"{ratio}_{suffix}_rounds_median"] = s[f"{ratio}_median"]


def _flat(res: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The headline figures of the issue's acceptance list, under flat names."""
    f: dict[str, float] = {}
    if "ns-c32" in res:
        s = res["ns-c32"]
        f["gateway_cpu_ms_per_req_c32"] = s["gateway_cpu_ms_per_req"]
        f["bare_cpu_ms_per_req_c32"] = s["bare_cpu_ms_per_req"]
        f["cpu_ratio_gateway_over_bare_c32"] = s["cpu_ratio_gateway_over_bare"]
        f["floor_cpu_ms_per_req_c32"] = s["floor_cpu_ms_per_req"]
        _partner_figures(f, s, "req", "c32")
    if "decode-c256" in res:
        s = res["decode-c256"]
        f["gateway_cpu_ms_per_stream_c256"] = s["gateway_cpu_ms_per_req"]
        f["bare_cpu_ms_per_stream_c256"] = s["bare_cpu_ms_per_req"]
        f["cpu_ratio_gateway_over_bare_stream_c256"] = s["cpu_ratio_gateway_over_bare"]
        f["floor_cpu_ms_per_stream_c256"] = s["floor_cpu_ms_per_req"]
        _partner_figures(f, s, "stream", "stream_c256")
        f["gateway_added_p99_ms_c256_stream"] = s["added_total_p99_ms"]
        f["bare_added_p99_ms_c256_stream"] = s["bare_added_total_p99_ms"]
    if "ns-c1" in res:
        f["gateway_added_p50_ms_c1"] = res["ns-c1"]["added_total_p50_ms"]
        f["bare_added_p50_ms_c1"] = res["ns-c1"]["bare_added_total_p50_ms"]
    if "s-c1" in res:
        f["gateway_added_ttft_p50_ms_c1"] = res["s-c1"]["added_ttft_p50_ms"]
        f["bare_added_ttft_p50_ms_c1"] = res["s-c1"]["bare_added_ttft_p50_ms"]
    return f


def _table(res: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    heads = ("req/s", "err", "cpu ms/req", "ttft p50", "ttft p99", "tot p50", "tot p99")
    heads += ("+ttft p50", "+tot p50", "+tot p99")
    cols = f"{'scenario':<12} {'target':<13} {'req':>7} " + " ".join(f"{h:>10}" for h in heads)
    lines = [
        f"gateway overhead: {N_UPSTREAMS} fake upstreams, {settings['chunks']} events per stream, "
        f"decode {settings['decode_ms']} ms/event, pinning {settings['pinning']}; latencies in ms, "
        "'+' = added over direct",
        cols,
    ]
    for name, s in res.items():
        raw = s["raw"]
        for t in raw:
            x = raw[t]
            added = ["", "", ""]
            pre = "" if t == "gateway" else f"{t.replace('-', '_')}_"
            keys = ("added_ttft_p50_ms", "added_total_p50_ms", "added_total_p99_ms")
            if t != "direct" and pre + keys[0] in s:
                added = [f"{s[pre + k]:.3f}" for k in keys]
            nums = [x["rps"], x["errors"], x["cpu_ms_per_req"], x["ttft_p50_ms"], x["ttft_p99_ms"]]
            nums += [x["total_p50_ms"], x["total_p99_ms"]]
            cells = [f"{nums[0]:>10.0f}", f"{nums[1]:>10}"] + [f"{v:>10.3f}" for v in nums[2:]]
            lines.append(
                f"{name:<12} {t:<13} {x['requests']:>7} " + " ".join(cells + [f"{v:>10}" for v in added])
            )
        lines.append(f"{'':<12} gateway/bare CPU ratio {s['cpu_ratio_gateway_over_bare']:.2f}")
        for router in ROUTERS:
            key = router.replace("-", "_")
            if f"cpu_ratio_gateway_over_{key}" in s:
                lines.append(f"{'':<12} gateway/{router} CPU ratio {s[f'cpu_ratio_gateway_over_{key}']:.2f}")
        if "cpu_ratio_gateway_over_baseline" in s:
            lines.append(f"{'':<12} gateway/baseline CPU ratio {s['cpu_ratio_gateway_over_baseline']:.3f}")
        for partner in ("baseline", "bare", *ROUTERS) if "ab_rounds" in s else ():
            key = partner.replace("-", "_")
            if f"cpu_ratio_gateway_over_{key}_median" not in s:
                continue
            lo, hi = s[f"cpu_ratio_gateway_over_{key}_min_max"]
            other, gw_med = s[f"ab_{key}_cpu_ms_per_req_median"], s["ab_gateway_cpu_ms_per_req_median"]
            lines.append(
                f"{'':<12} {s['ab_rounds']} interleaved rounds: CPU ms/req median {partner} "
                f"{other:.3f}, gateway {gw_med:.3f}; "
                f"gateway/{partner} per round median {s[f'cpu_ratio_gateway_over_{key}_median']:.3f} "
                f"(min {lo:.3f}, max {hi:.3f})"
            )
    flat = _flat(res)
    lines.append("")
    lines.extend(f"{k} = {v:.3f}" for k, v in flat.items())
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="4 scenarios, short windows (~30 s)")
    p.add_argument("--scenarios", help=f"comma-separated subset of {','.join(FULL)}")
    p.add_argument("--window", type=float, help="measurement seconds per target (default 4, quick 1.5)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per target (default 1, quick 0.8)")
    p.add_argument("--chunks", type=int, default=64, help="token events per stream")
    p.add_argument("--decode-ms", type=float, default=10.0, help="ms between events in decode scenarios")
    p.add_argument("--prompt-chars", type=int, default=1200, help="length of the shared system prompt")
    p.add_argument(
        "--baseline-src",
        type=Path,
        help="another checkout (e.g. a git worktree of an older commit): its gateway is measured "
        "just before and just after this one, side by side, for a gateway/baseline CPU ratio",
    )
    p.add_argument(
        "--server-split",
        action="store_true",
        help="also measure aiohttp's server over tokenplane's upstream client (target aio-server): "
        "aio-server minus floor is the server framework, gateway minus aio-server the gateway's own work",
    )
    p.add_argument(
        "--ab-rounds",
        type=int,
        default=1,
        help="also N interleaved rounds of the gateway and the bare aiohttp proxy (and of the "
        "baseline and the routers when given), order alternating, and the median of the per-round "
        "CPU ratios (robust to a noisy machine's drift)",
    )
    p.add_argument(
        "--routers",
        help="comma-separated paths of Rust router executables (sglang-router, vllm-router; "
        "pip install them into a separate venv): each is measured in front of the same upstreams",
    )
    p.add_argument(
        "--router-policy",
        default="cache_aware",
        help="the routers' --policy (default cache_aware, the counterpart of prefix-affinity routing)",
    )
    p.add_argument("--_loadgen", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._loadgen:
        import uvloop

        uvloop.run(_loadgen(json.loads(a._loadgen)))
        return
    scenarios = a.scenarios.split(",") if a.scenarios else (QUICK if a.quick else FULL)
    unknown = set(scenarios) - set(FULL)
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)}")
    routers = [Path(x) for x in a.routers.split(",")] if a.routers else []
    for path in routers:
        if path.name not in ROUTERS or not os.access(path, os.X_OK):
            p.error(f"--routers: {path} is not an executable named one of {', '.join(ROUTERS)}")
    window = a.window if a.window is not None else (1.5 if a.quick else 4.0)
    warmup = a.warmup if a.warmup is not None else (0.8 if a.quick else 1.0)
    cpus = _cpus()
    settings = {
        "chunks": a.chunks,
        "decode_ms": a.decode_ms,
        "prompt_chars": a.prompt_chars,
        "window_s": window,
        "warmup_s": warmup,
        "pinning": "off" if cpus[0] is None else f"upstream+loadgen cpu {cpus[0]}, proxies cpu {cpus[1]}",
    }
    res: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fleets: dict[float, Fleet] = {}
        try:
            for name in scenarios:
                kind = _scenario(name)[0]
                delay = a.decode_ms if kind == "decode" else 0.0
                if delay not in fleets:
                    fleets[delay] = Fleet(
                        a.chunks, delay, cpus, Path(tmp), a.baseline_src, a.server_split, a.ab_rounds,
                        routers, a.router_policy,
                    )  # fmt: skip
                raw = _run_scenario(
                    fleets[delay], name, warmup, window, a.prompt_chars, cpus[0], a.chunks, a.decode_ms
                )
                res[name] = _summarise(name, raw)
                if not a.json:
                    g, b = res[name]["gateway_cpu_ms_per_req"], res[name]["bare_cpu_ms_per_req"]
                    print(f"  {name}: CPU ms/req gateway {g:.3f}, bare {b:.3f}", file=sys.stderr, flush=True)
        finally:
            for f in fleets.values():
                f.close()
    if a.json:
        print(json.dumps({**res, "summary": _flat(res), "settings": settings}, indent=2))
    else:
        print(_table(res, settings))


if __name__ == "__main__":
    main()
