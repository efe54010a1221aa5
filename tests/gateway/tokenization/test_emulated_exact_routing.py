"""Emulators that tokenize with the model's tokenizer and publish vLLM KV events (real ZMQ): a
multi-turn chat through the gateway stays where its blocks are (``kv_cache_match``) and the
engine reports the hits; the emulator's ``/tokenize`` and ``usage.prompt_tokens`` agree with the
gateway's tokenizer."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tokenplane.gateway.tokenization import LocalTokenizer

pytest.importorskip("zmq")
pytestmark = pytest.mark.anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from ports import free_port  # noqa: E402
from tiny_model import sample_text  # noqa: E402


@pytest.mark.parametrize("source", ["local", "remote"])
async def test_conversations_follow_their_blocks_on_emulators(
    emulators: Any, tokenizer_dir: Path, names: Any, source: str
) -> None:
    """``local``: the gateway's own tokenizer; ``remote``: the emulators' ``POST /tokenize``."""
    from tokenplane.gateway import create_app, hash_key, parse_config
    from tokenplane.gateway.app import GATEWAY_KEY
    from tokenplane.gateway.server import GatewayServer

    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    emus = []
    for ep in endpoints:
        emus += await emulators(1, tokenizer=str(tokenizer_dir), kv_events_endpoint=ep)
    raw = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "tenants": [{"name": "acme", "api_keys": [hash_key(names.KEY)]}],
        "models": [
            {
                "name": names.MODEL,
                "router": "prefix-affinity",
                "tokenizer": {"path": str(tokenizer_dir)} if source == "local" else {"source": "remote"},
            }
        ],
        "instances": [
            {
                "id": e.name,
                "url": e.url,
                "model": names.MODEL,
                "kind": "emulated",
                "kv_events": {"endpoint": ep},
            }
            for e, ep in zip(emus, endpoints, strict=True)
        ],
        "scrape": {"interval_s": 0.05},
    }
    app = create_app(parse_config(raw))
    server = GatewayServer(app, "127.0.0.1", 0)
    await server.start()
    state = app[GATEWAY_KEY]
    import openai

    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=names.KEY, max_retries=0)
    local = LocalTokenizer(tokenizer_dir)
    assert state.kv_events is not None
    try:
        async with aiohttp.ClientSession() as http:
            msgs = [{"role": "user", "content": "hello"}]
            async with http.post(
                emus[0].url + "/tokenize", json={"model": names.MODEL, "messages": msgs}
            ) as r:
                assert (await r.json())["tokens"] == list(local.chat({"messages": msgs}) or [])
            # PUB/SUB joins asynchronously (events sent before are lost, as with vLLM): warm each
            # emulator up directly until the gateway hears from it
            for e in emus:
                for i in range(200):
                    body = {"model": names.MODEL, "prompt": sample_text(20, seed=i), "max_tokens": 1}
                    async with http.post(e.url + "/v1/completions", json=body) as r:
                        assert r.status == 200
                    await asyncio.sleep(0.05)
                    if len(state.kv_events.index.cache(e.name)):
                        break
                assert len(state.kv_events.index.cache(e.name)), state.kv_events.index.snapshot()

        async def converse(k: int) -> None:
            messages: list[dict[str, str]] = [
                {"role": "system", "content": sample_text(120, seed=500 + k)},
            ]
            for t in range(3):
                messages.append({"role": "user", "content": sample_text(25, seed=600 + 10 * k + t)})
                ids = local.chat({"messages": messages})
                assert ids is not None
                out = await client.chat.completions.create(model=names.MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
                assert out.usage is not None and out.usage.prompt_tokens == len(ids)
                if t:
                    details = out.usage.prompt_tokens_details
                    assert details is not None and (details.cached_tokens or 0) >= 128
                messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})
                for _ in range(100):  # this turn's blocks published before the next turn
                    if state.kv_events.index.match_tokens(ids):
                        break
                    await asyncio.sleep(0.02)

        await asyncio.gather(*(converse(k) for k in range(3)))
        async with aiohttp.ClientSession() as http, http.get(str(server.make_url("/metrics"))) as r:
            text = await r.text()
        match = [
            line
            for line in text.splitlines()
            if 'reason="kv_cache_match"' in line and "requests_total" in line
        ]
        assert match and sum(float(line.rsplit(" ", 1)[1]) for line in match) == 6  # every later turn
        assert 'reason="prefix_' not in text
    finally:
        await client.close()
        await server.close()
