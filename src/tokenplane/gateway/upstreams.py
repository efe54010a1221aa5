"""Per-instance state as the gateway sees it, and the pool that keeps it fresh.

Three signals feed one :class:`~tokenplane.core.views.InstanceView` per instance:

* the gateway's own accounting of requests and tokens it has sent and not seen finish (updated on
  the request path; the freshest signal, and the only one that sees this gateway's burst);
* the runtime's Prometheus metrics, scraped every ``scrape.interval_s`` (vLLM and the emulator:
  ``vllm:num_requests_running``/``_waiting``, ``vllm:kv_cache_usage_perc``, the prefix-cache
  counters; llama.cpp: ``llamacpp:requests_processing``/``_deferred``);
* health: ``GET health.path`` every ``health.interval_s``. ``failures_to_down`` consecutive
  failures (a failed probe or a failed request) take an instance out; one successful probe brings
  it back.

The view is cached and rebuilt only after a change, so routing over a fleet allocates nothing per
request when nothing moved. Scraping filters the (large, histogram-heavy) vLLM exposition down to
the few lines it reads before handing them to ``prometheus_client``'s parser: a full parse of a
vLLM page costs milliseconds, the filtered one tens of microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import aiohttp
import msgspec
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from tokenplane.core.views import InstanceView
from tokenplane.gateway.config import HealthConfig, InstanceConfig, ScrapeConfig

log = logging.getLogger(__name__)

CACHE_CONFIG_INFO = "vllm:cache_config_info"
_KV_CAPACITY = "kv_capacity_tokens"  # an info metric: read from its labels, not its value

# Sample name -> field of RuntimeMetrics, per runtime kind.
_VLLM = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",  # vLLM < 0.10
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    CACHE_CONFIG_INFO: _KV_CAPACITY,
}
_LLAMACPP = {
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:kv_cache_usage_ratio": "kv_usage",
}
METRIC_NAMES: Mapping[str, Mapping[str, str]] = {
    "vllm": _VLLM,
    "emulated": _VLLM,
    "llamacpp": _LLAMACPP,
    "openai": {},
}


class RuntimeMetrics(msgspec.Struct, frozen=True):
    """What one scrape of a runtime said (sums over its label sets, e.g. several engines)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    kv_capacity_tokens: int = 0
    """From vLLM's ``vllm:cache_config_info`` (``num_gpu_blocks`` x ``block_size`` labels); 0: unknown."""


def parse_runtime_metrics(text: str, names: Mapping[str, str]) -> RuntimeMetrics:
    """Read the runtime's gauges and counters from a Prometheus text exposition."""
    if not names:
        return RuntimeMetrics()
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(tuple(names)))
    values: dict[str, float] = {}
    capacity = 0
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            field = names.get(sample.name)
            if field == _KV_CAPACITY:
                capacity += _cache_tokens(sample.labels)
            elif field is not None:
                values[field] = values.get(field, 0.0) + float(sample.value)
    return RuntimeMetrics(**values, kv_capacity_tokens=capacity)


def _cache_tokens(labels: Mapping[str, str]) -> int:
    try:
        return max(0, int(labels.get("num_gpu_blocks") or 0)) * max(0, int(labels.get("block_size") or 0))
    except ValueError:  # "None" before the engine has sized its cache
        return 0


