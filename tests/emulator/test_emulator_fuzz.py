"""Arbitrary JSON bodies never make the emulator answer 5xx (it validates as vLLM does)."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.emulator import EmulatorSettings, start_emulator

MODEL = "llama-3-8b"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        cfg = EmulatorSettings(speed=1000.0, default_max_tokens=4, max_tokens_cap=4)
        box["runner"], box["url"] = await start_emulator(cfg)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    assert ready.wait(10)
    host, port = box["url"].removeprefix("http://").split(":")
    yield host, int(port)
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | json_values},
    optional={"content": st.text(max_size=40) | json_values},
)
chat_body = st.fixed_dictionaries(
    {"model": st.just(MODEL) | json_values, "messages": st.lists(message, max_size=3) | json_values},
    optional={
        "max_tokens": st.integers(-5, 50_000) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | json_values}) | json_values,
        "n": st.integers(0, 3),
        "continue_final_message": st.booleans(),
        "add_generation_prompt": st.booleans(),
    },
)
completion_body = st.fixed_dictionaries(
    {
        "model": st.just(MODEL) | json_values,
        "prompt": st.text(max_size=40) | st.lists(st.integers(0, 2**40), max_size=5) | json_values,
    },
    optional={"max_tokens": st.integers(-5, 50_000) | json_values, "stream": st.booleans()},
)


def _post(server: tuple[str, int], path: str, raw: bytes) -> int:
    conn = http.client.HTTPConnection(*server, timeout=10)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status >= 400:
            assert json.loads(data)["error"]["code"] == resp.status
        return resp.status
    finally:
        conn.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.tuples(st.just("/v1/chat/completions"), chat_body | json_values),
        st.tuples(st.just("/v1/completions"), completion_body | json_values),
    )
)
def test_no_5xx_from_input(server: tuple[str, int], body: tuple[str, Any]) -> None:
    path, obj = body
    raw = json.dumps(obj, allow_nan=True).encode()
    assert _post(server, path, raw) in (200, 400, 404)


def test_non_utf8_and_huge_numbers(server: tuple[str, int]) -> None:
    assert _post(server, "/v1/completions", b"\xff\xfe{") == 400
    assert (
        _post(server, "/v1/completions", b'{"model": "llama-3-8b", "prompt": "x", "max_tokens": 1e400}')
        == 400
    )
