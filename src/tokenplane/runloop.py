"""What the long-running servers (``tokenplane serve``, the emulator) share about their process:
the event loop they run on and what they do to the collector once started."""

from __future__ import annotations

import asyncio
import gc

from aiohttp import web

__all__ = ["GC_YOUNG_THRESHOLD", "freeze_startup_objects", "new_event_loop"]

GC_YOUNG_THRESHOLD = 20_000
"""The youngest generation's threshold once serving (CPython's default is 700). The count is of
container objects alive since the last collection; a server's requests in flight keep more than 700
alive at once (~46 each in the gateway: 32 requests in flight are ~1,500), so at the default it
collected every ~30 requests, walking them all: ~9 µs of CPU per request (measured with a
``gc.callbacks`` probe under ``bench/gateway_overhead.py --scenarios ns-c32``). Above the working
set in flight, only objects that outlive their request (long-lived state, cyclic garbage) bring the
next collection: in that run about one per 10,000 requests, of ~7 ms (at 50,000 it was ~18 ms; a
bound on the pause as much as on memory: garbage waits at most that many objects to be freed)."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (it is a dependency off Windows), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def freeze_startup_objects(app: web.Application) -> None:
    """Move everything alive after start-up (modules, config, tables) out of the collector's reach:
    a full collection over them paused every stream for about 100 ms under load (measured with
    ``bench/gateway_overhead.py --scenarios decode-c256``); and raise the young generation's
    threshold (:data:`GC_YOUNG_THRESHOLD`). An ``on_startup`` hook."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