class Generation:
    """A counter bumped whenever an instance becomes usable or unusable (health, draining,
    membership): what depends only on that, like a pool's capacity, is cached against it."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


class Upstream:
    """One instance: config, the gateway's accounting, the last scrape and health."""

    __slots__ = (
        "_draining",
        "_failures_to_down",
        "_generation",
        "_healthy",
        "_view",
        "chat_url",
        "completions_url",
        "config",
        "consecutive_failures",
        "direct",
        "headers",
        "heads",
        "health_url",
        "heard_at",
        "id",
        "in_flight",
        "in_flight_tokens",
        "labels",
        "last_error",
        "metrics",
        "metrics_url",
        "model",
        "scraped_at",
    )

    def __init__(
        self, config: InstanceConfig, health: HealthConfig, generation: Generation | None = None
    ) -> None:
        self._generation = generation if generation is not None else Generation()
        self.config = config
        self.id = config.id
        self.model = config.model
        # Parsed once: aiohttp would otherwise parse a URL string and build a headers multidict per
        # request (about 10 µs of a request's CPU).
        self.chat_url = URL(config.url + "/v1/chat/completions")
        self.completions_url = URL(config.url + "/v1/completions")
        self.metrics_url = config.url + config.metrics_path
        self.health_url = config.url + health.path
        headers = CIMultiDict({"Content-Type": "application/json"})
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self.headers: Mapping[str, str] = CIMultiDictProxy(headers)
        # For the hot-path client (plain http:// only): (host, port) and each endpoint's request head.
        self.direct: tuple[str, int] | None = None
        self.heads: dict[URL, bytes] = {}
        base = URL(config.url)
        if base.scheme == "http" and base.host is not None and base.port is not None:
            self.direct = (base.host, base.port)
            fixed = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            for url in (self.chat_url, self.completions_url):
                self.heads[url] = (
                    f"POST {url.raw_path_qs} HTTP/1.1\r\nHost: {base.raw_authority}\r\n{fixed}"
                ).encode("latin-1")
        self.labels: Mapping[str, str] = MappingProxyType(dict(config.labels))
        self._failures_to_down = health.failures_to_down
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.metrics = RuntimeMetrics()
        self.scraped_at: float | None = None
        self._healthy = True  # optimistic until the first probe; a failed request counts too
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.heard_at = -math.inf  # monotonic time of the last bytes it sent on the request path
        self._draining = False  # set by the autoscaler: finish in-flight work, take no more
        self._view: InstanceView | None = None

    @property
    def healthy(self) -> bool:
        return self._healthy

    @healthy.setter
    def healthy(self, healthy: bool) -> None:
        if healthy != self._healthy:
            self._healthy = healthy
            self._view = None
            self._generation.bump()

    @property
    def draining(self) -> bool:
        return self._draining

    def set_draining(self, draining: bool) -> None:
        if draining != self._draining:
            self._draining = draining
            self._view = None
            self._generation.bump()

    # -- the request path --------------------------------------------------------------------
    def begin(self, tokens: int) -> None:
        self.in_flight += 1
        self.in_flight_tokens += tokens
        self._view = None

    def end(self, tokens: int) -> None:
        self.in_flight -= 1
        self.in_flight_tokens -= tokens
        self._view = None

    def record_success(self) -> None:
        if self.consecutive_failures:
            self.consecutive_failures = 0

    def record_failure(self, reason: str) -> bool:
        """Count a failure; True when this one took the instance out."""
        self.consecutive_failures += 1
        self.last_error = reason
        if self._healthy and self.consecutive_failures >= self._failures_to_down:
            self.healthy = False
            log.warning("instance %s marked down: %s", self.id, reason)
            return True
        return False

    def answered_since(self, t: float) -> bool:
        """It sent bytes on the request path after monotonic time ``t``: a timeout that began then
        is a busy instance's, not a dead one's, and does not count toward taking it out. Strictly
        after, so a stream that went quiet at ``t`` (its own last bytes set ``heard_at`` to ``t``)
        asks whether *others* were answered since."""
        return self.heard_at > t

    def record_probe_success(self) -> None:
        self.consecutive_failures = 0
        if not self._healthy:
            self.healthy = True
            log.info("instance %s back up", self.id)

    def apply_metrics(self, metrics: RuntimeMetrics, now: float) -> None:
        self.scraped_at = now
        if metrics != self.metrics:
            self.metrics = metrics
            self._view = None

    # -- what policies and operators read -----------------------------------------------------
    def view(self) -> InstanceView:
        v = self._view
        if v is None:
            m = self.metrics
            c = self.config
            v = self._view = InstanceView(
                instance_id=self.id,
                model=self.model,
                gpu=c.gpu,
                ready=not self._draining,
                healthy=self._healthy,
                outstanding_requests=self.in_flight,
                outstanding_tokens=self.in_flight_tokens,
                running=int(m.running),
                waiting=int(m.waiting),
                kv_usage=m.kv_usage,
                kv_capacity_tokens=c.kv_capacity_tokens or m.kv_capacity_tokens,
                price_per_hour=c.price_per_hour,
                labels=self.labels,
            )
        return v

    def describe(self) -> dict[str, Any]:
        """The view plus scrape details, as plain data for ``GET /v1/instances``."""
        m = self.metrics
        out: dict[str, Any] = msgspec.to_builtins(self.view(), enc_hook=dict)
        out.update(
            url=self.config.url,
            kind=self.config.kind,
            prefix_cache_queries=m.prefix_cache_queries,
            prefix_cache_hits=m.prefix_cache_hits,
            scraped_at=self.scraped_at,
            consecutive_failures=self.consecutive_failures,
            last_error=self.last_error,
        )
        return out


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
        self._by_id = {c.id: Upstream(c, health, self.generation) for c in instances}
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

    # -- membership (the autoscaler's registry) ------------------------------------------------
    def add(self, config: InstanceConfig) -> Upstream:
        """Start routing to a new instance (an autoscaler activated it)."""
        if config.id in self._by_id:
            raise ValueError(f"instance {config.id!r} is already in the pool")
        u = Upstream(config, self._health, self.generation)
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
        self._tasks.append(asyncio.create_task(self._every(self._health.interval_s, self.probe_all)))
        if self._scrape.enabled:
            self._tasks.append(asyncio.create_task(self._every(self._scrape.interval_s, self.scrape_all)))

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._probing.values(), *self._scraping.values()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    async def _every(self, interval_s: float, job: Callable[[], Any]) -> None:
        while True:
            started = time.monotonic()
            try:
                await job()
            except Exception:  # a background loop must outlive any one bad round
                log.exception("background job %s failed", getattr(job, "__name__", job))
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))

    async def probe_all(self) -> None:
        await _round(self.probe, self._by_id.values(), self._probing, self._health.interval_s)

    async def scrape_all(self) -> None:
        ups = [u for u in self._by_id.values() if METRIC_NAMES[u.config.kind]]
        await _round(self.scrape, ups, self._scraping, self._scrape.interval_s)

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
                    return False
                text = await resp.text()
            metrics = parse_runtime_metrics(text, METRIC_NAMES[upstream.config.kind])
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            log.debug("scrape of %s failed: %s", upstream.id, exc)
            return False
        upstream.apply_metrics(metrics, time.time())
        return True


async def _round(
    job: Callable[[Upstream], Coroutine[Any, Any, bool]],
    upstreams: Iterable[Upstream],
    running: dict[str, asyncio.Task[bool]],
    wait_s: float,
) -> None:
    """One round of checks: ``job`` for every instance not still busy with its last one, waited
    for at most ``wait_s``. A slow instance finishes its check in the background and skips rounds
    meanwhile, so it delays nobody else's (a hung instance used to hold every view back by a timeout)."""
    tasks = []
    for u in upstreams:
        task = running.get(u.id)
        if task is None:
            task = running[u.id] = asyncio.create_task(job(u))
            task.add_done_callback(functools.partial(_check_done, running, u.id))
        tasks.append(task)
    if tasks:
        await asyncio.wait(tasks, timeout=wait_s)


def _check_done(running: dict[str, asyncio.Task[bool]], instance_id: str, task: asyncio.Task[bool]) -> None:
    running.pop(instance_id, None)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("check of %s failed: %r", instance_id, exc, exc_info=exc)
