"""The gateway continues a stream on the other real vLLM instance after SIGKILLing the one serving it.

It must run last in this folder (``test_zz_``): the fixture restarts a killed server for any later
test, which costs about 40 s.

The kill must land while vLLM is still generating. The gateway and the client share one event loop
here, and on a fast machine vLLM can send all its tokens into the loopback socket buffers while the
client is still parsing its first chunks: killing it then interrupts nothing (the whole answer is
already in the gateway's buffers), the stream ends in one attempt, and the test would prove nothing.
vLLM's ``vllm:num_requests_running`` gauge cannot tell: an idle engine keeps showing its last
step's count (CI's run killed an instance whose gauge read 1 after it had finished). So the test
reads ``vllm:generation_tokens_total`` twice, a moment apart, and kills only an instance whose
counter is still rising; a stream that outran the check is started again (a few times at most; the
test fails if no kill ever lands mid-decode).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from vllm_server import scrape_metrics

openai = pytest.importorskip("openai", reason="the openai client is needed (dev dependency)")

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

KILL_AFTER_CHUNKS = 1
PROGRESS_WINDOW_S = 0.1  # between the two reads of vLLM's generated-token counter
MAX_TOKENS = 1900  # long enough (several seconds on the tiny model) that the kill lands mid-decode
TRIES = 4


async def _stream_killing_mid_decode(gw: Any, vllm_instances: list[Any]) -> dict[str, Any] | None:
    """One stream; kill its instance once it has sent some chunks, if vLLM still runs the request.

    Returns what the client saw, or None when vLLM had already finished generating (nothing killed).
    """
    client = gw.client(timeout=120)
    stream = await client.completions.create(
        model=gw.alias,
        prompt="Once upon a time",
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks: list[Any] = []
    killed: int | None = None
    outran = False
    text = ""
    usage = None
    async for c in stream:
        chunks.append(c)
        if c.choices:
            text += c.choices[0].text
        if c.usage is not None:
            usage = c.usage
        content = len([x for x in chunks if x.choices and x.choices[0].text])
        if killed is None and not outran and content >= KILL_AFTER_CHUNKS:
            inst = await gw.instances()
            busy = [i for i, iid in enumerate(gw.ids) if inst[iid]["outstanding_requests"] > 0]
            assert len(busy) == 1, inst
            server = vllm_instances[busy[0]]
            before = await asyncio.to_thread(scrape_metrics, server.metrics_url)
            await asyncio.sleep(PROGRESS_WINDOW_S)
            after = await asyncio.to_thread(scrape_metrics, server.metrics_url)
            generated = "vllm:generation_tokens_total"
            if after.get(generated, 0.0) <= before.get(generated, 0.0):
                outran = True  # vLLM is done; the rest is in socket buffers: read it out
                continue
            killed = busy[0]
            await asyncio.to_thread(server.kill)
    if killed is None:
        return None
    return {"chunks": chunks, "text": text, "usage": usage, "killed": killed}


async def test_zz_sigkill_mid_decode_stream_completes_on_the_other(vllm_gateway, vllm_instances) -> None:
    gw = vllm_gateway
    seen = None
    for _ in range(TRIES):
        seen = await _stream_killing_mid_decode(gw, vllm_instances)
        if seen is not None:
            break
    assert seen is not None, f"vLLM finished every one of {TRIES} streams before the kill could land"
    chunks = seen["chunks"]
    usage = seen["usage"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert len({c.id for c in chunks}) == 1
    assert usage is not None and usage.completion_tokens >= MAX_TOKENS - 2  # counted as content chunks
    assert usage.model_extra["tokenplane"]["attempts"] == 2
    assert seen["text"]
