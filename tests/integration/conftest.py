"""Fixtures that run two REAL vLLM (CPU) servers with a tiny model made at test time.

vLLM lives in its own venv (scripts/install-vllm.sh makes `<repo>/.venv-vllm`); `TOKENPLANE_VLLM_PYTHON`
points elsewhere. Without one, every test that uses these fixtures is skipped.

Reuse (for gateway tests in this folder):
  - `vllm_endpoints`: list of `VllmEndpoint(url, metrics_url)`; `url` is the server root
    (`http://127.0.0.1:PORT`, the OpenAI API is under `/v1`), `metrics_url` its `/metrics`.
  - `vllm_instances`: the `VllmProcess` objects (kill(), restart(), memory_bytes(), log_tail()).
  - `vllm_model`: the served model name ("tiny"); `tiny_model_dir`: the model folder.
A test that kills an instance needn't restart it: the autouse `_vllm_instances_alive` fixture restarts
dead instances (same port) before the next test that uses them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
sys.path.insert(0, str(SUPPORT))

from patience import Patience  # noqa: E402
from ports import free_port  # noqa: E402
from vllm_server import VllmEndpoint, VllmProcess, start_vllm  # noqa: E402

SERVED_NAME = "tiny"
N_INSTANCES = 2
START_TIMEOUT_S = 180.0

_report: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: starts real vLLM CPU servers (scripts/install-vllm.sh)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _report:
        terminalreporter.section("real vLLM instances")
        for line in _report:
            terminalreporter.write_line(line)


def _memory(server: VllmProcess) -> str:
    mem = server.memory_bytes()
    return f"PSS {mem['pss'] / 2**30:.2f} GiB, RSS {mem['rss'] / 2**30:.2f} GiB (process group)"


def _find_vllm_python() -> Path | None:
    env = os.environ.get("TOKENPLANE_VLLM_PYTHON")
    if env:
        if not os.access(env, os.X_OK):
            pytest.fail(f"TOKENPLANE_VLLM_PYTHON={env} is not an executable")
        return Path(env)
    default = REPO / ".venv-vllm" / "bin" / "python"
    return default if default.exists() else None


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = _find_vllm_python()
    if python is None:
        pytest.skip("real vLLM not installed: run scripts/install-vllm.sh")
    return python


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vllm") / "tiny-model"
    t0 = time.monotonic()
    subprocess.run(
        [str(vllm_python), str(SUPPORT / "tiny_model.py"), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    _report.append(f"tiny model built in {time.monotonic() - t0:.1f} s at {out}")
    return out


@pytest.fixture(scope="session")
def vllm_model() -> str:
    return SERVED_NAME


@pytest.fixture(scope="session")
def vllm_instances(vllm_python: Path, tiny_model_dir: Path) -> Iterator[list[VllmProcess]]:
    logs = tiny_model_dir.parent
    servers: list[VllmProcess] = []
    t0 = time.monotonic()
    try:
        # Spawn all, then wait: the two start side by side, one core each.
        ports: set[int] = set()
        for i in range(N_INSTANCES):
            port = free_port()
            while port in ports:  # the first server has not bound its port yet
                port = free_port()
            ports.add(port)
            servers.append(
                start_vllm(
                    vllm_python,
                    tiny_model_dir,
                    port,
                    served_name=SERVED_NAME,
                    cpu_bind=str(i % (os.cpu_count() or 1)),
                    log_path=logs / f"vllm-{i}-{port}.log",
                    wait=False,
                )
            )
        for server in servers:
            server.wait_ready(START_TIMEOUT_S)
        _report.append(
            f"{N_INSTANCES} instances ready in {time.monotonic() - t0:.1f} s "
            f"({', '.join(f'{s.ready_after_s:.1f} s' for s in servers)}); logs in {logs}"
        )
        for i, server in enumerate(servers):
            _report.append(f"instance {i} ({server.url}) after start: {_memory(server)}")
        yield servers
        for i, server in enumerate(servers):
            if server.alive():
                _report.append(f"instance {i} ({server.url}) at session end: {_memory(server)}")
    finally:
        t1 = time.monotonic()
        for server in servers:
            server.stop()
        if servers:
            _report.append(f"stopped in {time.monotonic() - t1:.1f} s")


@pytest.fixture(autouse=True)
def _vllm_instances_alive(request: pytest.FixtureRequest) -> None:
    """Restart (same port) any instance an earlier test killed, before a test that uses them."""
    if not {"vllm_instances", "vllm_endpoints"} & set(request.fixturenames):
        return
    servers: list[VllmProcess] = request.getfixturevalue("vllm_instances")
    for server in servers:
        if not server.healthy():
            t0 = time.monotonic()
            server.restart(START_TIMEOUT_S)
            _report.append(f"restarted {server.url} in {time.monotonic() - t0:.1f} s")


@pytest.fixture(scope="session")
def vllm_endpoints(vllm_instances: list[VllmProcess]) -> list[VllmEndpoint]:
    return [s.endpoint for s in vllm_instances]


# --- The gateway, in-process, in front of the real instances (tests/integration/test_gateway_vllm.py) --

GATEWAY_KEY = "sk-integration-tenant"
GATEWAY_ALIAS = "tiny-chat"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class VllmGateway:
    """The gateway under ``GatewayServer`` (as ``serve`` and tests/gateway run it), instance ids
    ``vllm-0``, ``vllm-1`` in the order of `vllm_endpoints`; one tenant whose raw key is ``key``."""

    def __init__(self, server: Any, http: Any, endpoints: list[VllmEndpoint]) -> None:
        self.server = server
        self.http = http
        self.endpoints = endpoints
        self.ids = [f"vllm-{i}" for i in range(len(endpoints))]
        self.key = GATEWAY_KEY
        self.alias = GATEWAY_ALIAS
        self.clients: list[Any] = []

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def client(self, timeout: float = 60.0) -> Any:
        import openai

        c = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0, timeout=timeout)
        self.clients.append(c)
        return c

    async def _get(self, path: str) -> Any:
        async with self.http.get(self.url + path, headers={"Authorization": f"Bearer {self.key}"}) as r:
            assert r.status == 200, f"{path}: {r.status} {await r.text()}"
            return await r.json() if r.content_type == "application/json" else await r.text()

    async def instances(self) -> dict[str, dict[str, Any]]:
        """``GET /v1/instances`` keyed by instance id."""
        return {d["instance_id"]: d for d in (await self._get("/v1/instances"))["data"]}

    async def health(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._get("/health")
        return result

    async def requests_by_reason(self) -> dict[tuple[str, str], float]:
        """``tokenplane_requests_total`` from the gateway's ``/metrics``, keyed by (outcome, reason)."""
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[tuple[str, str], float] = {}
        for fam in text_string_to_metric_families(await self._get("/metrics")):
            for s in fam.samples:
                if s.name == "tokenplane_requests_total":
                    key = (s.labels["outcome"], s.labels["reason"])
                    out[key] = out.get(key, 0.0) + s.value
        return out


