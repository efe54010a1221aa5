"""What the long-running processes (``tokenplane serve``, the emulator, the commands that start a
fleet) share about their process: the event loop they run on, what they do to the collector once
started, and how SIGTERM ends them."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

__all__ = [
    "GC_YOUNG_THRESHOLD",
    "MMAP_THRESHOLD_BYTES",
    "Terminated",
    "fix_mmap_threshold",
    "freeze_startup_objects",
    "new_event_loop",
    "run_stoppable",
]

T = TypeVar("T")

MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's initial threshold, fixed: blocks this big or bigger are mapped on their own and unmapped
when freed. glibc otherwise raises the threshold to the size of each mapped block freed (up to
32 MiB), so the prefix index's dict tables (2.5 to 5 MiB at the soak's bound, reallocated as its
entries churn) came from the main heap afterwards, each resize leaving a hole RSS kept: the calm
soak gateway's main heap grew 23.9 -> 31.6 MiB in steps between minutes 35 and 38 with its Python
heap flat. A PrefixIndex alone, churned at that bound (3 x 28,386 blocks, 200,000 random soak
prompts), grew its main heap 17 -> 30 MiB after it was full with glibc's default, and stayed at
2.6 MiB (total RSS 10 MiB less) with the threshold fixed."""


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold (see :data:`MMAP_THRESHOLD_BYTES`); ``False`` off glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # glibc's M_MMAP_THRESHOLD
    return bool(mallopt(m_mmap_threshold, threshold))


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
    fix_mmap_threshold()
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


class Terminated(Exception):
    """SIGTERM ended the run; its clean-up ran."""

    def __init__(self) -> None:
        super().__init__("stopped by SIGTERM; the processes it started are stopped")


def run_stoppable(
    main: Coroutine[Any, Any, T], *, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
) -> T:
    """``asyncio.run(main)``, with SIGTERM cancelling ``main`` as Ctrl-C does.

    The commands that start a fleet (``tokenplane up``, ``rehearse``) run each emulator and
    gateway in a session of its own (so that stopping one stops its whole process group); a
    SIGTERM to the command reaches none of them, and Python's default action ends the command
    without its ``finally`` blocks, so every process it started went on running. Raises
    :class:`Terminated` once the clean-up has run."""
    terminated = False

    async def guarded() -> T:
        nonlocal terminated
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_term() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows' loop
            loop.add_signal_handler(signal.SIGTERM, on_term)
        try:
            return await main
        finally:
            with contextlib.suppress(NotImplementedError):
                loop.remove_signal_handler(signal.SIGTERM)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            return runner.run(guarded())
        except asyncio.CancelledError:
            if terminated:
                raise Terminated from None
            raise
