"""Applying a discovered instance set to the gateway's pool without dropping a request.

A source (static, file, kubernetes) produces the whole set of instances it wants served, keyed by
id, each time something changes; :meth:`PoolSync.apply` compares it with what discovery put in the
pool: a new id is added (the pool's health probe makes it usable), an id no longer wanted is
drained (no new work; what it has in flight finishes) and removed once its last request ended (or
after ``drain_timeout_s``), an id that comes back while draining is un-drained, and an id whose
URL or model changed is drained and re-added under its new address once the old one is gone.
Instances the autoscaler adds are not discovery's and are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from tokenplane.gateway.config import DiscoveryConfig, InstanceConfig

if TYPE_CHECKING:
    from tokenplane.gateway.state import Gateway

log = logging.getLogger("tokenplane.gateway.discovery")

REAP_INTERVAL_S = 0.1


class Source(Protocol):
    """Runs until cancelled, calling ``sync.apply`` with the whole wanted set on every change."""

    async def run(self, sync: PoolSync) -> None: ...


class PoolSync:
    """Discovery's side of the pool: what it added, what it is draining out."""

    def __init__(self, gw: Gateway, initial: Mapping[str, InstanceConfig], drain_timeout_s: float) -> None:
        self.gw = gw
        self.drain_timeout_s = drain_timeout_s
        self.managed: dict[str, InstanceConfig] = dict(initial)
        self.leaving: dict[str, float] = {}  # id -> when its drain began
        self.wanted: dict[str, InstanceConfig] = dict(initial)
        self.applied = 0

    def apply(self, wanted: Mapping[str, InstanceConfig]) -> None:
        """Make the pool serve ``wanted`` (by id); see the module docstring."""
        models = {m.name for m in self.gw.catalog.models}
        self.wanted = {}
        for iid, cfg in wanted.items():
            if cfg.model not in models:
                log.warning(
                    "discovery: instance %s serves %r, which no configured model is; skipped", iid, cfg.model
                )
                continue
            self.wanted[iid] = cfg
        pool = self.gw.pool
        now = time.monotonic()
        for iid in list(self.managed):
            if iid in self.wanted and self.wanted[iid] == self.managed[iid]:
                continue
            if iid not in self.leaving:
                pool.drain(iid)
                self.leaving[iid] = now
                log.info("discovery: draining %s", iid)
        for iid, cfg in self.wanted.items():
            if iid in self.leaving and self.managed.get(iid) == cfg:
                u = pool.get(iid)
                if u is not None:
                    u.set_draining(False)
                del self.leaving[iid]
                log.info("discovery: %s is back", iid)
            elif iid not in self.managed and pool.get(iid) is None:
                pool.add(cfg)
                self.managed[iid] = cfg
                log.info("discovery: added %s at %s (%s)", iid, cfg.url, cfg.model)
        self.applied += 1
        self.reap()

    def reap(self) -> None:
        """Remove drained instances whose requests have all ended; re-add changed ones."""
        pool = self.gw.pool
        now = time.monotonic()
        for iid, since in list(self.leaving.items()):
            u = pool.get(iid)
            if u is not None and u.in_flight > 0 and now - since < self.drain_timeout_s:
                continue
            if u is not None:
                pool.remove(iid)
                self.gw.forget_instance(iid)
            del self.leaving[iid]
            del self.managed[iid]
            log.info("discovery: removed %s", iid)
            cfg = self.wanted.get(iid)
            if cfg is not None:  # its address changed: back under the new one
                pool.add(cfg)
                self.managed[iid] = cfg

    async def reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            if self.leaving:
                self.reap()


class Discovery:
    """The running source and the reaper; :meth:`stop` cancels both."""

    def __init__(self, sync: PoolSync, source: Source) -> None:
        self.sync = sync
        self.source = source
        self._tasks = [asyncio.create_task(source.run(sync)), asyncio.create_task(sync.reap_forever())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


def start_discovery(gw: Gateway, cfg: DiscoveryConfig, instances: tuple[InstanceConfig, ...]) -> Discovery:
    """Start the configured source (``static`` needs none: the pool already holds the list)."""
    initial = {i.id: i for i in instances}
    sync = PoolSync(gw, initial, cfg.drain_timeout_s)
    if cfg.kind == "static":
        from tokenplane.gateway.discovery.static import StaticSource

        return Discovery(sync, StaticSource(instances))
    if cfg.kind == "file":
        from tokenplane.gateway.discovery.file import FileSource

        assert cfg.path is not None
        return Discovery(sync, FileSource(cfg.path, cfg.interval_s))
    from tokenplane.gateway.discovery.kubernetes import KubernetesSource

    assert cfg.kubernetes is not None
    return Discovery(sync, KubernetesSource(cfg.kubernetes))


__all__ = ["Discovery", "PoolSync", "Source", "start_discovery"]
