"""Happy paths through the gateway with the official openai client: JSON and SSE, chat and text."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


async def test_chat_non_stream(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups)
    client = gw.client()
    r = await client.chat.completions.create(
        model=names.ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert r.choices[0].message.content == "tok tok tok tok "
    assert r.usage is not None and r.usage.completion_tokens == 4
    sent = [b for u in ups for b in u.requests]
    assert len(sent) == 1
    assert sent[0]["model"] == names.UPSTREAM_MODEL  # alias resolved, name rewritten for the upstream
    assert sent[0]["max_tokens"] == 8


async def test_chat_stream_with_usage(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups)
    stream = await gw.client().chat.completions.create(
        model=names.MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    usage = None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == "tok " * 4
    assert usage is not None and usage.completion_tokens == 4 and usage.prompt_tokens == 7
    sent = [b for u in ups for b in u.requests]
    assert sent[0]["stream_options"] == {"include_usage": True}


async def test_chat_stream_without_usage(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    stream = await gw.client().chat.completions.create(
        model=names.MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = [c async for c in stream]
    assert len(chunks) == 4 and all(c.usage is None for c in chunks)


async def test_completions_non_stream_and_stream(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups)
    client = gw.client()
    r = await client.completions.create(model=names.MODEL, prompt="Once upon a time", max_tokens=4)
    assert r.choices[0].text == "tok " * 4
    stream = await client.completions.create(
        model="llama3",
        prompt=[1, 2, 3, 4],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage = [], None
    async for chunk in stream:
        texts.extend(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    assert "".join(texts) == "tok " * 4
    assert usage is not None and usage.completion_tokens == 4


async def test_models_list_per_tenant(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups, extra_model=True)
    listed = {m.id async for m in gw.client().models.list()}
    assert listed == {names.MODEL, names.ALIAS, "llama3", names.OTHER_MODEL}
    batch = {m.id async for m in gw.client(names.BATCH_KEY).models.list()}
    assert batch == {names.MODEL, names.ALIAS, "llama3"}


async def test_health_and_metrics_endpoints(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups)
    await gw.client().chat.completions.create(model=names.MODEL, messages=[{"role": "user", "content": "x"}])
    health = await gw.get("/health", key=None)
    assert health == {"status": "ok", "instances": 2, "healthy_instances": 2}
    text = await gw.get("/metrics", key=None)
    assert 'tokenplane_requests_total{model="llama-3-8b",outcome="ok"' in text
    assert "tokenplane_request_duration_seconds_bucket" in text
    assert 'tokenplane_instance_in_flight_requests{instance="up-0",model="llama-3-8b"} 0.0' in text


async def test_metrics_count_the_prompt_tokens_of_ended_requests(upstreams, gateway, names) -> None:
    """``tokenplane_prompt_tokens_total`` (what the out-of-process control loop reads as the pool's
    prompt-token demand): token-id prompts count exactly, per model."""
    ups = await upstreams(1)
    gw = await gateway(ups)
    client = gw.client()
    await client.completions.create(model=names.MODEL, prompt=[1, 2, 3, 4, 5, 6, 7], max_tokens=2)
    await client.completions.create(model=names.MODEL, prompt=[9] * 11, max_tokens=2)
    text = await gw.get("/metrics", key=None)
    assert 'tokenplane_prompt_tokens_total{model="llama-3-8b"} 18.0' in text
