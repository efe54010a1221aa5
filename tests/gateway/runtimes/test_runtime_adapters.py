"""Runtime adapters: metric names read per runtime, continuation requests, the registry."""

from __future__ import annotations

from typing import Any

import pytest

from tokenplane.gateway.config import ConfigError, InstanceKind, parse_config
from tokenplane.gateway.continuation import can_continue, continuation_body
from tokenplane.gateway.request import ParsedRequest
from tokenplane.gateway.runtimes import DEFAULT_RUNTIME, RUNTIMES, RuntimeMetrics, runtime_for
from tokenplane.gateway.runtimes.base import Capabilities, Runtime

# What SGLang's /metrics looks like (docs/references/production_metrics.md, collector.py): labels
# model_name, counters with _total, cached tokens by cache_source, two data-parallel ranks.
SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m"} 3.0
sglang:num_running_reqs{dp_rank="1",model_name="m"} 1.0
# TYPE sglang:num_running_reqs_offline_batch gauge
sglang:num_running_reqs_offline_batch{dp_rank="0",model_name="m"} 9.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="m"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="m"} 0.28
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{dp_rank="0",model_name="m"} 0.5
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",model_name="m"} 161721.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 8000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 3000.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 1000.0
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2.0
"""

# llama.cpp's server (tools/server/README.md, GET /metrics): no labels.
LLAMACPP_PAGE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1024
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


@pytest.mark.parametrize(
    ("kind", "page", "expected"),
    [
        ("sglang", SGLANG_PAGE, RuntimeMetrics(4, 5, 0.28, 8000, 4000, kv_capacity_tokens=161721)),
        ("llamacpp", LLAMACPP_PAGE, RuntimeMetrics(2, 3, 0.25, kv_capacity_tokens=4096)),
        # A recent llama.cpp build without the KV gauges: load only, capacity unknown.
        ("llamacpp", LLAMACPP_PAGE.replace("kv_cache", "x_kv"), RuntimeMetrics(2, 3)),
        ("vllm", SGLANG_PAGE + LLAMACPP_PAGE, RuntimeMetrics()),
        ("openai", SGLANG_PAGE, RuntimeMetrics()),
    ],
)
def test_each_runtime_reads_its_own_names(kind: str, page: str, expected: RuntimeMetrics) -> None:
    assert runtime_for(kind).parse_metrics(page) == expected


def test_every_instance_kind_has_an_adapter_and_no_adapter_lacks_a_kind() -> None:
    assert set(RUNTIMES) == {k.value for k in InstanceKind}
    assert all(RUNTIMES[k].kind == k for k in RUNTIMES)
    assert DEFAULT_RUNTIME is runtime_for("vllm")


def test_an_adapter_is_checked_when_built() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        Runtime("x", metric_names={"x:y": "load"}, capabilities=Capabilities())
    with pytest.raises(ValueError, match="chat_continuation"):
        Runtime("x", metric_names={}, capabilities=Capabilities(can_continue_chat=True))


def _parsed(endpoint: str, body: dict[str, Any]) -> ParsedRequest:
    """A real ParsedRequest (the compiled build checks the type) with the two fields continuation
    reads; the rest are placeholders it never looks at."""
    return ParsedRequest(endpoint, body, "m", True, "", 0, None)  # type: ignore[arg-type]


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "min_tokens": 4}
TEXT = {"model": "m", "prompt": "Once ", "max_tokens": 10}
VLLM_CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello th"}],
    "max_tokens": 7,
    "min_tokens": 1,
    "continue_final_message": True,
    "add_generation_prompt": False,
}


@pytest.mark.parametrize(
    ("kind", "endpoint", "body", "expected"),
    [
        ("vllm", "chat", CHAT, VLLM_CHAT),
        ("emulated", "chat", CHAT, VLLM_CHAT),
        (
            "sglang",
            "chat",
            CHAT,
            {k: v for k, v in VLLM_CHAT.items() if k != "add_generation_prompt"},
        ),
        ("llamacpp", "chat", CHAT, None),
        ("openai", "chat", CHAT, None),
        *[
            (kind, "text", TEXT, {"model": "m", "prompt": "Once Hello th", "max_tokens": 7})
            for kind in ("vllm", "emulated", "sglang", "llamacpp", "openai")
        ],
        (
            "vllm",
            "text",
            {**TEXT, "prompt": ["Once "]},
            {**TEXT, "prompt": ["Once Hello th"], "max_tokens": 7},
        ),
    ],
)
def test_continuation_request_per_runtime(
    kind: str, endpoint: str, body: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    runtime = runtime_for(kind)
    parsed = _parsed(endpoint, body)
    assert runtime.continuation(endpoint, body, "Hello th", 3) == expected
    assert can_continue(parsed, [runtime]) is (expected is not None)
    if expected is not None:
        assert continuation_body(parsed, "Hello th", 3, runtime) == expected
    else:
        with pytest.raises(ValueError, match="cannot continue"):
            continuation_body(parsed, "Hello th", 3, runtime)


def test_a_client_prefill_is_extended_not_repeated() -> None:
    body = {
        **VLLM_CHAT,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}],
    }
    out = runtime_for("sglang").continuation("chat", body, '"a": 1', 2)
    assert out is not None and out["messages"][-1] == {"role": "assistant", "content": '{"a": 1'}


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", {**CHAT, "n": 2}),
        ("text", {**TEXT, "echo": True}),
        ("text", {**TEXT, "prompt": [1, 2, 3]}),
        ("text", {**TEXT, "prompt": ["a", "b"]}),
    ],
)
def test_what_no_runtime_continues(endpoint: str, body: dict[str, Any]) -> None:
    for runtime in RUNTIMES.values():
        assert not runtime.can_continue(endpoint, body)


def test_the_default_continuation_is_vllms_as_before() -> None:
    parsed = _parsed("chat", CHAT)
    assert can_continue(parsed)
    assert continuation_body(parsed, "Hello th", 3) == VLLM_CHAT
    # A mixed pool continues only what every runtime in it continues.
    assert not can_continue(parsed, [runtime_for("vllm"), runtime_for("llamacpp")])


def _config(**instance: Any) -> dict[str, Any]:
    return {
        "tenants": [{"name": "t", "api_keys": ["sha256:" + "0" * 64]}],
        "models": [{"name": "m"}],
        "instances": [{"id": "i", "url": "http://127.0.0.1:1", "model": "m", **instance}],
    }


def test_kv_events_only_where_the_runtime_publishes_them() -> None:
    events = {"endpoint": "tcp://127.0.0.1:5557"}
    assert parse_config(_config(kind="vllm", kv_events=events)).instances[0].kv_events is not None
    with pytest.raises(ConfigError, match="kv_events"):
        parse_config(_config(kind="sglang", kv_events=events))
    assert parse_config(_config(kind="sglang")).instances[0].kind is InstanceKind.SGLANG
