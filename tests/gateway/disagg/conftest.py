"""A disaggregated fleet on loopback: emulated prefill and decode instances (in-process, each with
vLLM's NixlConnector flow, ``--kv-transfer-config``) behind a real gateway whose model's pool is
``disaggregated``; the official ``openai`` client is the caller."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import openai
import pytest

from tokenplane.emulator import EmulatorSettings, start_emulator
from tokenplane.emulator.kv_transfer import KvTransferConfig
from tokenplane.gateway import create_app, hash_key, parse_config
from tokenplane.gateway.server import GatewayServer

KEY = "sk-pd-test"
MODEL = "llama-3-8b"


@dataclass
class Emu:
    name: str
    url: str
    runner: Any
    http: aiohttp.ClientSession
    stopped: bool = False

    async def faults(self, **body: Any) -> None:
        async with self.http.post(self.url + "/admin/faults", json=body) as r:
            assert r.status == 200, await r.text()

    async def metric(self, name: str) -> float:
        """One sample's value (summed over label sets) from ``/metrics``."""
        async with self.http.get(self.url + "/metrics") as r:
            text = await r.text()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()


@dataclass
class PdFleet:
    prefill: list[Emu]
    decode: list[Emu]
    server: GatewayServer
    http: aiohttp.ClientSession
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def client(self) -> openai.AsyncOpenAI:
        c = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0, timeout=20)
        self.clients.append(c)
        return c

    async def get(self, path: str) -> Any:
        async with self.http.get(self.url + path, headers={"Authorization": f"Bearer {KEY}"}) as r:
            return await r.json()

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with self.http.post(self.url + path, data=msgspec.json.encode(body), headers=headers) as r:
            return r.status, msgspec.json.decode(await r.read())

    async def events(self) -> dict[str, float]:
        """``tokenplane_pd_events_total`` by event."""
        async with self.http.get(self.url + "/metrics") as r:
            text = await r.text()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("tokenplane_pd_events_total{"):
                event = line.split('event="', 1)[1].split('"', 1)[0]
                out[event] = out.get(event, 0.0) + float(line.rsplit(" ", 1)[1])
        return out


def pd_config(prefill: list[Emu], decode: list[Emu], **sections: Any) -> dict[str, Any]:
    pool = {"kind": "disaggregated", **sections.pop("pool", {})}
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "tenants": [{"name": "acme", "priority": "interactive", "api_keys": [hash_key(KEY)]}],
        "models": [{"name": MODEL, "pool": pool}],
        "instances": [
            {"id": e.name, "url": e.url, "model": MODEL, "kind": "emulated", "role": role}
            for role, emus in (("prefill", prefill), ("decode", decode))
            for e in emus
        ],
        "scrape": {"interval_s": 0.05},
        "health": {"interval_s": 0.05, "failures_to_down": 1000},
        **sections,
    }


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def pd_fleet(anyio_backend: str) -> AsyncIterator[Callable[..., Awaitable[PdFleet]]]:
    emus: list[Emu] = []
    fleets: list[PdFleet] = []
    http = aiohttp.ClientSession()

    async def emulator(name: str, connector: bool) -> Emu:
        s = EmulatorSettings(
            speed=50.0,
            fixed_step_s=0.02,
            instance_id=name,
            kv_transfer=KvTransferConfig() if connector else None,
        )
        runner, url = await start_emulator(s)
        e = Emu(name, url, runner, http)
        emus.append(e)
        return e

    async def make(
        prefill: int = 2,
        decode: int = 2,
        *,
        connector: bool = True,
        process_prefill: str | None = None,
        **sections: Any,
    ) -> PdFleet:
        """``process_prefill``: the URL of an emulator process, first of the prefill instances."""
        pre = [Emu("p0", process_prefill, None, http, stopped=True)] if process_prefill else []
        pre += [await emulator(f"p{i + len(pre)}", connector) for i in range(prefill)]
        dec = [await emulator(f"d{i}", True) for i in range(decode)]
        server = GatewayServer(create_app(parse_config(pd_config(pre, dec, **sections))), "127.0.0.1", 0)
        await server.start()
        fleet = PdFleet(pre, dec, server, http)
        fleets.append(fleet)
        return fleet

    yield make
    for f in fleets:
        for c in f.clients:
            await c.close()
        with contextlib.suppress(Exception):
            await f.server.close()
    for e in emus:
        await e.stop()
    await http.close()
