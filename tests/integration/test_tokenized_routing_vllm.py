"""Exact prefix routing for a multi-turn CHAT conversation over two REAL vLLM instances.

The gateway tokenizes each turn with the model's own tokenizer (the tiny model's folder:
``tokenizer.json`` and its ChatML template) and matches it against the KV events both instances
publish (ZMQ, bound by the gateway). Checked:

1. the gateway's ids for a conversation are the ids vLLM's own ``/tokenize`` gives (local and
   remote tokenizers alike);
2. the conversation keeps landing on the instance that holds its blocks (``kv_cache_match``), and
   that instance's ``vllm:prefix_cache_hits_total`` rises;
3. once other traffic has evicted its blocks there (48 KV blocks of 32 tokens), with a stream in
   flight on that instance, the next turn goes to the other, less-loaded instance with reason
   ``kv_cache_miss_least_loaded``.

With tokenization off (``TOKENPLANE_TEST_TOKENIZE_OFF=1``, a manual check) the approximate index
keeps sending the conversation to the evicted instance and the test fails. Two vLLM start side by
side (about 30 to 60 s on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from ports import free_port
from tiny_model import sample_text
from vllm_server import scrape_metrics, start_vllm

from tokenplane.gateway.tokenization import LocalTokenizer, RemoteTokenizer

openai = pytest.importorskip("openai")
pytest.importorskip("zmq")
aiohttp = pytest.importorskip("aiohttp")

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

BLOCK = 32  # the CPU attention backend needs a multiple of 32
BLOCKS = 48  # 1,536 tokens of KV cache: a few prompts evict a conversation
KEY = "sk-tokenized-routing"
HITS = "vllm:prefix_cache_hits_total"
SUCCESS = "vllm:request_success_total"


async def _scrape(url: str) -> dict[str, float]:
    return await asyncio.to_thread(scrape_metrics, url + "/metrics")


async def _served_by(urls: list[str], before: list[dict[str, float]]) -> int:
    """The index of the instance whose success counter rose by one (polled)."""
    for _ in range(100):
        now = [await _scrape(u) for u in urls]
        rises = [n.get(SUCCESS, 0) - b.get(SUCCESS, 0) for n, b in zip(now, before, strict=True)]
        if sum(rises) >= 1:
            assert sum(rises) == 1, rises
            return rises.index(1)
        await asyncio.sleep(0.1)
    raise AssertionError("no instance counted the request")


async def test_chat_follows_its_blocks_and_leaves_when_they_are_evicted(
    vllm_python: Path, tiny_model_dir: Path, vllm_model: str
) -> None:
    from tokenplane.gateway import create_app, hash_key, parse_config
    from tokenplane.gateway.app import GATEWAY_KEY
    from tokenplane.gateway.server import GatewayServer

    tokenize = os.environ.get("TOKENPLANE_TEST_TOKENIZE_OFF") != "1"
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    servers = []
    for i, endpoint in enumerate(endpoints):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv"}
        port = free_port()
        servers.append(
            start_vllm(
                vllm_python,
                tiny_model_dir,
                port,
                served_name=vllm_model,
                cpu_bind=str(i % (os.cpu_count() or 1)),
                extra_args=[
                    "--kv-events-config",
                    json.dumps(cfg),
                    "--block-size",
                    str(BLOCK),
                    "--num-gpu-blocks-override",
                    str(BLOCKS),
                    "--max-model-len",
                    "1024",
                    "--max-num-seqs",
                    "4",
                ],
                log_path=tiny_model_dir.parent / f"vllm-tokenized-{port}.log",
                wait=False,
            )
        )
    urls = [s.url for s in servers]
    model: dict[str, Any] = {"name": vllm_model, "router": "prefix-affinity"}
    if tokenize:
        model["tokenizer"] = {"path": str(tiny_model_dir)}
    config = parse_config(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "tenants": [{"name": "t", "api_keys": [hash_key(KEY)]}],
            "models": [model],
            "instances": [
                {
                    "id": f"vllm-{i}",
                    "url": u,
                    "model": vllm_model,
                    "kind": "vllm",
                    "kv_events": {"endpoint": endpoints[i]},
                }
                for i, u in enumerate(urls)
            ],
            "scrape": {"interval_s": 0.5},
            "health": {"interval_s": 1.0, "failures_to_down": 3, "timeout_s": 5.0},
        }
    )
    app = create_app(config)
    gw = GatewayServer(app, "127.0.0.1", 0)
    await gw.start()
    state = app[GATEWAY_KEY]
    client = openai.AsyncOpenAI(base_url=str(gw.make_url("/v1")), api_key=KEY, max_retries=0, timeout=60)
    http = aiohttp.ClientSession()
    try:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, s.wait_ready, 240.0) for s in servers))
        # The gateway started first and marked both down while vLLM booted: wait for its health
        # checks to see them up again.
        deadline = loop.time() + 60.0
        while not all(u.healthy for u in state.pool.all()) and loop.time() < deadline:
            await asyncio.sleep(0.2)
        assert all(u.healthy for u in state.pool.all()), "the gateway never saw both instances up"
        assert state.kv_events is not None
        local = LocalTokenizer(tiny_model_dir)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": sample_text(150, seed=71)},
            {"role": "user", "content": sample_text(40, seed=72)},
        ]

        # 1. the gateway's ids are vLLM's ids, from the folder and from /tokenize
        body = {"model": vllm_model, "messages": messages, "add_generation_prompt": True}
        async with http.post(urls[0] + "/tokenize", json=body) as r:
            assert r.status == 200, await r.text()
            vllm_ids = (await r.json())["tokens"]
        assert list(local.chat({"messages": messages}) or []) == vllm_ids
        remote = RemoteTokenizer(urls, vllm_model, lambda: http)
        assert await remote.tokenize({"messages": messages}, chat=True) == vllm_ids

        async def turn(reply_words: int = 12) -> tuple[int, str]:
            before = [await _scrape(u) for u in urls]
            out = await client.chat.completions.create(
                model=vllm_model,
                messages=messages,
                max_tokens=reply_words,
                temperature=0,  # type: ignore[arg-type]
                extra_body={"ignore_eos": True},
            )
            return await _served_by(urls, before), out.choices[0].message.content or ""

        async def held_by(i: int) -> int:
            ids = local.chat({"messages": messages})
            assert ids is not None
            return state.kv_events.index.match_tokens(ids).get(f"vllm-{i}", 0)  # type: ignore[union-attr]

        # 2. the conversation stays where its blocks are
        home, reply = await turn()
        other = 1 - home
        hits_before = (await _scrape(urls[home]))[HITS]
        for k in range(3):
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": sample_text(30, seed=80 + k)}]  # fmt: skip
            for _ in range(100):  # the previous turn's BlockStored events
                if await held_by(home) >= 8 * BLOCK:
                    break
                await asyncio.sleep(0.05)
            served, reply = await turn()
            assert served == home, f"turn {k + 2} went to vllm-{served}, its blocks are on vllm-{home}"
        hits_after = (await _scrape(urls[home]))[HITS]
        assert hits_after - hits_before >= 3 * 8 * BLOCK, (hits_before, hits_after)
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": sample_text(30, seed=90)},
        ]

        # 3. other traffic evicts the conversation on its instance (sent there directly), then the
        # next turn, sent while that instance is loaded (the gateway sees two of the load's requests
        # in flight there), leaves for the other one. The load is timing: the tiny model may finish
        # it before the turn is routed (both instances idle, the tie goes to vllm-0). A turn that
        # stayed proves nothing unless a load was still in flight when its answer came back (so at
        # routing too); else the attempt is made again, evicting again (the turn put the
        # conversation's blocks back), up to three times.
        fillers = [sample_text(200, seed=300 + j) for j in range(5)]
        busy = state.pool.get(f"vllm-{home}")
        assert busy is not None
        metrics_before = await (await http.get(str(gw.make_url("/metrics")))).text()
        for _attempt in range(3):
            for text in fillers:
                req = {"model": vllm_model, "prompt": text, "max_tokens": 1}
                async with http.post(urls[home] + "/v1/completions", json=req) as r:
                    assert r.status == 200, await r.text()
            for _ in range(100):
                if await held_by(home) == 0:
                    break
                await asyncio.sleep(0.05)
            assert await held_by(home) == 0, state.kv_events.index.snapshot()
            # Load on that instance, sent through the gateway (the requests hold the last filler's
            # blocks, so they go there): more long requests at once than its KV cache runs together.
            before = [await _scrape(u) for u in urls]
            loads = [
                asyncio.create_task(
                    client.completions.create(
                        model=vllm_model,
                        prompt=fillers[-1] + " and more",
                        max_tokens=500,
                        extra_body={"ignore_eos": True},
                    )
                )
                for _ in range(4)
            ]
            while busy.view().outstanding_requests < 2 and not all(t.done() for t in loads):
                await asyncio.sleep(0.005)
            loaded = busy.view().outstanding_requests >= 2
            out = await client.chat.completions.create(model=vllm_model, messages=messages, max_tokens=4)  # type: ignore[arg-type]
            assert out.choices
            in_flight = not all(t.done() for t in loads)
            for t in loads:
                assert (await t).choices
            now = [await _scrape(u) for u in urls]
            rises = [n[SUCCESS] - b[SUCCESS] for n, b in zip(now, before, strict=True)]
            metrics = await (await http.get(str(gw.make_url("/metrics")))).text()
            reasons = [line for line in metrics.splitlines() if line.startswith("tokenplane_requests_total{")]
            if loaded and (rises[other] >= 1 or in_flight):
                break
        assert loaded, "the load never showed on the conversation's instance"
        assert rises[other] >= 1, (
            f"the turn after eviction stayed on vllm-{home} (load in flight: {in_flight}): {rises}; {reasons}"
        )
        misses = [line for line in metrics.splitlines() if 'reason="kv_cache_miss_least_loaded"' in line]
        assert misses and misses != [
            line for line in metrics_before.splitlines() if 'reason="kv_cache_miss_least_loaded"' in line
        ]
        assert 'reason="kv_cache_match"' in metrics
    finally:
        await client.close()
        await http.close()
        await gw.close()
        for s in servers:
            await asyncio.get_running_loop().run_in_executor(None, s.stop)
