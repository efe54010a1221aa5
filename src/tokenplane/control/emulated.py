"""The emulated fleet: real ``python -m tokenplane.emulator`` processes on loopback ports.

``start(n)`` spawns ``n`` emulator processes, each in its own process group, on free ports of
``port_range`` (a port is free when nothing of ours holds it and a bind succeeds). A watcher task
per instance polls ``GET /health`` every ``HEALTH_POLL_S``; once it answers 200 the instance waits
``warmup_s`` more (standing in for weight loading, the minutes a real GPU instance needs) and then
reports ``ready``. An instance whose process exits on its own disappears from ``list()`` (logged
with its exit code), so the loop sees the capacity gone and decides again. An instance that never
answers within ``health_timeout_s`` is stopped.

``stop(ids)`` sends SIGTERM to each instance's process group, waits up to ``stop_timeout_s``, then
SIGKILLs it. ``close()`` stops everything this actuator started.

Output of each process goes to ``log_dir/<id>.log`` when ``log_dir`` is set, else nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import aiohttp

from tokenplane.control.actuators import InstanceHandle, InstanceState, kv
from tokenplane.control.errors import ActuatorError

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.1
DEFAULT_HEALTH_TIMEOUT_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 5.0
DEFAULT_PORT_RANGE = (18100, 18299)


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the emulator's server binds (asyncio sets SO_REUSEADDR): a port left in TIME_WAIT by a
        # stopped instance is free for the next one.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class _Instance:
    __slots__ = (
        "healthy_at",
        "id",
        "log_file",
        "port",
        "proc",
        "ready_at",
        "started_at",
        "state",
        "url",
        "watcher",
    )

    def __init__(self, iid: str, port: int, url: str, proc: asyncio.subprocess.Process, now: float) -> None:
        self.id = iid
        self.port = port
        self.url = url
        self.proc = proc
        self.started_at = now
        self.healthy_at: float | None = None
        self.ready_at: float | None = None
        self.state = InstanceState.STARTING
        self.watcher: asyncio.Task[None] | None = None
        self.log_file: IO[bytes] | None = None

    def handle(self) -> InstanceHandle:
        return InstanceHandle(self.id, self.state, self.url, self.started_at, self.ready_at)


class EmulatedFleetActuator:
    """Starts and stops emulator processes; see the module docstring."""

    name = "emulated"

    def __init__(
        self,
        base_args: Sequence[str] = (),
        port_range: tuple[int, int] = DEFAULT_PORT_RANGE,
        warmup_s: float = 0.0,
        *,
        host: str = "127.0.0.1",
        python: str = sys.executable,
        id_prefix: str = "emu",
        health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        log_dir: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        lo, hi = port_range
        if not 0 < lo <= hi <= 65535:
            raise ActuatorError(f"port_range must be (lo, hi) with 0 < lo <= hi <= 65535, got {port_range}")
        for flag in ("--port", "--host"):
            if any(a == flag or a.startswith(flag + "=") for a in base_args):
                raise ActuatorError(f"base_args must not set {flag}: the actuator chooses it")
        if warmup_s < 0:
            raise ActuatorError(f"warmup_s must be >= 0, got {warmup_s}")
        self.base_args = list(base_args)
        self.port_range = (lo, hi)
        self.warmup_s = warmup_s
        self.host = host
        self.python = python
        self.id_prefix = id_prefix
        self.health_timeout_s = health_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._clock = clock
        self._instances: dict[str, _Instance] = {}
        self._seq = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def tracks_instances(self) -> bool:
        return True

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        return self._session

    def _free_port(self) -> int:
        used = {i.port for i in self._instances.values()}
        lo, hi = self.port_range
        for port in range(lo, hi + 1):
            if port not in used and port_is_free(self.host, port):
                return port
        raise ActuatorError(f"no free port in {lo}-{hi} on {self.host}")

    def command(self, port: int) -> list[str]:
        head = [self.python, "-m", "tokenplane.emulator", "--host", self.host, "--port", str(port)]
        return [*head, *self.base_args]

    async def start(self, n: int) -> list[InstanceHandle]:
        handles = []
        for _ in range(max(0, n)):
            port = self._free_port()
            self._seq += 1
            iid = f"{self.id_prefix}-{self._seq}"
            out: IO[bytes] | None = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                out = (self.log_dir / f"{iid}.log").open("ab")
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.command(port),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out if out is not None else asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.STDOUT if out is not None else asyncio.subprocess.DEVNULL,
                    start_new_session=True,  # its own process group: stop() signals the whole group
                )
            except OSError as exc:
                if out is not None:
                    out.close()
                raise ActuatorError(f"cannot start the emulator: {exc}") from None
            url = f"http://{self.host}:{port}"
            inst = _Instance(iid, port, url, proc, self._clock())
            inst.log_file = out
            inst.watcher = asyncio.create_task(self._watch(inst), name=f"watch-{iid}")
            self._instances[iid] = inst
            log.info("autoscaler emulated %s", kv(event="start", id=iid, url=url, pid=proc.pid))
            handles.append(inst.handle())
        return handles

    async def _watch(self, inst: _Instance) -> None:
        """Poll health until it answers, then hold ``warmup_s``, then mark ready; reap on exit."""
        deadline = time.monotonic() + self.health_timeout_s
        try:
            while inst.healthy_at is None:
                if inst.proc.returncode is not None:
                    return
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with self._http().get(inst.url + "/health") as resp:
                        if resp.status == 200:
                            inst.healthy_at = self._clock()
                            break
                if time.monotonic() > deadline:
                    log.warning(
                        "autoscaler emulated %s",
                        kv(event="health_timeout", id=inst.id, s=self.health_timeout_s),
                    )
                    await self.stop([inst.id])
                    return
                await asyncio.sleep(HEALTH_POLL_S)
            if self.warmup_s > 0:
                await asyncio.sleep(self.warmup_s)
            if inst.state is InstanceState.STARTING and inst.proc.returncode is None:
                inst.state = InstanceState.READY
                inst.ready_at = self._clock()
                log.info("autoscaler emulated %s", kv(event="ready", id=inst.id, url=inst.url))
        except asyncio.CancelledError:
            pass

    def _reap(self) -> None:
        for inst in list(self._instances.values()):
            rc = inst.proc.returncode
            if rc is not None and inst.state is not InstanceState.STOPPING:
                log.warning("autoscaler emulated %s", kv(event="exited", id=inst.id, rc=rc))
                self._forget(inst)

    def _forget(self, inst: _Instance) -> None:
        self._instances.pop(inst.id, None)
        if inst.watcher is not None and not inst.watcher.done():
            inst.watcher.cancel()
        if inst.log_file is not None:
            inst.log_file.close()
            inst.log_file = None

    async def _terminate(self, inst: _Instance) -> None:
        inst.state = InstanceState.STOPPING
        if inst.watcher is not None and inst.watcher is not asyncio.current_task():
            inst.watcher.cancel()
        proc = inst.proc
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
            except TimeoutError:
                log.warning("autoscaler emulated %s", kv(event="sigkill", id=inst.id))
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        log.info("autoscaler emulated %s", kv(event="stopped", id=inst.id, rc=proc.returncode))
        self._forget(inst)

    async def stop(self, ids: Sequence[str]) -> None:
        victims = [self._instances[i] for i in ids if i in self._instances]
        await asyncio.gather(*(self._terminate(v) for v in victims))

    async def list(self) -> list[InstanceHandle]:
        self._reap()
        return [i.handle() for i in self._instances.values()]

    async def wait_ready(self, ids: Sequence[str], timeout_s: float) -> None:
        """Wait until every id is ready (for tests and scripted start-up); raise on timeout or exit."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._reap()
            missing = [i for i in ids if i not in self._instances]
            if missing:
                raise ActuatorError(f"instances exited before they were ready: {missing}")
            if all(self._instances[i].state is InstanceState.READY for i in ids):
                return
            if time.monotonic() > deadline:
                raise ActuatorError(f"instances not ready within {timeout_s} s: {list(ids)}")
            await asyncio.sleep(HEALTH_POLL_S / 2)

    async def close(self) -> None:
        await self.stop(list(self._instances))
        if self._session is not None:
            await self._session.close()
            self._session = None
