"""``tokenplane serve CONFIG.yaml``: run the gateway until interrupted (SIGINT; SIGTERM drains first).

Runs on uvloop when it is installed. The completion routes are served by the fast front
(:mod:`~tokenplane.gateway.edges.fast_front`), every other route by aiohttp behind it. Either way a client
that disconnects cancels its request handler, which closes the upstream response (the instance
aborts the request). There is no access log: at about 0.15 ms of CPU per request, its formatting
alone would be a noticeable share; request counts and latencies are in ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from tokenplane.gateway.app import create_app
from tokenplane.gateway.config import load_config
from tokenplane.gateway.drain import DRAIN_KEY
from tokenplane.gateway.reload import Reloader, start_reloading
from tokenplane.gateway.server import GatewayServer
from tokenplane.runloop import freeze_startup_objects, new_event_loop

log = logging.getLogger("tokenplane.gateway")


def serve(config: Path, host: str | None, port: int | None) -> None:
    """Load ``config`` (raising ConfigError on a bad file), then serve on ``host:port`` (or the config's)."""
    cfg = load_config(config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(cfg)
    app.on_startup.append(freeze_startup_objects)
    listen = cfg.listen
    server = GatewayServer(
        app, host or listen.host, port if port is not None else listen.port, fast=listen.fast_front
    )
    loop = new_event_loop()
    try:
        loop.run_until_complete(
            _run(server, cfg.drain.deadline_s, lambda: start_reloading(server, config, cfg))
        )
    finally:
        loop.close()


async def _run(server: GatewayServer, drain_deadline_s: float, reloading: Callable[[], Reloader]) -> None:
    stop = asyncio.Event()
    term = asyncio.Event()  # SIGTERM: drain first (gateway/drain.py); SIGINT: stop now
    loop = asyncio.get_running_loop()
    for sig, events in ((signal.SIGINT, (stop,)), (signal.SIGTERM, (term, stop))):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows' loop
            loop.add_signal_handler(sig, _set_all, events)
    await server.start()
    reloader = reloading()  # SIGHUP and config file changes (gateway/reload.py)
    host = f"[{server.host}]" if ":" in server.host else server.host
    log.info("serving on http://%s:%d (press CTRL+C to quit)", host, server.port)
    try:
        await stop.wait()
        if term.is_set():
            await server.app[DRAIN_KEY].run(server, drain_deadline_s)
    finally:
        log.info("shutting down")
        await reloader.stop()
        await server.close()


def _set_all(events: tuple[asyncio.Event, ...]) -> None:
    for e in events:
        e.set()
