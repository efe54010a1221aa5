"""The process set-up of the servers (`tokenplane serve`, the emulator) beyond serving the app, and
how SIGTERM ends the commands that start a fleet."""

from __future__ import annotations

import asyncio
import gc
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from tokenplane.runloop import GC_YOUNG_THRESHOLD, freeze_startup_objects, run_stoppable


@pytest.mark.anyio
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


STOPPABLE = """
import asyncio, sys
from pathlib import Path
from tokenplane.runloop import Terminated, run_stoppable

async def main() -> None:
    try:
        print("running", flush=True)
        await asyncio.sleep(60)
    finally:
        Path(sys.argv[1]).write_text("cleaned up")

try:
    run_stoppable(main())
except Terminated:
    sys.exit(143)
"""


def test_run_stoppable_returns_what_its_coroutine_returns() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_stoppable(answer()) == 42


def test_sigterm_runs_the_clean_up_and_raises_terminated(tmp_path: Path) -> None:
    """Python's default SIGTERM ends the process without its ``finally`` blocks."""
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.read_text() == "cleaned up"
