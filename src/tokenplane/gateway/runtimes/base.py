"""What a runtime adapter is: metric names, the continuation request, KV events, capabilities.

A :class:`Runtime` is data plus two small pure functions, one instance per runtime kind (see the
sibling modules and the registry in :mod:`tokenplane.gateway.runtimes`). Nothing here does I/O:
the pool scrapes ``/metrics`` and hands the text to :meth:`Runtime.parse_metrics`; the splicer asks
:meth:`Runtime.continuation` for the request that continues a stream that broke.

Metric names map a Prometheus sample name to one field of :class:`RuntimeMetrics`. Samples are
summed over their label sets (several engines, data-parallel ranks, SGLang's ``cache_source``).
Three fields are special:

* ``kv_capacity_info``: an info gauge whose *labels* give the cache size (vLLM's
  ``vllm:cache_config_info``: ``num_gpu_blocks`` x ``block_size``);
* ``kv_capacity_tokens``: a gauge whose *value* is the cache size in tokens (SGLang's
  ``sglang:max_total_num_tokens``);
* ``kv_used_tokens``: tokens in the cache now (llama.cpp's ``llamacpp:kv_cache_tokens``); with the
  usage ratio it gives the capacity (``used / usage``) where nothing states it.

Parsing filters the (large, histogram-heavy) exposition down to the lines whose names it reads
before handing them to ``prometheus_client``'s parser: a full parse of a vLLM page costs
milliseconds, the filtered one tens of microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

KV_CAPACITY_INFO = "kv_capacity_info"
"""Field name for an info metric read from its labels (``num_gpu_blocks`` x ``block_size``)."""
KV_CAPACITY_TOKENS = "kv_capacity_tokens"
KV_USED_TOKENS = "kv_used_tokens"
LORA_INFO = "lora_info"
"""Field name for vLLM's ``vllm:lora_requests_info``: labels ``running_lora_adapters`` and
``waiting_lora_adapters`` (comma-separated names) and ``max_lora``; the value is the time it was set,
and older label sets may linger, so the sample with the largest value is the current one."""

_FIELDS = frozenset({"running", "waiting", "kv_usage", "prefix_cache_queries", "prefix_cache_hits"})
_SPECIAL = frozenset({KV_CAPACITY_INFO, KV_CAPACITY_TOKENS, KV_USED_TOKENS, LORA_INFO})


class RuntimeMetrics(msgspec.Struct, frozen=True):
    """What one scrape of a runtime said (sums over its label sets, e.g. several engines)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    kv_capacity_tokens: int = 0
    """The KV cache's size in tokens, where the runtime says it; 0: unknown."""
    lora_adapters: frozenset[str] = frozenset()
    """LoRA adapters the instance runs or has queued (vLLM's ``vllm:lora_requests_info``)."""
    max_lora: int = 0
    """Adapters the instance can hold at once (``--max-loras``); 0: unknown."""


class Capabilities(msgspec.Struct, frozen=True):
    """What a runtime kind can do, as far as the gateway relies on it."""

    metrics: bool = False
    """It publishes Prometheus metrics the gateway reads (load, KV use): scraped when true."""
    can_continue_chat: bool = False
    """A chat stream that broke can be continued (the delivered text as a final assistant message)."""
    can_continue_text: bool = True
    """A text completion that broke can be continued (the prompt plus the delivered text)."""
    kv_events: bool = False
    """It can publish exact prefix-cache state (vLLM's ZMQ KV events)."""
    serves_embeddings: bool = False
    """It answers ``/v1/embeddings`` (when started with an embedding model)."""


