"""Chat and text prompts tokenized at the gateway are matched exactly against the KV events an
instance publishes (real ZMQ); without a tokenizer the approximate index decides, and the route
reasons say which. The remote tokenizer speaks vLLM's ``POST /tokenize`` over real HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from ports import free_port

from tokenplane.gateway.app import GATEWAY_KEY, create_app
from tokenplane.gateway.config import parse_config
from tokenplane.gateway.tokenization import LocalTokenizer, RemoteTokenizer

zmq = pytest.importorskip("zmq")
pytestmark = pytest.mark.anyio

BS = 16


class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]


CONVERSATION = [
    {"role": "system", "content": "You are the token plane. " * 12},
    {"role": "user", "content": "Which instance holds my conversation? " * 6},
]


async def _run(upstreams: Any, names: Any, tokenizer_dir: Path, tokenized: bool) -> tuple[list[int], str]:
    ups = await upstreams(2)
    port = free_port()
    raw = names.gateway_config(ups, router="prefix-affinity")
    raw["instances"][1]["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{port}"}
    if tokenized:
        raw["models"][0]["tokenizer"] = {"path": str(tokenizer_dir)}
    app = create_app(parse_config(raw))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    gw = app[GATEWAY_KEY]
    # what up-1's engine holds: every full block of the conversation as the model tokenizes it
    ids = LocalTokenizer(tokenizer_dir).chat({"messages": CONVERSATION})
    assert ids is not None and len(ids) >= 4 * BS
    full = len(ids) // BS * BS
    stored = _Stored(list(range(1, full // BS + 1)), None, list(ids[:full]), BS)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(f"tcp://127.0.0.1:{port}")
    import openai

    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=names.KEY, max_retries=0)
    try:
        for _ in range(200):
            pub.send_multipart([b"kv", b"\0" * 8, msgspec.msgpack.encode(_Batch(1.0, [stored]))])
            if await gw.kv_events.wait_for(ups[1].name, lambda c: len(c) == full // BS, timeout=0.02):
                break
        assert gw.kv_events.index.match_tokens(ids) == {ups[1].name: full}
        await client.chat.completions.create(model=names.MODEL, messages=CONVERSATION, max_tokens=4)  # type: ignore[arg-type]
        other = [{"role": "user", "content": "Something nobody has seen. " * 9}]
        await client.chat.completions.create(model=names.MODEL, messages=other, max_tokens=4)  # type: ignore[arg-type]
        await client.completions.create(model=names.MODEL, prompt="A text prompt, " * 20, max_tokens=4)
        async with aiohttp.ClientSession() as http, http.get(str(server.make_url("/metrics"))) as r:
            metrics = await r.text()
        placed = [len(u.requests) for u in ups]
        return placed, metrics
    finally:
        await client.close()
        pub.close(linger=0)
        ctx.term()
        await server.close()


async def test_chat_goes_where_its_blocks_are_only_when_tokenized(
    upstreams: Any, names: Any, tokenizer_dir: Path
) -> None:
    placed, metrics = await _run(upstreams, names, tokenizer_dir, tokenized=True)
    # the conversation to up-1 (its blocks), the unseen chat and the text prompt: exact misses,
    # least loaded (the lowest index on ties)
    assert placed == [2, 1] and 'reason="kv_cache_match"' in metrics
    assert 'reason="kv_cache_miss_least_loaded"' in metrics and 'reason="prefix_' not in metrics

    placed, metrics = await _run(upstreams, names, tokenizer_dir, tokenized=False)
    # no tokenizer: the approximate index has never seen the conversation, so up-0 gets it
    assert placed[0] >= 1 and 'reason="kv_cache_match"' not in metrics
    assert 'reason="prefix_miss_least_loaded"' in metrics


async def test_remote_tokenizer_speaks_vllm_tokenize(tokenizer_dir: Path) -> None:
    local = LocalTokenizer(tokenizer_dir)
    seen: list[dict[str, Any]] = []

    async def tokenize(request: web.Request) -> web.Response:  # vLLM's /tokenize, over the local tokenizer
        body = await request.json()
        seen.append(body)
        if "messages" in body:
            ids = local.chat(body)
            ids = None if ids is None else list(ids)
        else:
            ids = local.tokenizer.encode(body["prompt"], add_special_tokens=body["add_special_tokens"]).ids
        return web.json_response({"tokens": ids, "count": len(ids or []), "max_model_len": 4096})

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": "down"}, status=500)

    good, bad = web.Application(), web.Application()
    good.router.add_post("/tokenize", tokenize)
    bad.router.add_post("/tokenize", broken)
    servers = [TestServer(bad, host="127.0.0.1", port=0), TestServer(good, host="127.0.0.1", port=0)]
    for s in servers:
        await s.start_server()
    async with aiohttp.ClientSession() as http:
        remote = RemoteTokenizer([str(s.make_url("")) for s in servers], "served", lambda: http)
        try:
            ids = await remote.tokenize({"messages": CONVERSATION, "max_tokens": 3}, chat=True)
            assert ids == list(local.chat({"messages": CONVERSATION}) or [])
            assert seen[-1]["model"] == "served" and seen[-1]["add_special_tokens"] is False
            assert "max_tokens" not in seen[-1]
            assert await remote.tokenize({"messages": CONVERSATION}, chat=True) == ids  # cached
            assert await remote.tokenize({"prompt": "the answer"}, chat=False) == local.text("the answer")
            assert remote.failures >= 1 and remote.hits == 1
        finally:
            for s in servers:
                await s.close()
    dead = RemoteTokenizer(["http://127.0.0.1:9"], "m", lambda: None)
    assert await dead.tokenize({"prompt": "x"}, chat=False) is None
