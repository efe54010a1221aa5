"""The pool of instances: every configured instance grouped by model, membership changes (the
autoscaler's registry, discovery), and the background health checks and metrics scrapes that keep
each :class:`~tokenplane.gateway.upstream.Upstream` fresh (one instance, its view and signals:
:mod:`~tokenplane.gateway.upstream`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import aiohttp

from tokenplane.core.views import InstanceView
from tokenplane.gateway.check_rounds import check_round, every
from tokenplane.gateway.config import HealthConfig, InstanceConfig, ScrapeConfig
from tokenplane.gateway.upstream import Generation as Generation
from tokenplane.gateway.upstream import Upstream as Upstream
from tokenplane.gateway.view_signals import COLD, WARMING, PoolTtft, catalogue_kv_bytes_per_token

log = logging.getLogger(__name__)

SCRAPE_STREAK_TO_WARN = 3  # consecutive failed scrapes before the stale view is logged


class UpstreamPool:
    """Every configured instance, grouped by model, with background scraping and health checks."""

    def __init__(
        self,
        instances: Sequence[InstanceConfig],
        scrape: ScrapeConfig,
        health: HealthConfig,
        *,
        on_down: Callable[[Upstream], None] | None = None,
    ) -> None:
        self._scrape = scrape
        self._health = health
        self._on_down = on_down
        self.generation = Generation()
        """Bumped when any instance becomes usable or unusable, or joins or leaves the pool."""
        self._ttft: dict[str, PoolTtft] = {}
        self._by_id = {c.id: self._upstream(c) for c in instances}
        self._by_model: dict[str, list[Upstream]] = {}
        for u in self._by_id.values():
            self._by_model.setdefault(u.model, []).append(u)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: dict[str, asyncio.Task[bool]] = {}
        self._scraping: dict[str, asyncio.Task[bool]] = {}

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self._by_id.values())

    def all(self) -> list[Upstream]:
        return list(self._by_id.values())

    def for_model(self, model: str) -> list[Upstream]:
        return self._by_model.get(model, [])

    def get(self, instance_id: str) -> Upstream | None:
        return self._by_id.get(instance_id)

    def views(self, model: str) -> list[InstanceView]:
        return [u.view() for u in self._by_model.get(model, ())]

    def ttft(self, model: str) -> PoolTtft:
        """The model pool's TTFT predictor (shared by its instances' views and its admission)."""
        t = self._ttft.get(model)
        if t is None:
            t = self._ttft[model] = PoolTtft()
        return t

    def _upstream(self, config: InstanceConfig) -> Upstream:
        return Upstream(
            config,
            self._health,
            self.generation,
            ttft=self.ttft(config.model),
            kv_bytes_per_token=config.kv_bytes_per_token or catalogue_kv_bytes_per_token(config.model),
        )

    # -- membership (the autoscaler's registry) ------------------------------------------------
    def add(self, config: InstanceConfig, *, weights: str = COLD) -> Upstream:
        """Start routing to a new instance (an autoscaler activated it). ``weights``: what its
        lifecycle says (``warm`` once it serves, ``warming`` while it starts); its first answered
        health check or request makes it warm in any case."""
        if config.id in self._by_id:
            raise ValueError(f"instance {config.id!r} is already in the pool")
        u = self._upstream(config)
        u.set_weights(weights)
        self._by_id[u.id] = u
        self._by_model.setdefault(u.model, []).append(u)
        self.generation.bump()
        return u

    def drain(self, instance_id: str) -> None:
        """Stop sending new work to an instance; what it has in flight finishes."""
        u = self._by_id.get(instance_id)
        if u is not None:
            u.set_draining(True)

    def remove(self, instance_id: str) -> Upstream | None:
        u = self._by_id.pop(instance_id, None)
        if u is not None:
            self._by_model[u.model] = [x for x in self._by_model.get(u.model, []) if x is not u]
            self.generation.bump()
        return u

    def record_failure(self, upstream: Upstream, reason: str) -> None:
        if upstream.record_failure(reason) and self._on_down is not None:
            self._on_down(upstream)

    # -- background work ------------------------------------------------------------------------
    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self._tasks.append(asyncio.create_task(every(self._health.interval_s, self.probe_all)))
        if self._scrape.enabled:
            self._tasks.append(asyncio.create_task(every(self._scrape.interval_s, self.scrape_all)))

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._probing.values(), *self._scraping.values()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    async def probe_all(self) -> None:
        await check_round(self.probe, self._by_id.values(), self._probing, self._health.interval_s)

    async def scrape_all(self) -> None:
        ups = [u for u in self._by_id.values() if u.runtime.capabilities.metrics]
        await check_round(self.scrape, ups, self._scraping, self._scrape.interval_s)

    async def probe(self, upstream: Upstream) -> bool:
        """One health check. A check that times out while the instance kept sending answers is not
        counted against it: a runtime whose HTTP loop is busy with a burst is slow to answer
        ``/health``, not down, and taking it out would push its load onto the rest."""
        assert self._session is not None, "start() the pool first"
        timeout = aiohttp.ClientTimeout(total=self._health.timeout_s)
        started = time.monotonic()
        try:
            async with self._session.get(upstream.health_url, timeout=timeout) as resp:
                await resp.read()
                ok = resp.status == 200
                reason = f"health check answered {resp.status}"
                if not ok and upstream.healthy:
                    upstream.set_weights(WARMING)  # up, not serving yet (llama.cpp: 503 while loading)
        except TimeoutError:
            if upstream.answered_since(started):
                log.debug("health check of %s timed out while it was answering: busy, not down", upstream.id)
                return False
            ok, reason = False, f"health check timed out after {self._health.timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            ok = False
            reason = f"health check failed: {type(exc).__name__}: {exc}"
        if ok:
            upstream.record_probe_success()
        else:
            self.record_failure(upstream, reason)
        return ok

    async def scrape(self, upstream: Upstream) -> bool:
        assert self._session is not None, "start() the pool first"
        timeout = aiohttp.ClientTimeout(total=self._scrape.timeout_s)
        try:
            async with self._session.get(upstream.metrics_url, timeout=timeout) as resp:
                if resp.status != 200:
                    return self._scrape_failed(upstream, "status", f"answered {resp.status}")
                text = await resp.text()
            metrics = upstream.runtime.parse_metrics(text)
        except TimeoutError:
            return self._scrape_failed(upstream, "timeout", f"no answer within {self._scrape.timeout_s:g} s")
        except (aiohttp.ClientError, OSError) as exc:
            return self._scrape_failed(upstream, "connection", f"{type(exc).__name__}: {exc}")
        except ValueError as exc:
            return self._scrape_failed(upstream, "parse", f"{type(exc).__name__}: {exc}")
        if upstream.scrape_streak >= SCRAPE_STREAK_TO_WARN:
            log.info("scrapes of %s land again after %d failed", upstream.id, upstream.scrape_streak)
        upstream.apply_metrics(metrics, time.time())
        return True

    def _scrape_failed(self, upstream: Upstream, reason: str, detail: str) -> bool:
        """Count a failed scrape; say so once a streak of them leaves a routable instance's view
        stale (its running, waiting and KV use stay at the last reading), not at every miss."""
        upstream.scrape_failures[reason] = upstream.scrape_failures.get(reason, 0) + 1
        upstream.scrape_streak += 1
        if upstream.scrape_streak == SCRAPE_STREAK_TO_WARN and upstream.healthy:
            stale = (
                "it has no view yet"
                if upstream.scraped_at is None
                else f"its view is from {time.time() - upstream.scraped_at:.1f} s ago"
            )
            hint = (
                "; raise scrape.timeout_s if it answers /metrics late under load"
                if reason == "timeout"
                else ""
            )
            log.warning("scrapes of %s keep failing (%s: %s): %s%s", upstream.id, reason, detail, stale, hint)
        else:
            log.debug("scrape of %s failed (%s: %s)", upstream.id, reason, detail)
        return False
