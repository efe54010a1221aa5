"""The servers' process set-up (`tokenplane serve`, the emulator): what it does beyond serving the app."""

from __future__ import annotations

import gc

import pytest
from aiohttp import web

from tokenplane.runloop import GC_YOUNG_THRESHOLD, freeze_startup_objects

pytestmark = pytest.mark.anyio


async def test_startup_objects_are_frozen_out_of_the_collectors_reach() -> None:
    """Full collections under load walk only what was made since start-up, not every module."""
    table = [{"block": i} for i in range(1000)]  # made at start-up, alive for the process's life
    gc.unfreeze()
    before = gc.get_threshold()
    try:
        await freeze_startup_objects(web.Application())
        frozen = gc.get_freeze_count()
        assert frozen > len(table)
        swept = {id(o) for o in gc.get_objects(generation=2)}  # what a full collection walks
        assert not any(id(x) in swept for x in table)
        # requests in flight no longer bring a young collection every few dozen requests
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    import platform

    from tokenplane.runloop import fix_mmap_threshold

    fixed = fix_mmap_threshold()
    if platform.libc_ver()[0] == "glibc":
        assert fixed
