"""What the long-running servers (``tokenplane serve``, the emulator) share about their process:
the event loop they run on and what they do to the collector once started."""

from __future__ import annotations

import asyncio
import gc

from aiohttp import web

__all__ = ["freeze_startup_objects", "new_event_loop"]


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
    ``bench/gateway_overhead.py --scenarios decode-c256``). An ``on_startup`` hook."""
    gc.collect()
    gc.freeze()
