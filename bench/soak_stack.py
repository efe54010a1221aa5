"""The processes of ``bench/soak.py``: emulated instances, gateways (one, or replicas sharing a
private Redis and a PostgreSQL database reached through a TCP proxy the chaos can cut), and the
stack that applies chaos events to them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tokenplane.gateway import hash_key
from tokenplane.gateway.heap_trace import ENV as ENV_TRACEMALLOC
from tokenplane.gateway.heap_trace import diff as heap_diff

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from tcp_proxy import TcpProxy  # the proxy the ledger tests cut, in its own thread

MODEL = "llama-3-8b"
PG_ADMIN_URL = os.environ.get("TOKENPLANE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, wait_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def wait_healthy(
    http: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before becoming healthy")
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with http.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} did not become healthy at {url} within {timeout_s} s")


@dataclass
class Fleet:
    instances: int = 3
    max_num_seqs: int = 4
    step_ms: float = 40.0
    max_tokens: tuple[int, int] = (8, 40)
    kv_capacity_tokens: int | None = None  # None: the emulated GPU's (an H100: 454,176 for the 8B)

    def mean_service_s(self) -> float:
        """A request's time on an instance: one prefill step, then one step per output token."""
        return (1 + sum(self.max_tokens) / 2) * self.step_ms / 1000.0

    def capacity_rps(self) -> float:
        return self.instances * self.max_num_seqs / self.mean_service_s()


