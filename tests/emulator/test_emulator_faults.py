"""Fault injection through the admin API, and client disconnects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import openai
import pytest

MSG = [{"role": "user", "content": "hello"}]


async def _count_chunks(e: Any, model: str, max_tokens: int) -> tuple[int, BaseException | None]:
    n = 0
    try:
        stream = await e.client.chat.completions.create(
            model=model, messages=MSG, max_tokens=max_tokens, stream=True
        )
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                n += 1
    except (openai.APIError, OSError) as exc:
        return n, exc
    return n, None


async def _until(cond: Callable[[], bool], limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_die_after_tokens_cuts_streams(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        state = await e.faults(die_after_tokens=3, die_count=2)
        assert state["die_after_tokens"] == 3 and state["die_count"] == 2
        for _ in range(2):
            n, exc = await _count_chunks(e, emu.MODEL, 10)
            assert n == 3 and exc is not None
        n, exc = await _count_chunks(e, emu.MODEL, 10)  # the count is used up
        assert n == 10 and exc is None
        m = await e.metrics()
        assert m["vllm:request_success_total[('finished_reason', 'abort')]"] == 2
        assert m["vllm:num_requests_running"] == 0

    emu.run(body)


def test_stall_goes_silent_mid_stream_and_aborts_when_the_client_leaves(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        state = await e.faults(die_after_tokens=3, die_count=1, stall=True)
        assert state["stall"] is True
        got: list[str] = []

        async def read() -> None:
            stream = await e.client.chat.completions.create(
                model=emu.MODEL, messages=MSG, max_tokens=10, stream=True, timeout=30
            )
            async for c in stream:
                if c.choices and c.choices[0].delta.content:
                    got.append(c.choices[0].delta.content)

        task = asyncio.create_task(read())
        await _until(lambda: len(got) == 3)
        await asyncio.sleep(0.3)  # silent: the connection stays open, no token and no end
        assert len(got) == 3 and not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await _until(lambda: False, 0.2)
        m = await e.metrics()
        assert m["vllm:num_requests_running"] == 0  # the client left: aborted in the engine
        assert (await e.faults())["stall"] is False  # the count is used up
        n, exc = await _count_chunks(e, emu.MODEL, 10)
        assert n == 10 and exc is None

    emu.run(body)


def test_die_after_tokens_cuts_non_stream_until_cleared(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        await e.faults(die_after_tokens=2)
        for _ in range(2):
            with pytest.raises(openai.APIConnectionError):
                await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=5)
        assert (await e.faults(clear=True))["die_after_tokens"] is None
        r = await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=5)
        assert r.usage.completion_tokens == 5

    emu.run(body)


def test_slow_factor_scales_time_per_output_token(emu: SimpleNamespace) -> None:
    async def timed(e: Any) -> float:
        stream = await e.client.chat.completions.create(
            model=emu.MODEL, messages=MSG, max_tokens=11, stream=True
        )
        stamps = [time.perf_counter() async for c in stream if c.choices and c.choices[0].delta.content]
        assert len(stamps) == 11
        return (stamps[-1] - stamps[0]) / 10

    async def body(e: Any) -> None:
        base = await timed(e)
        m0 = await e.metrics()
        await e.faults(slow_factor=5.0)
        slow = await timed(e)
        m1 = await e.metrics()
        assert 3.0 < slow / base < 8.0, (base, slow)
        # the instance's own inter-token latency (virtual seconds) is exactly 5x
        itl = m1["vllm:inter_token_latency_seconds_sum"] - m0["vllm:inter_token_latency_seconds_sum"]
        assert itl / 10 == pytest.approx(5 * 0.01)
        await e.faults(slow_factor=1.0)
        assert (await e.faults())["slow_factor"] == 1.0

    emu.run(body, speed=2.0, fixed_step_s=0.01)


def test_error_status_answers_k_requests(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        await e.faults(error_status=500, error_count=2)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as info:
                await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=2)
            assert info.value.status_code == 500
            assert info.value.body["type"] == "InternalServerError"  # type: ignore[index]
        r = await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=2)
        assert r.usage.completion_tokens == 2
        await e.faults(error_status=503)  # no count: until cleared
        for _ in range(3):
            async with e.http.post(
                e.url + "/v1/completions", json={"model": emu.MODEL, "prompt": "x"}
            ) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["code"] == 503
        await e.faults(clear=True)
        r = await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=2)
        assert r.usage.completion_tokens == 2

    emu.run(body)


def test_hang_never_answers(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        await e.faults(hang=True)
        with pytest.raises(openai.APITimeoutError):
            await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=2, timeout=0.3)
        assert (await e.faults())["hang"] is True
        await e.faults(clear=True)
        r = await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=2, timeout=5)
        assert r.usage.completion_tokens == 2
        await e.faults(hang=True, hang_count=1)
        with pytest.raises(openai.APITimeoutError):
            await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=2, timeout=0.3)
        r = await e.client.chat.completions.create(model=emu.MODEL, messages=MSG, max_tokens=2, timeout=5)
        assert r.usage.completion_tokens == 2

    emu.run(body)


def test_admin_api_validates_and_unhealthy(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        for bad in ({"slow_factor": -1}, {"error_status": 200}, {"bogus": 1}, {"die_after_tokens": "3"}):
            async with e.http.post(e.url + "/admin/faults", json=bad) as r:
                assert r.status == 400, bad
                assert "error" in await r.json()
        async with e.http.post(e.url + "/admin/faults", data=b"{") as r:
            assert r.status == 400
        await e.faults(unhealthy=True)
        async with e.http.get(e.url + "/health") as r:
            assert r.status == 503
        state = await e.faults(clear=True, slow_factor=2.0)
        assert state["unhealthy"] is False and state["slow_factor"] == 2.0
        async with e.http.get(e.url + "/health") as r:
            assert r.status == 200
        async with e.http.get(e.url + "/admin/state") as r:
            st = await r.json()
            assert st["slow_factor"] == 2.0 and st["running"] == 0

    emu.run(body)


def test_client_disconnect_aborts_in_the_engine(emu: SimpleNamespace) -> None:
    async def body(e: Any) -> None:
        engine = e.instance.engine
        stream = await e.client.chat.completions.create(
            model=emu.MODEL, messages=MSG, max_tokens=100_000 // 50, stream=True
        )
        got = 0
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                got += 1
                if got == 3:
                    break
        m = await e.metrics()
        assert m["vllm:num_requests_running"] == 1, m
        await stream.close()
        await _until(lambda: not engine.running)
        assert not engine.running and not engine.busy, engine.view()
        m = await e.metrics()
        assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0
        assert m["vllm:request_success_total[('finished_reason', 'abort')]"] == 1
        # a non-streamed request whose client gives up is aborted too
        with pytest.raises(openai.APITimeoutError):
            await e.client.chat.completions.create(
                model=emu.MODEL, messages=MSG, max_tokens=2000, timeout=0.2
            )
        await _until(lambda: not engine.running)
        assert not engine.running, engine.view()
        m = await e.metrics()
        assert m["vllm:request_success_total[('finished_reason', 'abort')]"] == 2

    emu.run(body, speed=1.0, fixed_step_s=0.01)
