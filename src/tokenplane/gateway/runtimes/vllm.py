"""vLLM (v1 engine; the v0 spelling of KV use is read too).

Metrics (``vllm/v1/metrics/loggers.py``; labels ``model_name``, ``engine``):
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(``vllm:gpu_cache_usage_perc`` before 0.10), the prefix-cache counters
``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (tokens), and the info
gauge ``vllm:cache_config_info`` whose labels ``num_gpu_blocks`` x ``block_size`` give the KV
cache's size in tokens; and ``vllm:lora_requests_info`` (``vllm/v1/metrics/loggers.py``), whose
labels ``running_lora_adapters``, ``waiting_lora_adapters`` and ``max_lora`` say which LoRA adapters
the instance runs (the sample with the latest value; its value is the time it was set).

Continuation: vLLM's chat API continues a final assistant message with
``continue_final_message: true`` and ``add_generation_prompt: false`` (both request fields of its
OpenAI server); text completions take the prompt plus the delivered text.

Disaggregated prefill/decode: :class:`VllmKvTransfer` builds the two requests of vLLM's KV-transfer
flow and reads the prefill's handover (:mod:`tokenplane.gateway.disagg`).

KV events: vLLM publishes block stored/removed events on ZMQ (``--kv-events-config``), read by
:mod:`tokenplane.gateway.kv_events` for exact prefix-cache routing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tokenplane.gateway.runtimes.base import KV_CAPACITY_INFO, LORA_INFO, Capabilities, Runtime

METRIC_NAMES: dict[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",  # vLLM < 0.10
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:cache_config_info": KV_CAPACITY_INFO,
    "vllm:lora_requests_info": LORA_INFO,
}
CHAT_CONTINUATION: dict[str, Any] = {"continue_final_message": True, "add_generation_prompt": False}

CAPABILITIES: Capabilities = Capabilities(
    metrics=True, can_continue_chat=True, can_continue_text=True, kv_events=True, serves_embeddings=True
)

RUNTIME = Runtime(
    "vllm", metric_names=METRIC_NAMES, capabilities=CAPABILITIES, chat_continuation=CHAT_CONTINUATION
)


class VllmKvTransfer:
    """vLLM's disaggregated prefill/decode request bodies (NixlConnector's flow, as vLLM's P/D proxy
    ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` sends them): the prefill asks for
    one token, not streamed, with ``kv_transfer_params.do_remote_decode``; its answer's
    ``kv_transfer_params`` go, as they came, into the decode request."""

    REQUIRED = ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")

    def prefill_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(body)
        out["kv_transfer_params"] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
        out["stream"] = False
        out["max_tokens"] = 1
        if "max_completion_tokens" in out:
            out["max_completion_tokens"] = 1
        for key in ("stream_options", "min_tokens"):  # min_tokens > max_tokens is refused
            out.pop(key, None)
        return out

    def decode_body(self, body: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(body)
        out["kv_transfer_params"] = dict(params)
        return out

    def handover(self, answer: bytes) -> dict[str, Any] | str:
        """The prefill answer's ``kv_transfer_params``, or what is wrong with them."""
        try:
            obj = msgspec.json.decode(answer)
        except msgspec.DecodeError:
            return "its answer is not JSON"
        params = obj.get("kv_transfer_params") if isinstance(obj, dict) else None
        if not isinstance(params, dict):
            return (
                "its answer has no kv_transfer_params: is it started with a KV connector "
                "(--kv-transfer-config, kv_role kv_producer or kv_both)?"
            )
        if not params.get("do_remote_prefill"):
            return "its kv_transfer_params do not offer the KV for remote decode (do_remote_prefill)"
        missing = [k for k in self.REQUIRED if params.get(k) is None]
        if missing:
            return f"its kv_transfer_params lack {', '.join(missing)}"
        return params


KV_TRANSFER = VllmKvTransfer()
