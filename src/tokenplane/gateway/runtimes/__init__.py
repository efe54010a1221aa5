"""Runtime adapters: what differs between the servers behind the gateway, one module per kind.

=============  ==========================  ================  ==========  =========
kind           metrics read                chat continuation  KV events  embeddings
=============  ==========================  ================  ==========  =========
``vllm``       ``vllm:*``                  yes               ZMQ         yes
``emulated``   ``vllm:*`` (the emulator)   yes               ZMQ         yes
``sglang``     ``sglang:*``                yes               no          yes
``llamacpp``   ``llamacpp:*``              no                no          yes
``openai``     none                        no                no          yes
=============  ==========================  ================  ==========  =========

Adding a runtime is one module here that builds a :class:`~tokenplane.gateway.runtimes.base.Runtime`
named ``RUNTIME``, one line in :data:`RUNTIMES` below, and its kind in
:class:`~tokenplane.gateway.config.InstanceKind` (``tests/gateway/runtimes/test_registry.py`` checks
that the two agree).
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenplane.gateway.runtimes import emulated, llamacpp, openai, sglang, vllm
from tokenplane.gateway.runtimes.base import Capabilities, Runtime, RuntimeMetrics

RUNTIMES: Mapping[str, Runtime] = {
    r.kind: r for r in (vllm.RUNTIME, emulated.RUNTIME, sglang.RUNTIME, llamacpp.RUNTIME, openai.RUNTIME)
}

PD_RUNTIMES: Mapping[str, vllm.VllmKvTransfer] = {"vllm": vllm.KV_TRANSFER, "emulated": vllm.KV_TRANSFER}
"""Kinds that serve a disaggregated pool (vLLM's KV-transfer flow; the emulator plays it), and
their request bodies for it."""

DEFAULT_RUNTIME = vllm.RUNTIME
"""What the gateway assumed of every instance before runtimes were adapters (vLLM's continuation)."""


def runtime_for(kind: str) -> Runtime:
    """The adapter of an instance kind; ``KeyError`` for a kind no module registers."""
    return RUNTIMES[kind]


__all__ = [
    "DEFAULT_RUNTIME",
    "PD_RUNTIMES",
    "RUNTIMES",
    "Capabilities",
    "Runtime",
    "RuntimeMetrics",
    "runtime_for",
]
