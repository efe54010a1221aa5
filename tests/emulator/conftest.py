"""Helpers shared by the emulator tests, handed out through the ``emu`` fixture.

Every test runs its own event loop (``asyncio.run``) with an in-process emulator on a free loopback
port; ``--speed`` is high so that simulated GPU time costs little wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.emulator import EmulatedInstance, EmulatorSettings, instance_of, start_emulator

MODEL = "llama-3-8b"


class Emu:
    def __init__(self, url: str, instance: EmulatedInstance, http: aiohttp.ClientSession) -> None:
        self.url = url
        self.instance = instance
        self.http = http
        self.client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)

    async def faults(self, **body: Any) -> dict[str, Any]:
        async with self.http.post(self.url + "/admin/faults", json=body) as r:
            assert r.status == 200, await r.text()
            data: dict[str, Any] = await r.json()
            return data

    async def metrics(self) -> dict[str, float]:
        """Sample name (labels other than model_name/engine appended) -> value."""
        async with self.http.get(self.url + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                extra = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
                key = s.name + ("" if not extra else str(sorted(extra.items())))
                out[key] = s.value
        return out


@contextlib.asynccontextmanager
async def emulator(**kw: Any) -> AsyncIterator[Emu]:
    kw.setdefault("speed", 20.0)
    runner, url = await start_emulator(EmulatorSettings(**kw))
    http = aiohttp.ClientSession()
    emu = Emu(url, instance_of(runner.app), http)
    try:
        yield emu
    finally:
        await emu.client.close()
        await http.close()
        await runner.cleanup()


def run(fn: Callable[[Emu], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        async with emulator(**kw) as emu:
            await asyncio.wait_for(fn(emu), 20)

    asyncio.run(main())


@pytest.fixture(scope="session")
def emu() -> SimpleNamespace:
    return SimpleNamespace(run=run, emulator=emulator, MODEL=MODEL)
