"""The gateway continues a stream on the other real vLLM instance after SIGKILLing the one serving it.

The file is named to run last in this folder: a killed server is restarted (same port) before any
later test that uses the instances, which costs about 40 s.

The kill must land while vLLM is still generating, or it interrupts nothing: on a quiet machine vLLM
can write its whole answer into the loopback socket buffers while the client parses its first
chunks, and the stream then ends in one attempt. Reading vLLM's metrics to decide races the engine
(CI lost that race four times in a row). So the test freezes the instance's process group
(SIGSTOP) at the first content chunk, which stops the engine wherever it is, and decides on the
frozen state: if the client then reads the stream's end, vLLM had already finished and the instance
is thawed (nothing lost) and another stream is tried; if the stream stays silent without an end,
vLLM was mid-decode, and the frozen instance is SIGKILLed. Nothing races.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the openai client is needed (dev dependency)")

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]

MAX_TOKENS = 1900  # several seconds of decoding on the tiny model
SILENCE_S = 2.0  # no chunk for this long from a frozen instance: what it had written is read out
TRIES = 6


async def _stream_killing_mid_decode(gw: Any, vllm_instances: list[Any]) -> dict[str, Any] | None:
    """One stream; freeze its instance at the first content chunk, kill it if vLLM had not finished.

    Returns what the client saw, or None when vLLM had already finished (the instance is thawed, or
    was never frozen: the gateway had already relayed the whole answer at the first chunk).
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
    loop = asyncio.get_running_loop()
    chunks: list[Any] = []
    state: dict[str, Any] = {"last": loop.time(), "finished": False, "frozen": None, "killed": None}

    async def kill_when_silent() -> None:
        server = vllm_instances[state["frozen"]]
        while not state["finished"]:
            if loop.time() - state["last"] >= SILENCE_S:
                state["killed"] = state["frozen"]
                await asyncio.to_thread(server.kill)
                return
            await asyncio.sleep(0.05)
        server.thaw()  # it had finished before the freeze: nothing to interrupt

    watcher: asyncio.Task[None] | None = None
    looked = False
    text = ""
    usage = None
    async for c in stream:
        state["last"] = loop.time()
        chunks.append(c)
        if c.choices:
            text += c.choices[0].text
            if c.choices[0].finish_reason and state["killed"] is None:
                state["finished"] = True
        if c.usage is not None:
            usage = c.usage
        if not looked and c.choices and c.choices[0].text:
            looked = True
            inst = await gw.instances()
            busy = [i for i, iid in enumerate(gw.ids) if inst[iid]["outstanding_requests"] > 0]
            if len(busy) != 1:
                # none: the gateway already had the whole answer (a slow client reads it out of the
                # socket buffers), so there is nothing to interrupt; read it out and try another
                continue
            vllm_instances[busy[0]].freeze()
            state["frozen"] = busy[0]
            state["last"] = loop.time()
            watcher = asyncio.create_task(kill_when_silent())
    state["finished"] = True
    if watcher is not None:
        await watcher
    if state["killed"] is None:
        return None
    return {"chunks": chunks, "text": text, "usage": usage, "killed": state["killed"]}


async def test_zz_sigkill_mid_decode_stream_completes_on_the_other(vllm_gateway, vllm_instances) -> None:
    gw = vllm_gateway
    seen = None
    for _ in range(TRIES):
        seen = await _stream_killing_mid_decode(gw, vllm_instances)
        if seen is not None:
            break
    assert seen is not None, f"vLLM finished every one of {TRIES} streams before the freeze"
    chunks = seen["chunks"]
    usage = seen["usage"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert len({c.id for c in chunks}) == 1
    assert usage is not None and usage.completion_tokens >= MAX_TOKENS - 2  # counted as content chunks
    assert usage.model_extra["tokenplane"]["attempts"] == 2
    assert seen["text"]
