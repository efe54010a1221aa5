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

KV events: vLLM publishes block stored/removed events on ZMQ (``--kv-events-config``), read by
:mod:`tokenplane.gateway.kv_events` for exact prefix-cache routing.
"""

from __future__ import annotations

from tokenplane.gateway.runtimes.base import KV_CAPACITY_INFO, LORA_INFO, Capabilities, Runtime

METRIC_NAMES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",  # vLLM < 0.10
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:cache_config_info": KV_CAPACITY_INFO,
    "vllm:lora_requests_info": LORA_INFO,
}
CHAT_CONTINUATION = {"continue_final_message": True, "add_generation_prompt": False}

CAPABILITIES = Capabilities(
    metrics=True, can_continue_chat=True, can_continue_text=True, kv_events=True, serves_embeddings=True
)

RUNTIME = Runtime(
    "vllm", metric_names=METRIC_NAMES, capabilities=CAPABILITIES, chat_continuation=CHAT_CONTINUATION
)
