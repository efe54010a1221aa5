"""An emulator as a real process (``python -m tokenplane.emulator``): waiting until it answers
``/health`` (its port: ``ports.free_port``)."""

from __future__ import annotations

import asyncio
import subprocess
import time

import aiohttp


async def wait_ready(url: str, proc: subprocess.Popen[bytes], limit_s: float) -> None:
    """Until ``url``'s ``/health`` answers 200; fails if the process exits or ``limit_s`` passes."""
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "emulator exited early"
            try:
                async with http.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError("emulator did not become ready")
