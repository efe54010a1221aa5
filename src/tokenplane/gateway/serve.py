"""``tokenplane serve CONFIG.yaml [--workers N]``: run the gateway until interrupted (SIGINT; SIGTERM
drains first).

Runs on uvloop when it is installed. The completion routes are served by the fast front
(:mod:`~tokenplane.gateway.edges.fast_front`), every other route by aiohttp behind it. Either way a client
that disconnects cancels its request handler, which closes the upstream response (the instance
aborts the request). There is no access log: at about 0.15 ms of CPU per request, its formatting
alone would be a noticeable share; request counts and latencies are in ``/metrics``.

``--workers N`` (N > 1) runs N gateway processes on one port: each listens with ``SO_REUSEPORT``
and the kernel spreads new connections across them, so one host's cores are used. The parent
process only supervises: it reserves the port (so ``--port 0`` gives every worker the same one),
starts the workers (``python -m tokenplane serve ... --worker K``), starts again a worker that
exits, and on SIGINT or SIGTERM passes SIGTERM on and waits for every worker to finish its
requests and close (their drain deadline plus ``WORKER_STOP_TIMEOUT_S``, then SIGKILL). What the
workers share is what the configured backends share: the ledger on PostgreSQL (``ledger.url``) or
a SQLite file; in memory, each worker has its own. Each worker's ``/metrics`` names it
(``tokenplane_worker_info``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tokenplane.gateway.app import GATEWAY_KEY, create_app
from tokenplane.gateway.config import load_config
from tokenplane.gateway.drain import DRAIN_KEY
from tokenplane.gateway.heap_trace import install as install_heap_trace
from tokenplane.gateway.reload import Reloader, start_reloading
from tokenplane.gateway.server import GatewayServer
from tokenplane.runloop import freeze_startup_objects, new_event_loop

__all__ = ["WORKER_STOP_TIMEOUT_S", "serve"]

log = logging.getLogger("tokenplane.gateway")

WORKER_STOP_TIMEOUT_S = 15.0
"""How long the parent waits for its workers to close after passing a stop signal on, beyond their
drain deadline (``drain.deadline_s``: SIGTERM lets a worker finish its streams first)."""
RESTART_PAUSE_S = 1.0
"""A worker that exits unasked is started again after this pause (not in a tight loop)."""


def serve(
    config: Path, host: str | None, port: int | None, *, workers: int = 1, worker: int | None = None
) -> None:
    """Load ``config`` (raising ConfigError on a bad file), then serve on ``host:port`` (or the config's).

    ``workers`` > 1 supervises that many worker processes; ``worker`` is set in a worker (its index).
    """
    cfg = load_config(config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    listen = cfg.listen
    host = host or listen.host
    port = port if port is not None else listen.port
    if workers > 1:
        _supervise(config, host, port, workers, cfg.drain.deadline_s + WORKER_STOP_TIMEOUT_S)
        return
    app = create_app(cfg)
    app.on_startup.append(freeze_startup_objects)
    if worker is not None:
        app[GATEWAY_KEY].metrics.registry.register(_WorkerInfo(worker))
    server = GatewayServer(app, host, port, fast=listen.fast_front, reuse_port=worker is not None)
    loop = new_event_loop()
    install_heap_trace(loop)  # opt-in (TOKENPLANE_TRACEMALLOC): a leak hunt's snapshots
    try:
        loop.run_until_complete(
            _run(server, worker, cfg.drain.deadline_s, lambda: start_reloading(server, config, cfg))
        )
    finally:
        loop.close()


async def _run(
    server: GatewayServer, worker: int | None, drain_deadline_s: float, reloading: Callable[[], Reloader]
) -> None:
    stop = asyncio.Event()
    term = asyncio.Event()  # SIGTERM: drain first (gateway/drain.py); SIGINT: stop now
    loop = asyncio.get_running_loop()
    for sig, events in ((signal.SIGINT, (stop,)), (signal.SIGTERM, (term, stop))):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows' loop
            loop.add_signal_handler(sig, _set_all, events)
    try:
        await server.start()
    except BaseException:  # a start-up hook failed (the ledger's database unreachable...): stop what
        with contextlib.suppress(Exception):  # the gateway had started (its checks, housekeeping)
            await server.app[GATEWAY_KEY].stop()
        raise
    reloader = reloading()  # SIGHUP and config file changes (gateway/reload.py)
    host = f"[{server.host}]" if ":" in server.host else server.host
    who = "" if worker is None else f" (worker {worker}, pid {os.getpid()})"
    log.info("serving on http://%s:%d%s (press CTRL+C to quit)", host, server.port, who)
    try:
        await stop.wait()
        if term.is_set():
            await server.app[DRAIN_KEY].run(server, drain_deadline_s)
    finally:
        log.info("shutting down%s", who)
        await reloader.stop()
        await server.close()


class _WorkerInfo:
    """``tokenplane_worker_info{worker, pid} 1``: which worker answered this scrape."""

    def __init__(self, worker: int) -> None:
        self.worker = worker

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "tokenplane_worker_info", "This gateway worker process", labels=["worker", "pid"]
        )
        g.add_metric([str(self.worker), str(os.getpid())], 1)
        yield g


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind (without listening) a ``SO_REUSEPORT`` socket: it fixes the port the workers bind
    (``port`` 0 picks one) and takes no connections itself (only listening sockets do)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _start_worker(config: Path, host: str, port: int, k: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tokenplane", "serve", str(config), "--host", host, "--port", str(port)]
    return subprocess.Popen([*cmd, "--worker", str(k)])


def _supervise(config: Path, host: str, port: int, workers: int, stop_timeout_s: float) -> None:
    if not hasattr(socket, "SO_REUSEPORT"):  # pragma: no cover - Linux, the BSDs and macOS have it
        raise SystemExit("--workers needs SO_REUSEPORT, which this platform lacks")
    reserved = _reserve_port(host, port)
    port = int(reserved.getsockname()[1])
    stopping: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    procs = [_start_worker(config, host, port, k) for k in range(workers)]
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "serving on http://%s:%d with %d workers (pids %s)",
        shown,
        port,
        workers,
        " ".join(str(p.pid) for p in procs),
    )
    try:
        while not stopping:
            time.sleep(0.1)
            for k, p in enumerate(procs):
                if p.poll() is not None and not stopping:
                    log.error("worker %d (pid %d) exited with %s: starting it again", k, p.pid, p.returncode)
                    time.sleep(RESTART_PAUSE_S)
                    if not stopping:
                        procs[k] = _start_worker(config, host, port, k)
    finally:
        log.info("stopping %d workers", workers)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + stop_timeout_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not stop in %.0f s: killing it", p.pid, stop_timeout_s)
                p.kill()
                p.wait()
        reserved.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _set_all(events: tuple[asyncio.Event, ...]) -> None:
    for e in events:
        e.set()
