"""vLLM's Prometheus metrics (v1 engine names, labels ``model_name`` and ``engine``) on an own registry,
published as vLLM does or, with a runtime flavour (``tokenplane emulate --runtime``), under SGLang's or
llama.cpp's names (the gauges a gateway reads; see :func:`VllmMetrics.render`).

prometheus_client appends ``_total`` to counters on exposition, as it does for vLLM, so
``vllm:prefix_cache_hits`` is scraped as ``vllm:prefix_cache_hits_total``. Prefix-cache counters are
in tokens. Latencies are in the instance's virtual seconds (what the emulated GPU would measure);
at ``--speed 1`` they are wall-clock seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")
RUNTIME_FLAVOURS = ("vllm", "sglang", "llamacpp")


class VllmMetrics:
    def __init__(
        self,
        model_name: str,
        engine: str = "0",
        *,
        block_size: int = 0,
        num_gpu_blocks: int = 0,
        max_lora: int = 0,
    ) -> None:
        self.model_name = model_name
        self.kv_capacity_tokens = block_size * num_gpu_blocks
        self.registry = r = CollectorRegistry(auto_describe=True)
        names = ["model_name", "engine"]
        lv = (model_name, engine)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r).labels(*lv)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r).labels(*lv)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, registry=r, buckets=buckets).labels(*lv)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.max_lora = max_lora
        self.lora_info: Gauge | None = None
        if max_lora:  # vLLM's LoRA info gauge (only when serving adapters): names as labels
            self.lora_info = Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                registry=r,
            )
        if num_gpu_blocks:  # vLLM's info gauge: the cache's size as labels, value 1
            info = ["block_size", "num_gpu_blocks", "enable_prefix_caching"]
            Gauge(
                "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", info, registry=r
            ).labels(str(block_size), str(num_gpu_blocks), "True").set(1)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(*lv, reason) for reason in FINISH_REASONS}
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )

    def set_lora(self, running: list[str], waiting: list[str], now: float) -> None:
        """One current label set, valued at ``now`` (vLLM sets it to the time; it keeps old label
        sets too, which readers tell apart by that value)."""
        if self.lora_info is None:
            return
        self.lora_info.clear()
        self.lora_info.labels(str(self.max_lora), ",".join(waiting), ",".join(running)).set(now)

    def render(self, flavour: str = "vllm") -> bytes:
        """The exposition in ``flavour``'s names: ``vllm`` (all of the above), ``sglang`` or
        ``llamacpp`` (the load, KV and token gauges and counters those runtimes publish, from the
        same values; see :mod:`tokenplane.gateway.runtimes` for where the names come from)."""
        if flavour == "vllm":
            return generate_latest(self.registry)
        v: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                v[sample.name] = v.get(sample.name, 0.0) + sample.value
        usage = v.get("vllm:kv_cache_usage_perc", 0.0)
        generated = v.get("vllm:generation_tokens_total", 0.0)
        cap = self.kv_capacity_tokens
        if flavour == "sglang":
            label = f'{{model_name="{self.model_name}"}}'
            queries = v.get("vllm:prefix_cache_queries_total", 0.0)
            hits = v.get("vllm:prefix_cache_hits_total", 0.0)
            rows = [
                ("sglang:num_running_reqs", "gauge", label, v.get("vllm:num_requests_running", 0.0)),
                ("sglang:num_queue_reqs", "gauge", label, v.get("vllm:num_requests_waiting", 0.0)),
                ("sglang:token_usage", "gauge", label, usage),
                ("sglang:num_used_tokens", "gauge", label, round(usage * cap)),
                ("sglang:cache_hit_rate", "gauge", label, hits / queries if queries else 0.0),
                ("sglang:prompt_tokens_total", "counter", label, queries),
                (
                    "sglang:cached_tokens_total",
                    "counter",
                    f'{{cache_source="device",model_name="{self.model_name}"}}',
                    hits,
                ),
                ("sglang:generation_tokens_total", "counter", label, generated),
            ]
            if cap:
                rows.append(("sglang:max_total_num_tokens", "gauge", label, cap))
        elif flavour == "llamacpp":
            rows = [
                ("llamacpp:prompt_tokens_total", "counter", "", v.get("vllm:prompt_tokens_total", 0.0)),
                ("llamacpp:tokens_predicted_total", "counter", "", generated),
                ("llamacpp:kv_cache_usage_ratio", "gauge", "", usage),
                ("llamacpp:kv_cache_tokens", "gauge", "", round(usage * cap)),
                ("llamacpp:requests_processing", "gauge", "", v.get("vllm:num_requests_running", 0.0)),
                ("llamacpp:requests_deferred", "gauge", "", v.get("vllm:num_requests_waiting", 0.0)),
            ]
        else:
            raise ValueError(f"unknown runtime flavour {flavour!r}; known: {', '.join(RUNTIME_FLAVOURS)}")
        out = []
        for name, kind, labels, value in rows:
            out.append(f"# TYPE {name} {kind}\n{name}{labels} {float(value)!r}\n")
        return "".join(out).encode()