class Runtime:
    """One runtime kind's adapter. Instances are built once, in the kind's own module."""

    __slots__ = ("_prefixes", "capabilities", "chat_continuation", "kind", "metric_names")

    def __init__(
        self,
        kind: str,
        *,
        metric_names: Mapping[str, str],
        capabilities: Capabilities,
        chat_continuation: Mapping[str, Any] | None = None,
    ) -> None:
        for name, field in metric_names.items():
            if field not in _FIELDS and field not in _SPECIAL:
                raise ValueError(f"runtime {kind!r}: metric {name!r} maps to unknown field {field!r}")
        if capabilities.can_continue_chat != (chat_continuation is not None):
            raise ValueError(f"runtime {kind!r}: can_continue_chat needs chat_continuation, and only it")
        self.kind = kind
        self.metric_names: Mapping[str, str] = dict(metric_names)
        self.capabilities = capabilities
        self.chat_continuation: Mapping[str, Any] | None = (
            None if chat_continuation is None else dict(chat_continuation)
        )
        """Fields set on a chat request that continues a final assistant message; None: cannot."""
        self._prefixes = tuple(metric_names)

    def __repr__(self) -> str:
        return f"Runtime({self.kind!r})"

    # -- metrics ------------------------------------------------------------------------------
    def parse_metrics(self, text: str) -> RuntimeMetrics:
        """Read the runtime's gauges and counters from a Prometheus text exposition."""
        names = self.metric_names
        if not names:
            return RuntimeMetrics()
        prefixes = self._prefixes
        wanted = "\n".join(line for line in text.splitlines() if line.startswith(prefixes))
        values: dict[str, float] = {}
        info_capacity = 0
        lora: tuple[float, Mapping[str, str]] | None = None
        for family in text_string_to_metric_families(wanted + "\n"):
            for sample in family.samples:
                field = names.get(sample.name)
                if field is None:
                    continue
                if field == KV_CAPACITY_INFO:
                    info_capacity += _cache_tokens(sample.labels)
                elif field == LORA_INFO:
                    if lora is None or sample.value >= lora[0]:
                        lora = (float(sample.value), sample.labels)
                else:
                    values[field] = values.get(field, 0.0) + float(sample.value)
        capacity = info_capacity or max(0, int(values.pop(KV_CAPACITY_TOKENS, 0.0)))
        used = values.pop(KV_USED_TOKENS, 0.0)
        usage = values.get("kv_usage", 0.0)
        if not capacity and used > 0 and usage > 0:
            capacity = round(used / usage)
        return RuntimeMetrics(
            running=values.get("running", 0.0),
            waiting=values.get("waiting", 0.0),
            kv_usage=usage,
            prefix_cache_queries=values.get("prefix_cache_queries", 0.0),
            prefix_cache_hits=values.get("prefix_cache_hits", 0.0),
            kv_capacity_tokens=capacity,
            lora_adapters=_adapters(lora[1]) if lora is not None else frozenset(),
            max_lora=_int_label(lora[1], "max_lora") if lora is not None else 0,
        )

    # -- continuation -------------------------------------------------------------------------
    def can_continue(self, endpoint: str, body: Mapping[str, Any]) -> bool:
        """Whether a broken stream of this request can be continued on this runtime."""
        if body.get("n") not in (None, 1):
            return False
        if endpoint == "chat":
            return self.chat_continuation is not None
        if not self.capabilities.can_continue_text or body.get("echo"):
            return False
        prompt = body.get("prompt")
        return type(prompt) is str or (type(prompt) is list and len(prompt) == 1 and type(prompt[0]) is str)

    def continuation(
        self, endpoint: str, body: Mapping[str, Any], text: str, tokens: int
    ) -> dict[str, Any] | None:
        """The request that continues ``body`` after ``text`` (``tokens`` tokens) was delivered;
        None when this runtime cannot continue it (the splicer then ends the stream with the error)."""
        out = dict(body)
        if not text and not tokens:
            return out
        if endpoint == "chat":
            fields = self.chat_continuation
            if fields is None:
                return None
            messages = list(out["messages"])
            last = messages[-1] if messages else None
            if (
                out.get("continue_final_message")
                and isinstance(last, dict)
                and last.get("role") == "assistant"
            ):
                prior = last.get("content")
                messages[-1] = {**last, "content": (prior if isinstance(prior, str) else "") + text}
            else:
                messages.append({"role": "assistant", "content": text})
            out["messages"] = messages
            out.update(fields)
            keys: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
        else:
            if not self.capabilities.can_continue_text:
                return None
            prompt = out["prompt"]
            out["prompt"] = prompt + text if type(prompt) is str else [prompt[0] + text]
            keys = ("max_tokens",)
        for key in keys:
            v = out.get(key)
            if type(v) is int:
                out[key] = max(1, v - tokens)
        mt = out.get("min_tokens")
        if type(mt) is int:
            out["min_tokens"] = max(0, mt - tokens)
        return out


def _cache_tokens(labels: Mapping[str, str]) -> int:
    try:
        return max(0, int(labels.get("num_gpu_blocks") or 0)) * max(0, int(labels.get("block_size") or 0))
    except ValueError:  # "None" before the engine has sized its cache
        return 0


def _adapters(labels: Mapping[str, str]) -> frozenset[str]:
    names = f"{labels.get('running_lora_adapters', '')},{labels.get('waiting_lora_adapters', '')}"
    return frozenset(n.strip() for n in names.split(",") if n.strip())


def _int_label(labels: Mapping[str, str], key: str) -> int:
    try:
        return max(0, int(labels.get(key) or 0))
    except ValueError:
        return 0