class Emulator:
    def __init__(self, name: str, fleet: Fleet, seed: int, workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fleet = fleet
        self.seed = seed
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.down = False  # deliberately killed; the supervisor leaves it alone
        self.restarts = 0

    def start(self) -> None:
        self.proc = spawn(
            [
                "tokenplane.emulator",
                "--port",
                str(self.port),
                "--model",
                MODEL,
                "--served-model-name",
                MODEL,
                "--fixed-step-ms",
                str(self.fleet.step_ms),
                "--max-num-seqs",
                str(self.fleet.max_num_seqs),
                "--seed",
                str(self.seed),
                *(
                    ["--kv-capacity-tokens", str(self.fleet.kv_capacity_tokens)]
                    if self.fleet.kv_capacity_tokens
                    else []
                ),
            ],
            self.log,
        )


class Gateway:
    """One ``tokenplane serve`` process (a replica when the stack has several), restarted on its
    own port; ``shared`` is the config's ``state`` and ``ledger`` sections when replicas share them."""

    def __init__(
        self,
        name: str,
        emulators: list[Emulator],
        key: str,
        workdir: Path,
        shared: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        self.config = workdir / f"{name}.yaml"
        config: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": self.port},
            "tenants": [{"name": "soak", "priority": "interactive", "api_keys": [hash_key(key)]}],
            "models": [{"name": MODEL}],
            "instances": [
                {"id": e.name, "url": e.url, "model": MODEL, "kind": "emulated"} for e in emulators
            ],
            "scrape": {"interval_s": 0.5},
            "health": {"interval_s": 0.5, "failures_to_down": 2},
            "retry": {"first_byte_timeout_s": 5.0, "stream_idle_timeout_s": 3.0},
            "ledger": {"path": str(workdir / f"{name}-ledger.sqlite")},
            **(shared or {}),
        }
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None
        self.lifetimes: list[list[tuple[float, int, int]]] = []  # per process: (t, rss_kb, fds)
        self.cpu_s: list[float] = []  # CPU seconds per process lifetime (user + system)
        self.in_flight = 0  # client requests open to it (one connection each: no client pooling)
        self.heap_dir: Path | None = None  # set: the gateway traces its heap (gateway/heap_trace.py)
        self.heap_dumps: list[tuple[float, int]] = []  # (t, pid) of each snapshot asked for
        self.restart_windows: list[tuple[float, float]] = []
        self.down_since: float | None = None
        self.index_full_at: list[float | None] = []  # per process: when its prefix index was full
        self.index_reached: set[str] = set()  # this process's instances whose index reached its bound

    async def read_index(self, http: aiohttp.ClientSession, t: float) -> None:
        """Note when every instance's prefix index has reached its bound (``/metrics``), each at
        some sample: the gateway's largest traffic-filled structure is then at its steady state."""
        if not self.index_full_at or self.index_full_at[-1] is not None:
            return
        held: dict[str, float] = {}
        bound: dict[str, float] = {}
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with http.get(self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                for line in (await r.text()).splitlines():
                    for name, into in (
                        ("tokenplane_prefix_index_blocks{", held),
                        ("tokenplane_prefix_index_bound_blocks{", bound),
                    ):
                        if line.startswith(name):
                            labels, value = line.rsplit(" ", 1)
                            into[labels[len(name) :]] = float(value)
        # Each instance once at its bound, not all at once: the index's two generations (see
        # core/routing/prefix_index.py) hold between half the bound and the bound once full.
        self.index_reached.update(k for k, b in bound.items() if held.get(k, 0.0) >= 0.98 * b)
        if bound and self.index_reached >= bound.keys():
            self.index_full_at[-1] = t

    def in_restart(self, a: float, b: float) -> bool:
        """Whether [a, b] overlaps a restart of this process (or one still under way)."""
        if self.down_since is not None and b >= self.down_since:
            return True
        return any(s <= b and a <= e for s, e in self.restart_windows)

    def start(self) -> None:
        env = {ENV_TRACEMALLOC: str(self.heap_dir)} if self.heap_dir else None
        self.proc = spawn(["tokenplane", "serve", str(self.config)], self.log, env)
        self.lifetimes.append([])
        self.cpu_s.append(0.0)
        self.index_full_at.append(None)
        self.index_reached = set()

    def sample(self, t: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        except OSError:
            return
        rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
        if rss is None:  # exiting between poll() and the read (a zombie has no VmRSS line)
            return
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            self.cpu_s[-1] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        # Each request in flight holds one client connection here: those are load, not growth.
        self.lifetimes[-1].append((t, rss, fds - self.in_flight))

    def dump_heap(self, t: float) -> None:
        """Ask a tracing gateway for a heap snapshot (it writes ``heap-PID-N.snap``)."""
        if self.heap_dir is None or self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGUSR2)
            self.heap_dumps.append((t, self.proc.pid))

    def heap_growth(self, warmup_s: float, top: int = 12) -> dict[str, Any] | None:
        """What grew on the heap of the last gateway process, from its first snapshot after the
        warm-up to its last."""
        if self.heap_dir is None or not self.heap_dumps:
            return None
        pid = self.heap_dumps[-1][1]
        mine = [t for t, p in self.heap_dumps if p == pid]
        start = next((t for t in mine if t >= mine[0] + warmup_s), mine[0])
        snaps = sorted(self.heap_dir.glob(f"heap-{pid}-*.snap"))
        if len(snaps) < 2:
            return None
        first = snaps[min(mine.index(start), len(snaps) - 2)]
        return {
            "from": first.name,
            "to": snaps[-1].name,
            "top_growth": heap_diff(first, snaps[-1], top),
        }


@dataclass
class ChaosEvent:
    t: float
    action: str
    target: str
    duration_s: float
    params: dict[str, Any] = field(default_factory=dict)
    end_t: float | None = None  # when the fault was lifted (and the target healthy again)


# -- what replicas share ----------------------------------------------------------------------------


class PrivateRedis:
    """A ``redis-server`` of the soak's own on a free port (the chaos kills and restarts it)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = workdir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no"],
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def wait_up(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(b"PING\r\n")
                if (await asyncio.wait_for(reader.readline(), 1)).startswith(b"+PONG"):
                    writer.close()
                    return
                writer.close()
            await asyncio.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout_s} s")


class PgDatabase:
    """A fresh PostgreSQL database for one run, dropped at the end."""

    def __init__(self) -> None:
        self.name = "tp_soak_" + uuid.uuid4().hex[:12]

    def url(self, port: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/{self.name}"

    def create(self) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.name}".encode())

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)".encode())


# -- a stack ------------------------------------------------------------------------------------------


class Stack:
    """Gateways (``replicas`` of them) and their emulators, with a supervisor that restarts an
    instance that died; with ``redis``/``postgres`` the replicas share a private Redis and a fresh
    PostgreSQL database (through a TCP proxy), else each has its own SQLite ledger."""

    def __init__(
        self,
        name: str,
        fleet: Fleet,
        seed: int,
        workdir: Path,
        key: str,
        *,
        replicas: int = 1,
        redis: bool = False,
        postgres: bool = False,
    ) -> None:
        self.name = name
        self.emulators = [
            Emulator(f"{name}-emu-{i}", fleet, seed + i, workdir) for i in range(fleet.instances)
        ]
        self.redis = PrivateRedis(workdir) if redis else None
        self.pg = PgDatabase() if postgres else None
        self.proxy = TcpProxy() if postgres else None  # PostgreSQL, through a port the chaos can cut
        if self.proxy is not None:
            self.proxy.start()
        shared: dict[str, Any] = {}
        if self.redis is not None:
            shared["state"] = {"backend": "redis", "url": self.redis.url, "key_prefix": f"soak-{name}:"}
        if self.pg is not None and self.proxy is not None:
            shared["ledger"] = {"url": self.pg.url(self.proxy.port), "timeout_s": 2.0}
        elif replicas > 1:  # one SQLite file for every replica
            shared["ledger"] = {"path": str(workdir / f"{name}-ledger.sqlite")}
        names = [f"{name}-gateway"] if replicas == 1 else [f"{name}-replica-{i}" for i in range(replicas)]
        self.gateways = [Gateway(n, self.emulators, key, workdir, shared) for n in names]
        self.fault_windows: list[tuple[float, float]] = []
        self._next = 0

    @property
    def gateway(self) -> Gateway:
        return self.gateways[0]

    def pick(self) -> Gateway:
        """The next replica, round robin (a load balancer in front of them)."""
        self._next = (self._next + 1) % len(self.gateways)
        return self.gateways[self._next]

    async def start(self, http: aiohttp.ClientSession) -> None:
        if self.pg is not None and self.proxy is not None:
            await asyncio.to_thread(self.pg.create)
        if self.redis is not None:
            self.redis.start()
            await self.redis.wait_up()
        for e in self.emulators:
            e.start()
        for g in self.gateways:
            g.start()
        for e in self.emulators:
            assert e.proc is not None
            await wait_healthy(http, e.url, e.proc, e.name)
        for g in self.gateways:
            assert g.proc is not None
            await wait_healthy(http, g.url, g.proc, g.name)

    async def stop(self) -> None:
        """Every process at once, off the loop: the gateways' last ledger writes go through the
        PostgreSQL proxy."""
        procs = [g.proc for g in self.gateways] + [e.proc for e in self.emulators]
        await asyncio.gather(*(asyncio.to_thread(stop, p) for p in procs))
        if self.redis is not None:
            stop(self.redis.proc, signal.SIGKILL)
        if self.proxy is not None:
            self.proxy.close()
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.drop()

    async def supervise(self, http: aiohttp.ClientSession, stop_at: Callable[[], bool]) -> None:
        """Restart an emulator that ended by itself (the crash fault) on its own port."""
        while not stop_at():
            for e in self.emulators:
                if not e.down and e.proc is not None and e.proc.poll() is not None:
                    e.down = True
                    e.start()
                    e.restarts += 1
                    with contextlib.suppress(RuntimeError):
                        await wait_healthy(http, e.url, e.proc, e.name)
                    e.down = False
            await asyncio.sleep(0.2)

    async def apply(self, http: aiohttp.ClientSession, ev: ChaosEvent, t0: float) -> None:
        start = time.monotonic() - t0
        if ev.action == "gateway_restart":
            gw = next(g for g in self.gateways if g.name == ev.target or ev.target == "gateway")
            gw.down_since = start
            await asyncio.to_thread(stop, gw.proc)  # the loop runs the PostgreSQL proxy too
            gw.start()
            assert gw.proc is not None
            await wait_healthy(http, gw.url, gw.proc, f"{gw.name} (restarted)")
            end = time.monotonic() - t0 + 1.0
            gw.restart_windows.append((start, end))
            gw.down_since = None
            ev.end_t = round(end, 2)
            self.fault_windows.append((start, end))
            return
        if ev.action == "redis_restart":
            assert self.redis is not None
            await asyncio.to_thread(stop, self.redis.proc, signal.SIGKILL)
            await asyncio.sleep(ev.duration_s)
            self.redis.start()
            self.redis.restarts += 1
            await self.redis.wait_up()
        elif ev.action == "pg_cut":
            assert self.proxy is not None
            self.proxy.cut()
            await asyncio.sleep(ev.duration_s)
            self.proxy.restore()
        elif ev.action == "kill":
            emu = next(e for e in self.emulators if e.name == ev.target)
            emu.down = True
            await asyncio.to_thread(stop, emu.proc, signal.SIGKILL)
            await asyncio.sleep(ev.duration_s)
            emu.start()
            emu.restarts += 1
            assert emu.proc is not None
            await wait_healthy(http, emu.url, emu.proc, emu.name)
            emu.down = False
        else:
            emu = next(e for e in self.emulators if e.name == ev.target)
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.post(emu.url + "/admin/faults", json={"clear": True, **ev.params}) as r:
                    r.raise_for_status()
            await asyncio.sleep(ev.duration_s)
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.post(emu.url + "/admin/faults", json={"clear": True}) as r:
                    r.raise_for_status()
        # A fault's effects (hung streams, requests parked on a dead instance) outlast it by the
        # gateway's own timeouts.
        end = time.monotonic() - t0 + 6.0
        ev.end_t = round(end, 2)
        self.fault_windows.append((start, end))
