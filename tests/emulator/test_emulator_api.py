"""The OpenAI API served by an emulated instance, called with the official client."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import openai
import pytest

LONG = "You are a careful assistant. " * 60  # about 430 tokens: many full 16-token blocks


def test_chat_non_stream(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        r = await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=7
        )
        choice = r.choices[0]
        assert r.object == "chat.completion" and r.model == emu.MODEL
        assert choice.finish_reason == "length" and choice.message.role == "assistant"
        assert len(choice.message.content.split()) == 7
        assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 0
        assert r.usage.total_tokens == r.usage.prompt_tokens + 7
        assert r.usage.prompt_tokens_details.cached_tokens == 0

    emu.run(body)


def test_chat_stream_with_usage_chunk(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        stream = await e.client.chat.completions.create(
            model=emu.MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        tokens = [c for c in chunks if c.choices and c.choices[0].delta.content]
        assert len(tokens) == 5
        assert tokens[-1].choices[0].finish_reason == "length"
        assert all(c.choices[0].finish_reason is None for c in tokens[:-1])
        usage = chunks[-1]
        assert usage.choices == [] and usage.usage.completion_tokens == 5
        assert usage.usage.prompt_tokens_details.cached_tokens == 0
        # without include_usage there is no usage chunk
        stream = await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        chunks = [c async for c in stream]
        assert all(c.usage is None and c.choices for c in chunks)

    emu.run(body)


def test_stream_and_non_stream_agree_and_are_deterministic(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        msgs = [{"role": "user", "content": "tell me"}]
        r = await e.client.chat.completions.create(model=emu.MODEL, messages=msgs, max_tokens=12)
        stream = await e.client.chat.completions.create(
            model=emu.MODEL, messages=msgs, max_tokens=12, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert text == r.choices[0].message.content
        other = await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "else"}], max_tokens=12
        )
        assert other.choices[0].message.content != text

    emu.run(body)


def test_completions_stream_non_stream_and_token_ids(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        r = await e.client.completions.create(model=emu.MODEL, prompt="Once upon a time", max_tokens=4)
        assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
        assert len(r.choices[0].text.split()) == 4 and r.usage.completion_tokens == 4
        stream = await e.client.completions.create(
            model=emu.MODEL,
            prompt="Once upon a time",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        texts = [c.choices[0].text for c in chunks if c.choices]
        assert "".join(texts) == r.choices[0].text
        assert chunks[-1].usage.completion_tokens == 4
        ids = await e.client.completions.create(model=emu.MODEL, prompt=list(range(100)), max_tokens=2)
        assert ids.usage.prompt_tokens == 100

    emu.run(body)


def test_default_length_stops_and_cap(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        r = await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "x"}]
        )
        assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 6
        r = await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "x"}], max_completion_tokens=50
        )
        assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 9

    emu.run(body, default_max_tokens=6, max_tokens_cap=9)


def test_continue_final_message_is_accepted(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        msgs = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one two"}]
        r = await e.client.chat.completions.create(
            model=emu.MODEL,
            messages=msgs,
            max_tokens=2,
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
        assert r.usage.completion_tokens == 2
        with pytest.raises(openai.BadRequestError):
            await e.client.chat.completions.create(
                model=emu.MODEL,
                messages=msgs,
                max_tokens=2,
                extra_body={"continue_final_message": True, "add_generation_prompt": True},
            )

    emu.run(body)


def test_repeated_prefix_hits_the_cache_and_the_counter(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        before = await e.metrics()
        msgs = [{"role": "system", "content": LONG}, {"role": "user", "content": "first"}]
        r1 = await e.client.chat.completions.create(model=emu.MODEL, messages=msgs, max_tokens=3)
        assert r1.usage.prompt_tokens_details.cached_tokens == 0
        msgs[1]["content"] = "second question"
        r2 = await e.client.chat.completions.create(model=emu.MODEL, messages=msgs, max_tokens=3)
        cached = r2.usage.prompt_tokens_details.cached_tokens
        assert cached >= 400 and cached % 16 == 0 and cached < r2.usage.prompt_tokens
        after = await e.metrics()
        hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
        assert hits == cached
        queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
        assert queries == r1.usage.prompt_tokens + r2.usage.prompt_tokens

    emu.run(body)


def test_concurrent_requests_are_batched(emu: SimpleNamespace) -> None:
    """Eight concurrent requests run in one batch: the emulator reports all eight running at once
    (a serial engine would never show more than one), and none of them waits in the queue."""

    async def one(e: Any) -> None:
        await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "go"}], max_tokens=50
        )

    async def body(e: Any) -> None:
        before = await e.metrics()
        tasks = [asyncio.ensure_future(one(e)) for _ in range(8)]
        most_running = 0.0
        while not all(t.done() for t in tasks):
            most_running = max(most_running, (await e.metrics())["vllm:num_requests_running"])
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        after = await e.metrics()
        assert most_running == 8
        assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 400

    emu.run(body, speed=1.0, fixed_step_s=0.02)


def test_models_health_and_served_name(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        models = await e.client.models.list()
        assert [m.id for m in models.data] == ["my-llama"]
        async with e.http.get(e.url + "/health") as r:
            assert r.status == 200
        r = await e.client.chat.completions.create(
            model="my-llama", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        assert r.model == "my-llama" and r.usage.completion_tokens == 1
        m = await e.metrics()
        assert m["vllm:generation_tokens_total"] == 1

    emu.run(body, served_model_name="my-llama")


def test_metrics_expose_vllm_names(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4
        )
        async with e.http.get(e.url + "/metrics") as r:
            text = await r.text()
            assert r.headers["Content-Type"].startswith("text/plain")
        from prometheus_client.parser import text_string_to_metric_families

        fams = {f.name: f for f in text_string_to_metric_families(text)}
        samples = {s.name for f in fams.values() for s in f.samples}
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            assert fams[name].type == "gauge"
        for name in (
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
        ):
            assert name in samples
            assert fams[name.removesuffix("_total")].type == "counter"
        for name in (
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
        ):
            assert fams[name].type == "histogram"
            assert name + "_count" in samples
        labels = next(s.labels for s in fams["vllm:num_requests_running"].samples)
        assert labels == {"model_name": emu.MODEL, "engine": "0"}
        m = await e.metrics()
        assert m["vllm:generation_tokens_total"] == 4
        assert m["vllm:request_success_total[('finished_reason', 'length')]"] == 1
        assert m["vllm:time_to_first_token_seconds_count"] == 1
        assert m["vllm:inter_token_latency_seconds_count"] == 3
        assert m["vllm:e2e_request_latency_seconds_count"] == 1

    emu.run(body)


def test_kv_pressure_preempts_and_reports(emu: SimpleNamespace) -> None:
    """Preempted requests are recomputed; as vLLM counts them, their new lookups are not prefix-cache
    queries again (vLLM records them apart, as ``preempted_queries``): one query per request."""

    async def one(e: Any, i: int) -> tuple[int, int]:
        r = await e.client.completions.create(model=emu.MODEL, prompt=f"{i} " + "z" * 400, max_tokens=120)
        return int(r.usage.completion_tokens), int(r.usage.prompt_tokens)

    async def body(e: Any) -> None:
        task = asyncio.gather(*(one(e, i) for i in range(6)))
        seen_waiting = 0.0
        while not task.done():
            m = await e.metrics()
            seen_waiting = max(seen_waiting, m["vllm:num_requests_waiting"])
            await asyncio.sleep(0.005)
        done = await task
        assert [c for c, _ in done] == [120] * 6
        m = await e.metrics()
        assert m["vllm:num_preemptions_total"] > 0 and seen_waiting > 0
        assert m["vllm:prefix_cache_queries_total"] == sum(p for _, p in done)
        assert m["vllm:request_queue_time_seconds_sum"] > 0
        assert m["vllm:kv_cache_usage_perc"] == 0.0 and m["vllm:num_requests_running"] == 0

    emu.run(body, kv_capacity_tokens=512, max_model_len=512, speed=50.0)


BAD_CASES = [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (b'{"messages": [{"role": "user", "content": "x"}]}', 400),  # no model
    (b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', 400),
    (b'{"model": "llama-3-8b", "messages": "x"}', 400),
    (b'{"model": "llama-3-8b", "messages": []}', 400),
    (b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}', 400),
    (b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400),
    (b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 999999}', 400),
    (b'{"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}], "n": 2}', 400),
    (b'{"model": "other", "messages": [{"role": "user", "content": "x"}]}', 404),
]


def test_bad_input_gets_openai_errors(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        for raw, status in BAD_CASES:
            async with e.http.post(
                e.url + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == status, raw
                err = (await r.json())["error"]
                assert err["code"] == status and err["type"] and err["message"], raw
        async with e.http.post(
            e.url + "/v1/completions", json={"model": emu.MODEL, "prompt": ["a", "b"]}
        ) as r:
            assert r.status == 400
        with pytest.raises(openai.NotFoundError):
            await e.client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        # and it keeps serving
        r2 = await e.client.chat.completions.create(
            model=emu.MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        assert r2.usage.completion_tokens == 1

    emu.run(body)
