"""Background check rounds (health probes, metric scrapes) over a pool's instances.

A round starts ``job`` for every instance not still busy with its last one and waits for at most
``wait_s``. A slow instance finishes its check in the background and skips rounds meanwhile, so it
delays nobody else's (a hung instance used to hold every view back by a timeout).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=_HasId)


async def every(interval_s: float, job: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``job`` every ``interval_s`` (start to start) until cancelled; a failed round is logged."""
    while True:
        started = time.monotonic()
        try:
            await job()
        except Exception:  # a background loop must outlive any one bad round
            log.exception("background job %s failed", getattr(job, "__name__", job))
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))


async def check_round(
    job: Callable[[T], Coroutine[Any, Any, bool]],
    items: Iterable[T],
    running: dict[str, asyncio.Task[bool]],
    wait_s: float,
) -> None:
    """One round of ``job`` over ``items`` (see the module docstring); ``running``: the checks
    still under way, by instance id (kept across rounds)."""
    tasks = []
    for u in items:
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
