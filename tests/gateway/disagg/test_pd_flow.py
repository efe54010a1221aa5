"""vLLM's prefill/decode flow through the gateway, over emulated prefill and decode instances.

The emulator's text is deterministic (``TextGen`` seeded by the rendered prompt), so every answer
is checked word for word: the decode instance's output, spliced across a continuation, with no gap
and no repeat. The emulators count what happened on their side (``tokenplane_emulator_kv_*``,
``vllm:nixl_num_failed_transfers``), the gateway on its own (``tokenplane_pd_events_total``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from tokenplane.emulator.protocol import ChatCompletionRequest, TextGen, render_chat_request

pytestmark = pytest.mark.anyio

MODEL = "llama-3-8b"
PROMPT = "Disaggregated serving splits the prompt from the answer. " * 8
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story " * 20}]


def words_for(prompt: str, n: int) -> str:
    return "".join(TextGen(f"0\0{prompt}").words(n))


def chat_prompt(messages: list[dict[str, Any]], **flags: Any) -> str:
    return render_chat_request(ChatCompletionRequest(model=MODEL, messages=messages, **flags))


async def collect(stream: Any, chat: bool) -> tuple[str, list[Any]]:
    text, chunks = "", []
    async for c in stream:
        chunks.append(c)
        if c.choices:
            text += (c.choices[0].delta.content or "") if chat else c.choices[0].text
    return text, chunks


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
async def test_prefill_hands_over_and_decode_answers(pd_fleet, stream: bool, chat: bool) -> None:
    fleet = await pd_fleet(1, 1)
    client = fleet.client()
    if chat:
        expected = words_for(chat_prompt(MESSAGES), 24)
        if stream:
            out = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=24, stream=True
            )
            text, chunks = await collect(out, True)
            assert len({c.id for c in chunks}) == 1
        else:
            r = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24)
            text = r.choices[0].message.content
            assert r.usage.completion_tokens == 24
    else:
        expected = words_for(PROMPT, 24)
        if stream:
            text, _ = await collect(
                await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, stream=True), False
            )
        else:
            r = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24)
            text = r.choices[0].text
            # the decode instance computed only the prompt's last partial block: the rest was pulled
            assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 16
    assert text == expected
    (p,), (d,) = fleet.prefill, fleet.decode
    assert await p.metric("tokenplane_emulator_kv_handovers_total") == 1
    assert await p.metric("tokenplane_emulator_kv_pulls_served_total") == 1
    assert await p.metric("vllm:generation_tokens_total") == 1  # the prefill's one token
    assert await d.metric("tokenplane_emulator_kv_pulls_total") == 1
    assert await d.metric("vllm:external_prefix_cache_hits_total") > 0  # the pulled KV, not recomputed
    assert await d.metric("vllm:prefix_cache_hits_total") == 0
    assert await d.metric("vllm:generation_tokens_total") == 24
    assert (await fleet.events()).get("handover") == 1


async def test_prefill_failing_before_handover_moves_to_another_prefill(pd_fleet) -> None:
    fleet = await pd_fleet(2, 1)
    p0, p1 = fleet.prefill
    await p0.faults(error_status=503)  # the pair router's first pick (equal scores: the first)
    r = await fleet.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)
    assert r.choices[0].text == words_for(PROMPT, 8)
    events = await fleet.events()
    assert events["prefill_failed"] == 1 and events["handover"] == 1
    handovers = [await p.metric("tokenplane_emulator_kv_handovers_total") for p in (p0, p1)]
    assert handovers == [0, 1]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
async def test_kv_gone_after_handover_is_prefilled_again(pd_fleet, stream: bool) -> None:
    """The prefill instance answered, then lost the KV before the decode pulled it: the decode
    fails as vLLM does (500, or an error event in the stream), which the client never sees."""
    fleet = await pd_fleet(2, 1)
    for p in fleet.prefill:
        await p.faults(kv_lost=True)
    await fleet.prefill[1].faults(kv_lost=False)  # only p0 loses what it hands over
    client = fleet.client()
    if stream:
        text, _ = await collect(
            await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, stream=True), False
        )
    else:
        text = (await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12)).choices[0].text
    assert text == words_for(PROMPT, 12)
    events = await fleet.events()
    (d,) = fleet.decode
    p0, p1 = fleet.prefill
    assert events["kv_transfer_failed"] == 1
    assert await d.metric("vllm:nixl_num_failed_transfers_total") == 1
    assert await p0.metric("tokenplane_emulator_kv_handovers_total") == 1
    assert await p1.metric("tokenplane_emulator_kv_pulls_served_total") == 1  # prefilled again there


async def test_prefill_gone_once_decode_has_the_kv_changes_nothing(pd_fleet) -> None:
    fleet = await pd_fleet(1, 1)
    stream = await fleet.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=60, stream=True)
    text = ""
    async for c in stream:
        text += c.choices[0].text if c.choices else ""
        if not fleet.prefill[0].stopped:
            await fleet.prefill[0].stop()  # the prefill instance dies after the decode pulled its KV
    assert text == words_for(PROMPT, 60)
    assert (await fleet.events()).get("kv_transfer_failed", 0) == 0


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
async def test_decode_dying_mid_stream_continues_on_another_decode(pd_fleet, chat: bool) -> None:
    fleet = await pd_fleet(1, 2)
    await fleet.decode[0].faults(die_after_tokens=10)  # the pair router's first pick (the first of equals)
    client = fleet.client()
    opts = {"include_usage": True}
    if chat:
        first = words_for(chat_prompt(MESSAGES), 10)
        cont = chat_prompt(
            [*MESSAGES, {"role": "assistant", "content": first}],
            continue_final_message=True,
            add_generation_prompt=False,
        )
        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=40, stream=True, stream_options=opts
        )
    else:
        first = words_for(PROMPT, 10)
        cont = PROMPT + first
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=40, stream=True, stream_options=opts
        )
    text, chunks = await collect(stream, chat)
    assert text == first + words_for(cont, 30)  # one stream: no gap, no repeat at the splice
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert usage.completion_tokens == 40 and usage.model_extra["tokenplane"]["attempts"] == 2
    (p,) = fleet.prefill
    assert await p.metric("tokenplane_emulator_kv_handovers_total") == 2  # the continuation prefilled too
    pulls = [await d.metric("tokenplane_emulator_kv_pulls_total") for d in fleet.decode]
    assert pulls == [1, 1]  # on the other decode instance


async def test_client_kv_transfer_params_are_refused(pd_fleet) -> None:
    fleet = await pd_fleet(1, 1)
    params = {"do_remote_prefill": True, "remote_engine_id": "x"}
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "kv_transfer_params": params}
    status, answer = await fleet.post("/v1/completions", body)
    assert status == 400
    assert answer["error"]["param"] == "kv_transfer_params"
    assert "disaggregated" in answer["error"]["message"]
    assert await fleet.prefill[0].metric("vllm:request_success_total") == 0


async def test_prefill_without_a_kv_connector_is_a_precise_error(pd_fleet) -> None:
    fleet = await pd_fleet(1, 1, connector=False)
    with pytest.raises(openai.APIStatusError) as info:
        await fleet.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    err = info.value
    assert err.status_code == 502
    assert err.body["code"] == "kv_handover_invalid"
    assert "no kv_transfer_params" in err.body["message"] and "--kv-transfer-config" in err.body["message"]
    assert await fleet.decode[0].metric("vllm:request_success_total") == 0


async def test_no_prefill_instance_left_decode_serves_whole(pd_fleet) -> None:
    fleet = await pd_fleet(1, 1, health={"interval_s": 0.05, "failures_to_down": 1})
    await fleet.prefill[0].stop()
    for _ in range(100):  # the health check takes it out
        await asyncio.sleep(0.05)
        views = {d["instance_id"]: d for d in (await fleet.get("/v1/instances"))["data"]}
        if not views["p0"]["healthy"]:
            break
    assert views["p0"]["role"] == "prefill" and views["d0"]["role"] == "decode"
    r = await fleet.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=6)
    assert r.choices[0].text == words_for(PROMPT, 6)
    assert (await fleet.events())["colocated_fallback"] == 1
    assert await fleet.decode[0].metric("tokenplane_emulator_kv_pulls_total") == 0


async def test_decode_failing_before_its_first_token_moves_to_another_pair(pd_fleet) -> None:
    fleet = await pd_fleet(1, 2)
    d0, d1 = fleet.decode
    await d0.faults(error_status=503)  # the pair router's first pick
    stream = await fleet.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, stream=True
    )
    text, _ = await collect(stream, True)
    assert text == words_for(chat_prompt(MESSAGES), 16)
    assert await d1.metric("tokenplane_emulator_kv_pulls_total") == 1
    assert await d0.metric("vllm:request_success_total") == 0
    assert (await fleet.events())["handover"] == 2  # prefilled again for the new pair


async def test_other_routes_pass_through_to_the_pool(pd_fleet) -> None:
    fleet = await pd_fleet(1, 1)
    r = await fleet.client().embeddings.create(model=MODEL, input="hello")
    assert len(r.data[0].embedding) == 8
    assert (await fleet.events()).get("handover", 0) == 0
