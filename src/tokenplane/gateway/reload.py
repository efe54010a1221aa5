"""Config reload without a restart: on SIGHUP, and when the config file changes (``reload.watch``).

The new file is validated first; an invalid one is refused with a log line naming the path and the
reason, and the config in use keeps serving. A valid one replaces, in one step between two
requests, the tenants and their keys, the models' aliases, routers and upstream names, and the
request limits (``limits.max_body_bytes`` excepted: the listening front keeps the one it started
with): the gateway's authenticator and model catalogue are rebuilt and the request
pipeline's stages swapped. A request already under way keeps the stages (and so the tenant, model
and limits) it started with until it ends.

What a reload does not change (a restart does): ``listen``, ``instances`` (use ``discovery``),
``scrape``, ``health``, ``retry``, ``breaker``, ``admission``, ``autoscaling``, ``ledger``,
``tracing`` and the models' response cache, fallback and deferral settings (a tenant may become
``deferrable`` by reload only when some tenant was at start: the deferral stage exists then).
Adding or removing a model is refused (each model has its own admission queue and pool); a change
to the other sections is ignored with a warning.

``/metrics`` shows ``tokenplane_config_generation`` (1 at start, +1 per applied reload) and
``tokenplane_config_reloads_total{result}`` with ``tokenplane_config_last_reload_success``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from enum import StrEnum
from pathlib import Path

from prometheus_client import Counter, Gauge

from tokenplane.gateway.app import GATEWAY_KEY, PIPELINE_KEY, build_pipeline
from tokenplane.gateway.catalog import ModelCatalog
from tokenplane.gateway.config import ConfigError, GatewayConfig, load_config
from tokenplane.gateway.server import GatewayServer
from tokenplane.gateway.stages.pipeline import Pipeline
from tokenplane.gateway.state import Gateway
from tokenplane.gateway.tenants import Authenticator

log = logging.getLogger("tokenplane.gateway.reload")

RELOADED = ("tenants", "models", "limits")
NOT_RELOADED = (
    "listen",
    "instances",
    "scrape",
    "health",
    "retry",
    "breaker",
    "admission",
    "autoscaling",
    "ledger",
    "tracing",
    "drain",
    "discovery",
    "reload",
)


class ReloadResult(StrEnum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"
    INVALID = "invalid"  # the file does not validate
    NEEDS_RESTART = "needs_restart"  # models added or removed


class Reloader:
    """Reloads ``path`` into a running gateway; see the module docstring."""

    def __init__(self, gw: Gateway, pipeline: Pipeline, path: Path, config: GatewayConfig) -> None:
        self.gw = gw
        self.pipeline = pipeline
        self.path = path
        self.config = config
        self.generation = 1
        self.watching: asyncio.Task[None] | None = None
        reg = gw.metrics.registry
        self._generation = Gauge(
            "tokenplane_config_generation",
            "The config in use: 1 at start, +1 per applied reload",
            registry=reg,
        )
        self._generation.set(1)
        self._results = Counter(
            "tokenplane_config_reloads", "Config reloads tried, by result", ["result"], registry=reg
        )
        self._success = Gauge(
            "tokenplane_config_last_reload_success",
            "1 when the last reload was applied or found nothing to change, 0 when it was refused",
            registry=reg,
        )
        self._success.set(1)

    def reload(self) -> ReloadResult:
        result = self._reload()
        self._results.labels(result.value).inc()
        self._success.set(1 if result in (ReloadResult.APPLIED, ReloadResult.UNCHANGED) else 0)
        return result

    def _reload(self) -> ReloadResult:
        try:
            new = load_config(self.path)
        except ConfigError as exc:
            log.error("config reload refused, the config in use keeps serving: %s", exc)
            return ReloadResult.INVALID
        old = self.config
        if {m.name for m in new.models} != {m.name for m in old.models}:
            log.error(
                "config reload refused: adding or removing a model needs a restart (%s -> %s)",
                sorted(m.name for m in old.models),
                sorted(m.name for m in new.models),
            )
            return ReloadResult.NEEDS_RESTART
        ignored = [s for s in NOT_RELOADED if getattr(new, s) != getattr(old, s)]
        if ignored:
            log.warning("config reload: %s changed; a restart applies that", ", ".join(ignored))
        if all(getattr(new, s) == getattr(old, s) for s in RELOADED):
            self.config = new
            return ReloadResult.UNCHANGED
        self._apply(new)
        self.config = new
        self.generation += 1
        self._generation.set(self.generation)
        log.info("config reloaded from %s: generation %d", self.path, self.generation)
        return ReloadResult.APPLIED

    def _apply(self, new: GatewayConfig) -> None:
        gw = self.gw
        gw.auth = Authenticator(new.tenants)
        gw.catalog = ModelCatalog(new.models, random.Random())
        gw.limits = new.limits
        gw.defer_always = frozenset(t.name for t in new.tenants if t.priority == "deferrable")
        gw.defer_allowed = gw.defer_always | {t.name for t in new.tenants if t.allow_deferrable}
        fresh = build_pipeline(gw)
        # one step, no await: a request sees the old stages or the new ones, never a mix
        self.pipeline.stages, self.pipeline.exits = fresh.stages, fresh.exits

    async def stop(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watching

    async def watch(self, interval_s: float) -> None:
        """Reload when the file's modification time or size changes (a ConfigMap's update too)."""
        seen = _stamp(self.path)
        while True:
            await asyncio.sleep(interval_s)
            stamp = _stamp(self.path)
            if stamp is not None and stamp != seen:
                seen = stamp
                self.reload()


def start_reloading(server: GatewayServer, path: Path, config: GatewayConfig) -> Reloader:
    """SIGHUP reloads ``path``; with ``reload.watch`` a change of the file does too."""
    app = server.app
    reloader = Reloader(app[GATEWAY_KEY], app[PIPELINE_KEY], path, config)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, AttributeError):  # no SIGHUP on Windows
        loop.add_signal_handler(signal.SIGHUP, reloader.reload)
    if config.reload.watch:
        reloader.watching = loop.create_task(reloader.watch(config.reload.interval_s))
    return reloader


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


__all__ = ["ReloadResult", "Reloader", "start_reloading"]
