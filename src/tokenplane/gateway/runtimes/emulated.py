"""The project's emulator (``tokenplane emulate``): vLLM's API and metric names, so vLLM's adapter
under its own kind. (``tokenplane emulate --runtime sglang|llamacpp`` publishes another runtime's
metric names instead: configure such an instance with that runtime's kind.)"""

from __future__ import annotations

from tokenplane.gateway.runtimes import vllm
from tokenplane.gateway.runtimes.base import Runtime

RUNTIME = Runtime(
    "emulated",
    metric_names=vllm.METRIC_NAMES,
    capabilities=vllm.CAPABILITIES,
    chat_continuation=vllm.CHAT_CONTINUATION,
)
