"""Stream continuation: an instance lost mid-stream, the client's one stream completes on another.

The emulator's text is deterministic: with no ``seed`` in the request, the words come from
``TextGen(f"{settings.seed}\\0{prompt as rendered}")``. The continuation's prompt is the original
prompt plus the delivered text (for chat: a partial assistant message, rendered by the emulator as
vLLM would with ``continue_final_message``), so the full expected text is computable: the first
attempt's 20 words, then 180 words seeded by the continuation prompt. Matching it exactly proves no
gap and no duplicate at the splice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from tokenplane.core.prompt_hash import approx_tokens
from tokenplane.emulator.protocol import ChatCompletionRequest, TextGen, render_chat_request

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]


def _expected_completion(first_n: int, total: int) -> tuple[str, str]:
    first = "".join(TextGen(f"0\0{PROMPT}").words(first_n))
    rest = "".join(TextGen(f"0\0{PROMPT}{first}").words(total - first_n))
    return first + rest, PROMPT + first


def _expected_chat(first_n: int, total: int) -> tuple[str, str]:
    req = ChatCompletionRequest(model=MODEL, messages=MESSAGES)
    first = "".join(TextGen(f"0\0{render_chat_request(req)}").words(first_n))
    cont = ChatCompletionRequest(
        model=MODEL,
        messages=[*MESSAGES, {"role": "assistant", "content": first}],
        continue_final_message=True,
        add_generation_prompt=False,
    )
    cont_text = render_chat_request(cont)
    rest = "".join(TextGen(f"0\0{cont_text}").words(total - first_n))
    return first + rest, cont_text


async def _collect(stream: Any, chat: bool) -> tuple[str, list[Any], Any]:
    text, chunks, usage = "", [], None
    async for c in stream:
        chunks.append(c)
        if c.choices:
            text += (c.choices[0].delta.content or "") if chat else c.choices[0].text
        if c.usage is not None:
            usage = c.usage
    return text, chunks, usage


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_killed_after_20_tokens_continues_on_another(emulators, emu_gateway, chat) -> None:
    emus = await emulators(2)
    gw = await emu_gateway(emus)
    await emus[0].faults(die_after_tokens=20, die_count=1)  # round-robin: emu-0 takes the first request
    client = gw.client()
    opts = {"include_usage": True}
    if chat:
        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=200, stream=True, stream_options=opts
        )
        expected, cont_prompt = _expected_chat(20, 200)
    else:
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=200, stream=True, stream_options=opts
        )
        expected, cont_prompt = _expected_completion(20, 200)
    text, chunks, usage = await _collect(stream, chat)

    assert text == expected  # both attempts, spliced: no gap, no duplicate
    assert len(text.split()) == 200
    assert len({c.id for c in chunks}) == 1
    assert len({c.created for c in chunks}) == 1
    assert {c.model for c in chunks} == {MODEL}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert usage is not None and usage.completion_tokens == 200
    extra = usage.model_extra["tokenplane"]
    assert extra["attempts"] == 2
    assert extra["continuation_prompt_tokens"] == approx_tokens(cont_prompt)
    assert usage.prompt_tokens == approx_tokens(cont_prompt) - 20
    assert usage.total_tokens == usage.prompt_tokens + 200
    assert await emus[1].success_total() == 1  # the continuation finished there
    metrics = await gw.get("/metrics")
    assert "tokenplane_continuations_total" in metrics
    assert 'tokenplane_continuations_total{model="llama-3-8b"} 1.0' in metrics


async def test_continuation_switched_off_for_tenant_ends_with_error(emulators, emu_gateway, names) -> None:
    emus = await emulators(2)
    tenants = [
        {"name": "acme", "priority": "interactive", "api_keys": [_hash(names.KEY)], "continuation": False}
    ]
    gw = await emu_gateway(emus, tenants=tenants)
    await emus[0].faults(die_after_tokens=5, die_count=1)
    stream = await gw.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=50, stream=True)
    got = ""
    with pytest.raises(openai.APIError):
        async for c in stream:
            got += c.choices[0].text if c.choices else ""
    assert len(got.split()) == 5  # what was delivered stays delivered; then one precise error
    assert await emus[1].success_total() == 0


async def test_non_stream_failure_before_response_is_retried(emulators, emu_gateway) -> None:
    emus = await emulators(2)
    gw = await emu_gateway(emus)
    await emus[0].faults(error_status=503, error_count=1)
    r = await gw.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=10)
    assert len(r.choices[0].text.split()) == 10
    metrics = await gw.get("/metrics")
    assert 'tokenplane_retries_total{model="llama-3-8b"} 1.0' in metrics


async def test_stream_without_usage_and_a_dead_first_byte(emulators, emu_gateway) -> None:
    """A stream whose instance refuses before any byte is retried as a fresh request (no splice)."""
    emus = await emulators(2)
    gw = await emu_gateway(emus)
    await emus[0].faults(error_status=500, error_count=1)
    stream = await gw.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=30, stream=True
    )
    text, _chunks, usage = await _collect(stream, True)
    assert text == _expected_chat(30, 30)[0]
    assert usage is None


def _hash(key: str) -> str:
    from tokenplane.gateway import hash_key

    return hash_key(key)


async def test_a_stream_that_goes_silent_mid_way_continues_on_another(emulators, emu_gateway) -> None:
    """A hung sequence: the instance keeps the connection open and sends nothing more. After
    ``retry.stream_idle_timeout_s`` the stream continues elsewhere, text intact; with nothing else
    flowing on that instance, the silence counts against it."""
    emus = await emulators(2)
    gw = await emu_gateway(emus, retry={"stream_idle_timeout_s": 0.4})
    await emus[0].faults(die_after_tokens=20, die_count=1, stall=True)  # round-robin: emu-0 first
    stream = await gw.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=200, stream=True, stream_options={"include_usage": True}
    )
    text, _, usage = await _collect(stream, chat=False)
    expected, _ = _expected_completion(20, 200)
    assert text == expected
    assert usage is not None and usage.model_extra["tokenplane"]["attempts"] == 2
    view = (await gw.instances())["emu-0"]  # (its next health check resets the failure count)
    assert "stalled mid-stream" in (view["last_error"] or ""), view


async def test_a_silent_stream_on_a_busy_instance_moves_without_judging_it(emulators, emu_gateway) -> None:
    """The same hang while the instance streams another answer: the silent stream still moves on,
    but an instance that answers others is busy, not down, and keeps a clean record."""
    emus = await emulators(2)
    # 1 s: the other stream on emu-0 must send within it, even on a slow machine
    gw = await emu_gateway(emus, retry={"stream_idle_timeout_s": 1.0})
    await emus[0].faults(die_after_tokens=20, die_count=1, stall=True)
    client = gw.client()
    hung = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, stream=True)  # emu-0
    first = await hung.__anext__()  # emu-0 has started it; round-robin sends the next two on
    other = await client.completions.create(model=MODEL, prompt="x " * 8, max_tokens=8)  # emu-1
    flowing = await client.completions.create(  # emu-0 again, streaming through the other's silence
        model=MODEL, prompt="another prompt " * 4, max_tokens=1500, stream=True
    )
    texts = await asyncio.gather(_collect(hung, chat=False), _collect(flowing, chat=False))
    expected, _ = _expected_completion(20, 200)
    assert first.choices[0].text + texts[0][0] == expected
    assert len(texts[1][0].split()) == 1500 and other.choices[0].text
    view = (await gw.instances())["emu-0"]
    assert view["last_error"] is None, view
