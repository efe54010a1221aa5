"""Move: a per-model fallback chain to a smaller or cheaper pool.

``models[].fallback`` lists other models in order, each with ``when`` (``overloaded``,
``quality_ok``) and the ``quality`` it offers (``any`` < ``standard`` < ``best``). A request may
carry a quality class: header ``x-tokenplane-quality`` or ``metadata.quality`` in the body
(``any``, ``standard``, ``best``; an unknown value is ignored). The first link that applies wins:

* ``quality_ok``: the request states a class the link's quality meets (``any`` accepts every
  link, ``standard`` a ``standard`` one, ``best`` none that is not ``best``), and the link's pool
  has room. Without a stated class no request moves for quality.
* ``overloaded``: the primary pool has no usable instance, or no free slot (the request would
  queue, or be refused), and the link's pool has room; a request whose stated class the link does
  not meet stays (and queues, or is refused, as it would have been).

The tenant must be allowed to use the fallback model. The answer's ``model`` field is the one the
fallback's instances give (the model that served it), the response carries
``x-tokenplane-served-by: <model>``, and ``tokenplane_fallbacks_total{from,to,reason}`` counts moves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from tokenplane.gateway.config import FallbackConfig

QUALITY_HEADER = "x-tokenplane-quality"
SERVED_BY_HEADER = "x-tokenplane-served-by"
SERVED_BY_KEY: Any = (  # web.RequestKey from aiohttp 3.12 on; a plain string before
    web.RequestKey("tokenplane_served_by", str) if hasattr(web, "RequestKey") else "tokenplane_served_by"
)
"""Where the handler notes, on its request, the model a fallback moved the request to."""


def served_by_header(request: Any) -> dict[str, str] | None:
    """The header naming the model that served a request moved down its chain, if it was moved."""
    served = request.get(SERVED_BY_KEY)
    return None if served is None else {SERVED_BY_HEADER: served}


QUALITY_RANK: Mapping[str, int] = {"any": 0, "standard": 1, "best": 2}


def quality_of(headers: Mapping[str, str], body: dict[str, Any]) -> int | None:
    """The request's stated quality rank, or ``None`` when it states none (or an unknown one)."""
    raw = headers.get(QUALITY_HEADER)
    if raw is None:
        meta = body.get("metadata")
        raw = meta.get("quality") if isinstance(meta, dict) else None
    if not isinstance(raw, str):
        return None
    return QUALITY_RANK.get(raw.strip().lower())


class FallbackMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.counter = Counter(
            "tokenplane_fallbacks",
            "Requests served by a fallback model, by reason",
            ["from", "to", "reason"],
            registry=registry,
        )


class FallbackChain:
    """One model's chain; :meth:`choose` names the model to serve a request, or ``None`` to stay."""

    def __init__(
        self,
        model: str,
        links: Sequence[FallbackConfig],
        free: Callable[[str], int],
        metrics: FallbackMetrics,
    ) -> None:
        self.model = model
        self.links = [(link.model, frozenset(link.when), QUALITY_RANK[link.quality]) for link in links]
        self._free = free
        self._metrics = metrics

    def choose(self, quality: int | None, may_use: Callable[[str], bool]) -> tuple[str, str] | None:
        """(fallback model, reason), or ``None`` to stay on the primary."""
        overloaded: bool | None = None
        for target, when, offered in self.links:
            if quality is not None and quality > offered:
                continue
            if not may_use(target) or self._free(target) <= 0:
                continue
            if quality is not None and "quality_ok" in when:
                return self._moved(target, "quality_ok")
            if "overloaded" in when:
                if overloaded is None:
                    overloaded = self._free(self.model) <= 0
                if overloaded:
                    return self._moved(target, "overloaded")
        return None

    def _moved(self, target: str, reason: str) -> tuple[str, str]:
        self._metrics.counter.labels(self.model, target, reason).inc()
        return target, reason
