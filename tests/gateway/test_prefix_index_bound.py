"""The gateway's prefix index holds no more blocks for an instance than the instance's KV cache has
room for: older entries name prefixes the engine has evicted, and kept they grow with traffic."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from tokenplane.core.prompt_hash import ROUTING_BLOCK_TOKENS
from tokenplane.gateway.app import GATEWAY_KEY, create_app
from tokenplane.gateway.config import parse_config
from tokenplane.gateway.server import GatewayServer
from tokenplane.shared_state.routing import prefix_index_of

pytestmark = pytest.mark.anyio


async def test_an_instance_s_kv_cache_size_bounds_its_prefix_index(upstreams: Any, names: Any) -> None:
    ups = await upstreams(1)
    raw = names.gateway_config(ups)
    blocks = 4
    raw["instances"][0]["kv_capacity_tokens"] = blocks * ROUTING_BLOCK_TOKENS
    server = GatewayServer(create_app(parse_config(raw)), "127.0.0.1", 0)
    await server.start()
    try:
        gateway = server.app[GATEWAY_KEY]
        index = prefix_index_of(gateway.catalog.models[0].router)
        assert index is not None
        gateway.bound_prefix_indexes()  # what housekeeping does every few seconds
        client = openai.AsyncOpenAI(
            base_url=str(server.make_url("/v1")), api_key=names.KEY, max_retries=0, timeout=10
        )
        for i in range(10):
            words = " ".join(f"w{i}x{k}" for k in range(400))  # ~10 blocks, none shared
            await client.chat.completions.create(
                model=names.MODEL, messages=[{"role": "user", "content": words}]
            )
        await client.close()
        assert 0 < index.blocks_held(ups[0].name) <= blocks
        async with aiohttp.ClientSession() as http, http.get(str(server.make_url("/metrics"))) as r:
            text = await r.text()
        held = f'tokenplane_prefix_index_blocks{{instance="{ups[0].name}",model="{names.MODEL}"}}'
        bound = f'tokenplane_prefix_index_bound_blocks{{instance="{ups[0].name}",model="{names.MODEL}"}}'
        assert f"{held} {float(index.blocks_held(ups[0].name))}" in text, text
        assert f"{bound} {float(blocks)}" in text
    finally:
        await server.close()
