"""The gateway continues a stream on the other real vLLM instance after SIGKILLing the one serving it.

It must run last in this folder (``test_zz_``): the fixture restarts a killed server for any later
test, which costs about 40 s.
"""

from __future__ import annotations

import asyncio

import pytest

openai = pytest.importorskip("openai", reason="the openai client is needed (dev dependency)")

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

KILL_AFTER_CHUNKS = 2
MAX_TOKENS = 1900  # long enough (several seconds on the tiny model) that the kill lands mid-decode


async def test_zz_sigkill_mid_decode_stream_completes_on_the_other(vllm_gateway, vllm_instances) -> None:
    gw = vllm_gateway
    client = gw.client(timeout=120)
    stream = await client.completions.create(
        model=gw.alias,
        prompt="Once upon a time",
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = []
    killed = None
    text = ""
    usage = None
    async for c in stream:
        chunks.append(c)
        if c.choices:
            text += c.choices[0].text
        if c.usage is not None:
            usage = c.usage
        if (
            killed is None
            and len([x for x in chunks if x.choices and x.choices[0].text]) >= KILL_AFTER_CHUNKS
        ):
            inst = await gw.instances()
            busy = [i for i, iid in enumerate(gw.ids) if inst[iid]["outstanding_requests"] > 0]
            assert len(busy) == 1, inst
            killed = busy[0]
            await asyncio.to_thread(vllm_instances[killed].kill)
    assert killed is not None
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert len({c.id for c in chunks}) == 1
    assert usage is not None and usage.completion_tokens >= MAX_TOKENS - 2  # counted as content chunks
    assert usage.model_extra["tokenplane"]["attempts"] == 2
    assert text
