"""A real vLLM publishes KV events to the gateway's bound ZMQ endpoint; the exact state follows them.

One extra vLLM instance (not the shared pair) starts with ``--kv-events-config`` pointing at the
endpoint :class:`~tokenplane.gateway.kv_events.KvEventsSubscriber` binds. A prompt is served, its
token ids fetched from the instance's ``/tokenize``, and the subscriber's index must say that
instance holds every full block of it (``BlockStored`` arrived and chained); a ``/reset_prefix_cache``
is not relied on. About 30 s, most of it vLLM's start.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from ports import free_port
from vllm_server import start_vllm

from tokenplane.gateway.kv_events import KvEventsSource, KvEventsSubscriber

pytest.importorskip("zmq")
aiohttp = pytest.importorskip("aiohttp")

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

BLOCK = 32  # the CPU attention backend needs a multiple of 32


async def test_block_stored_events_reach_the_gateway_state(
    vllm_python: Path, tiny_model_dir: Path, vllm_model: str
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sub = KvEventsSubscriber([KvEventsSource("kv0", endpoint, "kv")])
    await sub.start()
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv"}
    port = free_port()
    server = start_vllm(
        vllm_python,
        tiny_model_dir,
        port,
        served_name=vllm_model,
        extra_args=["--kv-events-config", json.dumps(cfg), "--block-size", str(BLOCK)],
        log_path=tiny_model_dir.parent / f"vllm-kv-events-{port}.log",
        wait=False,
    )
    try:
        await asyncio.get_running_loop().run_in_executor(None, server.wait_ready, 180.0)
        base = f"http://127.0.0.1:{port}"
        prompt = "The control plane routes every request to the warmest cache. " * 24
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/tokenize", json={"model": vllm_model, "prompt": prompt}) as r:
                assert r.status == 200, await r.text()
                tokens: list[int] = (await r.json())["tokens"]
            assert len(tokens) >= 4 * BLOCK
            assert sub.index.match_tokens(tokens) == {}  # nothing cached yet
            body = {"model": vllm_model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
            async with http.post(f"{base}/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
        full = len(tokens) // BLOCK * BLOCK
        # vLLM caches the prompt's full blocks (the last prompt token may be recomputed, so allow
        # one block less when the prompt is an exact multiple)
        ok = await sub.wait_for("kv0", lambda c: c.stored >= full // BLOCK - 1, timeout=10.0)
        cache = sub.index.cache("kv0")
        assert ok, (sub.index.snapshot(), server.log_tail())
        assert cache.block_size == BLOCK and cache.gaps == 0 and cache.decode_errors == 0
        hit = sub.index.match_tokens(tokens).get("kv0", 0)
        assert hit >= full - BLOCK, (hit, full, sub.index.snapshot())
        other = [t + 1 if t + 1 < 500 else 3 for t in tokens]  # a prompt it has never seen
        assert sub.index.match_tokens(other) == {}
    finally:
        await asyncio.get_running_loop().run_in_executor(None, server.stop)
        await sub.stop()
