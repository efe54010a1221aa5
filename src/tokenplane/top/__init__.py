"""``tokenplane top``: a live terminal view of a running gateway.

Each poll reads two endpoints of the gateway, concurrently:

* ``GET /v1/instances``: every instance's view (readiness, health, in-flight work by this gateway,
  running / waiting and KV usage as last scraped, prefix-cache counters, and whatever later
  features add: breaker state, pool, weight readiness).
* ``GET /metrics``: the gateway's Prometheus text, parsed with :mod:`prometheus_client.parser`.

:func:`render` turns a :class:`TopSnapshot` and the one before it into rich tables. Rates are
deltas between the two polls divided by the time between them; a counter that went down (the
gateway restarted) counts from zero. Latency percentiles are estimated from the histogram buckets'
deltas, interpolating linearly inside a bucket as Prometheus' ``histogram_quantile`` does. Without
a previous snapshot the cumulative values since the gateway started are shown instead.

The package holds the poll (:mod:`.snapshot`), the counter and histogram arithmetic between two
polls (:mod:`.deltas`), one frame's tables (:mod:`.tables`) and, here, the command that loops them.

Missing fields and metric families are tolerated: a column or table that has nothing to show says
so or is left out. Families the tables do not know (``tokenplane_queue_*``,
``tokenplane_breaker_*``, ``tokenplane_autoscaler_*``, retries, continuations, cost...) are listed
in a generic "control loop and other signals" table, counters as rates, histograms as rate, mean
and p99, gauges as values, so new features show up without a change here.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp

from tokenplane.top.deltas import histogram_quantile
from tokenplane.top.snapshot import Family, Sample, TopSnapshot, parse_metrics, snapshot
from tokenplane.top.tables import DEFAULT_SLO_TTFT_S, render

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "DEFAULT_SLO_TTFT_S",
    "Family",
    "Sample",
    "TopSnapshot",
    "histogram_quantile",
    "parse_metrics",
    "render",
    "snapshot",
    "top",
]


async def _run(gateway: str, interval: float, once: bool, console: Console, api_key: str | None) -> int:
    from rich.live import Live

    interval = max(interval, 0.05)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(5.0, interval))) as session:
        first = await snapshot(gateway, session=session, api_key=api_key)
        if once:
            if first.reachable:
                await asyncio.sleep(interval)
                second = await snapshot(gateway, session=session, api_key=api_key)
                console.print(render(second, first))
                return 0 if second.reachable else 1
            console.print(render(first))
            return 1
        prev = first
        with Live(render(first), console=console, auto_refresh=False, screen=False) as live:
            while True:
                await asyncio.sleep(interval)
                snap = await snapshot(gateway, session=session, api_key=api_key)
                live.update(render(snap, prev), refresh=True)
                prev = snap


def top(
    gateway: str,
    interval: float = 1.0,
    once: bool = False,
    *,
    console: Console | None = None,
    api_key: str | None = None,
) -> None:
    """Show the gateway live until Ctrl-C; with ``once``, one frame (two polls ``interval`` apart).

    With ``once`` an unreachable gateway exits with status 1 (``SystemExit``).
    """
    from rich.console import Console

    console = console or Console()
    try:
        code = asyncio.run(_run(gateway, interval, once, console, api_key))
    except KeyboardInterrupt:
        return
    if code:
        raise SystemExit(code)