def vllm_gateway_config(endpoints: list[VllmEndpoint], model: str) -> dict[str, Any]:
    from tokenplane.gateway import hash_key

    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "tenants": [{"name": "integration", "priority": "interactive", "api_keys": [hash_key(GATEWAY_KEY)]}],
        "models": [{"name": model, "aliases": [GATEWAY_ALIAS], "router": {"name": "prefix-affinity"}}],
        "instances": [
            {"id": f"vllm-{i}", "url": ep.url, "model": model, "kind": "vllm", "gpu": "cpu"}
            for i, ep in enumerate(endpoints)
        ],
        # A CPU vLLM decoding a burst can take longer than the default 5 s to answer /metrics on 2
        # cores; a timed-out scrape leaves the view as it was before the burst.
        "scrape": {"interval_s": 0.5, "timeout_s": 30.0},
        # A CPU vLLM busy with a burst can take seconds to answer /health on 2 cores.
        "health": {"interval_s": 1.0, "failures_to_down": 2, "timeout_s": 5.0},
    }


@pytest.fixture
async def vllm_gateway(
    anyio_backend: str, vllm_endpoints: list[VllmEndpoint], vllm_model: str
) -> AsyncIterator[VllmGateway]:
    """A fresh gateway (empty prefix index) per test, in the test's event loop, returned once it has
    scraped every instance at least once."""
    import aiohttp

    from tokenplane.gateway import create_app, parse_config
    from tokenplane.gateway.server import GatewayServer

    config = parse_config(vllm_gateway_config(vllm_endpoints, vllm_model))
    server = GatewayServer(create_app(config), "127.0.0.1", 0)
    await server.start()
    gw = VllmGateway(server, aiohttp.ClientSession(), vllm_endpoints)
    try:
        patience = Patience(10)
        while not all(d["scraped_at"] for d in (await gw.instances()).values()):
            assert not patience.spent(), "the gateway never scraped the instances"
            await asyncio.sleep(0.05)
        yield gw
    finally:
        for c in gw.clients:
            await c.close()
        await gw.http.close()
        await server.close()
