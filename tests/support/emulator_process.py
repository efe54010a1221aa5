"""An emulator as a real process (``python -m tokenplane.emulator``): a free port to give it, and
waiting until it answers ``/health``."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
