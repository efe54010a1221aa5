"""What one poll of the gateway saw (:class:`TopSnapshot`), and the poll itself (:func:`snapshot`).

A poll reads ``GET /v1/instances`` and ``GET /metrics`` concurrently; the Prometheus text is parsed
into :class:`Family` objects with :mod:`prometheus_client.parser`. Failures end up in the
snapshot's ``errors``, never raised, so a frame can still be drawn from half an answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    """One sample line: its full name (``_total``, ``_bucket``... included), labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Family:
    """One metric family (name without ``_total`` for counters, as the parser gives it)."""

    name: str
    type: str
    samples: tuple[Sample, ...]


@dataclass
class TopSnapshot:
    """What one poll of the gateway saw."""

    gateway_url: str
    taken_at: float  # time.monotonic() at the end of the poll
    wall_time: float  # time.time(), for display
    instances: list[dict[str, Any]] = field(default_factory=list)
    families: dict[str, Family] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    instances_ok: bool = False
    metrics_ok: bool = False

    @property
    def reachable(self) -> bool:
        return self.instances_ok or self.metrics_ok

    def samples(self, sample_name: str) -> list[Sample]:
        """Every sample with exactly this name (e.g. ``tokenplane_requests_total``)."""
        out: list[Sample] = []
        for name in dict.fromkeys((family_name(sample_name), sample_name)):
            family = self.families.get(name)
            if family is not None:
                out += [s for s in family.samples if s.name == sample_name]
        return out


def family_name(sample_name: str) -> str:
    """The family a sample belongs to: its name less ``_total``, ``_bucket``, ``_count``..."""
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


def parse_metrics(text: str) -> dict[str, Family]:
    """Prometheus text exposition → families by name (``_created`` samples dropped)."""
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        samples = tuple(
            Sample(s.name, dict(s.labels), float(s.value))
            for s in fam.samples
            if not s.name.endswith("_created")
        )
        if not samples and fam.name.endswith("_created"):
            continue  # the client library's creation timestamps, parsed as families of their own
        seen = out.get(fam.name)
        if seen is not None:  # untyped samples come one family per line: gather them
            out[fam.name] = Family(fam.name, seen.type, seen.samples + samples)
        else:
            out[fam.name] = Family(fam.name, fam.type, samples)
    return out


async def _get(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> tuple[int, str]:
    async with session.get(url, headers=headers) as resp:
        return resp.status, await resp.text()


async def snapshot(
    gateway_url: str,
    *,
    session: aiohttp.ClientSession | None = None,
    api_key: str | None = None,
    timeout_s: float = 5.0,
) -> TopSnapshot:
    """Poll ``/v1/instances`` and ``/metrics`` once; failures end up in ``errors``, never raised."""
    base = gateway_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    own = session is None
    sess = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    snap = TopSnapshot(gateway_url=base, taken_at=0.0, wall_time=0.0)
    try:
        results = await asyncio.gather(
            _get(sess, base + "/v1/instances", headers),
            _get(sess, base + "/metrics", headers),
            return_exceptions=True,
        )
    finally:
        if own:
            await sess.close()
    snap.taken_at = time.monotonic()
    snap.wall_time = time.time()
    inst, metrics = results
    if isinstance(inst, BaseException):
        snap.errors.append(f"/v1/instances: {_describe_error(inst)}")
    elif inst[0] != 200:
        snap.errors.append(f"/v1/instances: HTTP {inst[0]}")
    else:
        try:
            doc = json.loads(inst[1])
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, list):
                raise ValueError("no 'data' list")
            snap.instances = [d for d in data if isinstance(d, dict)]
            snap.instances_ok = True
        except ValueError as exc:
            snap.errors.append(f"/v1/instances: unreadable answer ({exc})")
    if isinstance(metrics, BaseException):
        snap.errors.append(f"/metrics: {_describe_error(metrics)}")
    elif metrics[0] != 200:
        snap.errors.append(f"/metrics: HTTP {metrics[0]}")
    else:
        try:
            snap.families = parse_metrics(metrics[1])
            snap.metrics_ok = True
        except ValueError as exc:
            snap.errors.append(f"/metrics: unreadable exposition ({exc})")
    return snap


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
