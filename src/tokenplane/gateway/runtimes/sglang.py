"""SGLang (``python -m sglang.launch_server --enable-metrics``).

Metrics (``python/sglang/srt/metrics/collector.py``, ``SchedulerMetricsCollector`` and the
tokenizer manager's collector; label ``model_name``, plus rank labels under data parallelism, which
are summed): ``sglang:num_running_reqs`` (running), ``sglang:num_queue_reqs`` (waiting),
``sglang:token_usage`` (KV pool use, 0..1), ``sglang:max_total_num_tokens`` (the KV pool's size in
tokens), and the counters ``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total`` (prompt
tokens served from the radix cache, labelled ``cache_source``: device, host, storage), which play
vLLM's prefix-cache queries and hits. ``sglang:cache_hit_rate`` is a recent-window rate, not a
counter, and is not read. (Names as in SGLang's ``docs/references/production_metrics.md``.)

Continuation: SGLang's OpenAI server accepts ``continue_final_message`` on chat requests (its
``ChatCompletionRequest``; example ``examples/runtime/openai_chat_with_response_prefill.py``):
``serving_chat.py`` takes a final assistant message off the conversation, renders the template with
the generation prompt, and appends that message's content as the assistant's prefix. So only
``continue_final_message: true`` is sent: vLLM's ``add_generation_prompt: false`` is not an SGLang
field, and what it asks for is what SGLang already does. Text completions: prompt plus delivered text.

KV events: none read (the gateway's KV-event reader speaks vLLM's feed).
"""

from __future__ import annotations

from tokenplane.gateway.runtimes.base import KV_CAPACITY_TOKENS, Capabilities, Runtime

METRIC_NAMES = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_usage",
    "sglang:max_total_num_tokens": KV_CAPACITY_TOKENS,
    "sglang:prompt_tokens_total": "prefix_cache_queries",
    "sglang:cached_tokens_total": "prefix_cache_hits",
}

RUNTIME = Runtime(
    "sglang",
    metric_names=METRIC_NAMES,
    capabilities=Capabilities(metrics=True, can_continue_chat=True, serves_embeddings=True),
    chat_continuation={"continue_final_message": True},
)
