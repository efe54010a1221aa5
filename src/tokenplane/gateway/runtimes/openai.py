"""A generic OpenAI-compatible server: no metrics read (load comes from the gateway's own
accounting), no KV events. Text completions continue with the prompt plus the delivered text (plain
OpenAI semantics); chat does not (continuing a final assistant message is a vLLM/SGLang extension an
arbitrary server may ignore, which would repeat text to the client)."""

from __future__ import annotations

from tokenplane.gateway.runtimes.base import Capabilities, Runtime

RUNTIME = Runtime("openai", metric_names={}, capabilities=Capabilities(metrics=False, serves_embeddings=True))
