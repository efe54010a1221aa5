"""One instance as the gateway sees it: :class:`Upstream` (its pool, which keeps it fresh, is in
:mod:`~tokenplane.gateway.upstreams`).

Four signals feed one :class:`~tokenplane.core.views.InstanceView` per instance:

* the gateway's own accounting of requests and tokens it has sent and not seen finish (updated on
  the request path; the freshest signal, and the only one that sees this gateway's burst);
* the runtime's Prometheus metrics, scraped every ``scrape.interval_s`` and read by the instance
  kind's adapter (:mod:`tokenplane.gateway.runtimes`: running, waiting, KV use and size, prefix-cache
  counters);
* health: ``GET health.path`` every ``health.interval_s``. ``failures_to_down`` consecutive
  failures (a failed probe or a failed request) take an instance out; one successful probe brings
  it back;
* observed times to first token, per model pool (:class:`PoolTtft`).

They also fill the seven-axis fields (``weights``, ``hbm_free_bytes``, ``predicted_ttft_s``): see
:mod:`tokenplane.gateway.view_signals` for how.

The view is cached: a request's begin and end copy it with new counts; a change of health,
draining, metrics, weights or the TTFT model rebuilds it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from tokenplane.core.views import InstanceView
from tokenplane.gateway.config import HealthConfig, InstanceConfig
from tokenplane.gateway.runtimes import Runtime, RuntimeMetrics, runtime_for
from tokenplane.gateway.view_signals import COLD, WARM, WARMING, PoolTtft, free_kv_bytes

log = logging.getLogger("tokenplane.gateway.upstreams")  # the name operators' log filters know

_replace = msgspec.structs.replace


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
        "_base",
        "_draining",
        "_failures_to_down",
        "_generation",
        "_healthy",
        "_ttft",
        "_ttft_seen",
        "_view",
        "_weights",
        "chat_head",
        "chat_url",
        "completions_head",
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
        "kv_bytes_per_token",
        "labels",
        "last_error",
        "metrics",
        "metrics_url",
        "model",
        "peer_in_flight",
        "runtime",
        "scrape_failures",
        "scrape_streak",
        "scraped_at",
    )

    def __init__(
        self,
        config: InstanceConfig,
        health: HealthConfig,
        generation: Generation | None = None,
        *,
        ttft: PoolTtft | None = None,
        kv_bytes_per_token: int = 0,
    ) -> None:
        self._generation = generation if generation is not None else Generation()
        self.config = config
        self.runtime: Runtime = runtime_for(config.kind)
        self._ttft = ttft if ttft is not None else PoolTtft()
        self._ttft_seen = self._ttft.version
        self.kv_bytes_per_token = config.kv_bytes_per_token or kv_bytes_per_token
        self._weights = COLD  # not yet seen serving
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
        # The two completion URLs' heads also by name: the hot path picks them by the URL's
        # identity (``url is chat_url``), without hashing the URL (yarl's __hash__ is a Python call).
        self.chat_head: bytes | None = None
        self.completions_head: bytes | None = None
        base = URL(config.url)
        if base.scheme == "http" and base.host is not None and base.port is not None:
            self.direct = (base.host, base.port)
            fixed = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            for url in (self.chat_url, self.completions_url):
                self.heads[url] = (
                    f"POST {url.raw_path_qs} HTTP/1.1\r\nHost: {base.raw_authority}\r\n{fixed}"
                ).encode("latin-1")
            self.chat_head = self.heads[self.chat_url]
            self.completions_head = self.heads[self.completions_url]
        self.labels: Mapping[str, str] = MappingProxyType(dict(config.labels))
        self._failures_to_down = health.failures_to_down
        self.in_flight = 0
        self.in_flight_tokens = 0
        # the other gateway replicas' (requests, tokens) here, as the state backend last synced them
        self.peer_in_flight = (0, 0)
        self.metrics = RuntimeMetrics()
        self.scraped_at: float | None = None
        self.scrape_failures: dict[str, int] = {}  # failed scrapes by reason, since start
        self.scrape_streak = 0  # failed scrapes since the last one that landed
        self._healthy = True  # optimistic until the first probe; a failed request counts too
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.heard_at = -math.inf  # monotonic time of the last bytes it sent on the request path
        self._draining = False  # set by the autoscaler: finish in-flight work, take no more
        self._view: InstanceView | None = None
        # The view less the request path's own counts: rebuilt only when health, draining, metrics,
        # weights or the pool's TTFT model moved; a request's begin and end only copy it.
        self._base: InstanceView | None = None

    @property
    def healthy(self) -> bool:
        return self._healthy

    @healthy.setter
    def healthy(self, healthy: bool) -> None:
        if healthy != self._healthy:
            self._healthy = healthy
            self._view = self._base = None
            self._generation.bump()

    @property
    def draining(self) -> bool:
        return self._draining

    def set_draining(self, draining: bool) -> None:
        if draining != self._draining:
            self._draining = draining
            self._view = self._base = None
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

    def set_peer_in_flight(self, requests: int, tokens: int) -> None:
        """The other replicas' in-flight work here (:mod:`tokenplane.shared_state.in_flight`)."""
        if (requests, tokens) != self.peer_in_flight:
            self.peer_in_flight = (requests, tokens)
            self._view = self._base = None

    def record_success(self) -> None:
        if self.consecutive_failures:
            self.consecutive_failures = 0
        if self._weights is not WARM:
            self.set_weights(WARM)

    @property
    def weights(self) -> str:
        return self._weights

    def set_weights(self, state: str) -> None:
        """``warm`` | ``warming`` | ``cold``; the autoscaler marks an instance it is starting ``warming``."""
        if state not in (WARM, WARMING, COLD):
            raise ValueError(f"weights state must be warm, warming or cold, got {state!r}")
        state = WARM if state == WARM else WARMING if state == WARMING else COLD  # the interned constant
        if state is not self._weights:
            self._weights = state
            self._view = self._base = None

    def observe_ttft(self, ttft_s: float, waiting_ahead: int | None = None, *, now: float) -> None:
        """A request sent here got its first token ``ttft_s`` after it was sent; ``waiting_ahead``:
        the instance's reported queue when it was sent (default: as last scraped); ``now``: the
        gateway's monotonic clock."""
        waiting = int(self.metrics.waiting) if waiting_ahead is None else waiting_ahead
        self._ttft.observe(ttft_s, waiting, now=now)

    def record_failure(self, reason: str) -> bool:
        """Count a failure; True when this one took the instance out."""
        self.consecutive_failures += 1
        self.last_error = reason
        if self._healthy and self.consecutive_failures >= self._failures_to_down:
            self.healthy = False
            self.set_weights(COLD)
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
        if self._weights is not WARM:
            self.set_weights(WARM)
        if not self._healthy:
            self.healthy = True
            log.info("instance %s back up", self.id)

    def apply_metrics(self, metrics: RuntimeMetrics, now: float) -> None:
        self.scraped_at = now
        self.scrape_streak = 0
        if metrics != self.metrics:
            self.metrics = metrics
            self._view = self._base = None

    # -- what policies and operators read -----------------------------------------------------
    def view(self) -> InstanceView:
        v = self._view
        ttft_version = self._ttft.version
        if v is not None and self._ttft_seen == ttft_version:
            return v
        base = self._base
        if base is None or self._ttft_seen != ttft_version:
            self._ttft_seen = ttft_version
            v = self._base = self._view = self._build()
            return v
        v = self._view = _replace(
            base, outstanding_requests=self.in_flight, outstanding_tokens=self.in_flight_tokens
        )
        return v

    def _build(self) -> InstanceView:
        m = self.metrics
        c = self.config
        capacity = c.kv_capacity_tokens or m.kv_capacity_tokens
        return InstanceView(
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
            kv_capacity_tokens=capacity,
            price_per_hour=c.price_per_hour,
            weights=self._weights,
            hbm_free_bytes=free_kv_bytes(capacity, m.kv_usage, self.kv_bytes_per_token),
            predicted_ttft_s=self._ttft.view_ttft_s(int(m.waiting), self._weights),
            labels=self.labels,
            adapters=m.lora_adapters,
            peer_outstanding_requests=self.peer_in_flight[0],
            peer_outstanding_tokens=self.peer_in_flight[1],
        )

    def describe(self) -> dict[str, Any]:
        """The view plus scrape details, as plain data for ``GET /v1/instances``."""
        m = self.metrics
        out: dict[str, Any] = msgspec.to_builtins(self.view(), enc_hook=dict)
        out.update(
            url=self.config.url,
            kind=self.runtime.kind,
            role=self.config.role,
            prefix_cache_queries=m.prefix_cache_queries,
            prefix_cache_hits=m.prefix_cache_hits,
            scraped_at=self.scraped_at,
            scrape_failures=dict(self.scrape_failures),
            consecutive_failures=self.consecutive_failures,
            last_error=self.last_error,
        )
        return out
