"""Prefill/decode disaggregation through the gateway over a REAL vLLM CPU pair: a prefill and a
decode instance with vLLM's NixlConnector (``kv_buffer_device: cpu``, NIXL's UCX backend), the KV
moved by NIXL between the two processes.

Needs NIXL where vLLM can import it, which ``scripts/install-vllm.sh`` does not install (so CI skips
this): ``.venv-vllm/bin/pip install --no-deps --target DIR nixl==1.5.1 nixl-cu12==1.5.1`` (241 MB;
the wheels bundle UCX, and nothing of CUDA is used on the CPU) and ``TOKENPLANE_NIXL_PATH=DIR``, or
NIXL installed in ``.venv-vllm`` itself (without ``--no-deps`` pip would also pull a CUDA torch).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parents[1] / "support"
sys.path.insert(0, str(SUPPORT))

from ports import free_port  # noqa: E402
from vllm_server import VllmProcess, scrape_metrics, start_vllm  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

KV = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
PROMPT = "the answer to the question is " * 40


@pytest.fixture(scope="module")
def nixl_env(vllm_python: Path) -> dict[str, str]:
    path = os.environ.get("TOKENPLANE_NIXL_PATH", "")
    env = {"PYTHONPATH": path} if path else {}
    probe = subprocess.run(
        [str(vllm_python), "-c", "import nixl._api"], env={**os.environ, **env}, capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip("NIXL is not importable by vLLM: set TOKENPLANE_NIXL_PATH (see this module's docstring)")
    return env


@pytest.fixture(scope="module")
def pd_pair(vllm_python: Path, tiny_model_dir: Path, nixl_env: dict[str, str]) -> Iterator[list[VllmProcess]]:
    servers = []
    try:
        for i in range(2):
            port = free_port()
            env = {**nixl_env, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
            servers.append(
                start_vllm(
                    vllm_python,
                    tiny_model_dir,
                    port,
                    cpu_bind=str(i % (os.cpu_count() or 1)),
                    extra_args=["--kv-transfer-config", json.dumps(KV)],
                    env=env,
                    log_path=tiny_model_dir.parent / f"vllm-pd-{i}-{port}.log",
                    wait=False,
                )
            )
        for s in servers:
            s.wait_ready(900.0)
        yield servers
    finally:
        for s in servers:
            s.stop()


async def test_gateway_runs_vllms_pd_flow_over_a_real_pair(pd_pair: list[VllmProcess]) -> None:
    import aiohttp
    import openai

    from tokenplane.gateway import create_app, hash_key, parse_config
    from tokenplane.gateway.server import GatewayServer

    prefill, decode = pd_pair
    config = parse_config(
        {
            "tenants": [{"name": "t", "api_keys": [hash_key("sk-pd")]}],
            "models": [{"name": "tiny", "pool": {"kind": "disaggregated"}}],
            "instances": [
                {"id": "prefill-0", "url": prefill.url, "model": "tiny", "kind": "vllm", "role": "prefill"},
                {"id": "decode-0", "url": decode.url, "model": "tiny", "kind": "vllm", "role": "decode"},
            ],
            "health": {"interval_s": 0.2, "failures_to_down": 1},
        }
    )
    server = GatewayServer(create_app(config), "127.0.0.1", 0)
    await server.start()
    url = str(server.make_url("")).rstrip("/")
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-pd", max_retries=0, timeout=120)
    before_p = scrape_metrics(prefill.endpoint.metrics_url)
    before_d = scrape_metrics(decode.endpoint.metrics_url)
    try:
        r = await client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=16, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 16
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=12,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 10
        after_p = scrape_metrics(prefill.endpoint.metrics_url)
        after_d = scrape_metrics(decode.endpoint.metrics_url)
        # the prefill instance generated one token per request; the decode one pulled every
        # prompt token over NIXL instead of computing it
        assert after_p["vllm:generation_tokens_total"] - before_p["vllm:generation_tokens_total"] == 2
        assert (
            after_d["vllm:nixl_xfer_time_seconds_count"]
            - before_d.get("vllm:nixl_xfer_time_seconds_count", 0)
            >= 2
        )
        pulled = (
            after_d["vllm:external_prefix_cache_hits_total"]
            - before_d["vllm:external_prefix_cache_hits_total"]
        )
        assert pulled >= r.usage.prompt_tokens
        async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as m:
            text = await m.text()
        assert 'tokenplane_pd_events_total{event="handover",model="tiny"} 2.0' in text

        prefill.kill()  # the prefill pool is gone: the decode instance serves requests whole
        for _ in range(100):
            await asyncio.sleep(0.2)
            async with (
                aiohttp.ClientSession() as http,
                http.get(url + "/v1/instances", headers={"Authorization": "Bearer sk-pd"}) as resp,
            ):
                views = {d["instance_id"]: d for d in (await resp.json())["data"]}
            if not views["prefill-0"]["healthy"]:
                break
        r = await client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 8
    finally:
        await client.close()
        await server.close()
