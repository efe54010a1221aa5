"""What every workload hands the simulator: request specs in arrival order, and follow-ups.

Open-loop sources (traces, Poisson) yield everything from :meth:`Workload.arrivals`; closed-loop
sources (agentic users who think between steps) also return follow-up requests from
:meth:`Workload.on_finished`, which the fleet calls when a request completes or fails.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import msgspec

from tokenplane.core.views import WorkflowContext

DEFAULT_HASH_BLOCK_TOKENS = 512
"""Prompt tokens per ``block_hashes`` entry unless a workload says otherwise (Mooncake's block)."""


class RequestSpec(msgspec.Struct, frozen=True, gc=False):
    """One model call as the workload defines it.

    ``block_hashes`` are chained prefix-block ids, one per full block of ``hash_block_tokens`` prompt
    tokens: two requests share KV for exactly their common leading ids (Mooncake's ``hash_ids``).
    ``output_tokens`` is what the model will generate; ``max_output_tokens`` what the client
    asked for (the router only sees the latter). ``priority`` and ``latency_budget_s`` are the
    request's own service class: what it asks of the control plane and what its goodput counts against.

    ``gc=False``: specs are immutable and hold only scalars, tuples of ints and frozen structs, so
    they cannot form reference cycles; the cyclic collector need not track the millions a run makes.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
    tenant: str = "default"
    model: str = ""
    max_output_tokens: int = 0
    workflow: WorkflowContext | None = None
    priority: int = 0
    """Priority class hint (1 interactive, 0 standard, -1 batch), passed to ``RequestInfo.priority``."""
    latency_budget_s: float | None = None
    """Time-to-first-token budget counted from arrival, passed to ``RequestInfo.latency_budget_s``."""
    adapter: str | None = None
    """The LoRA adapter the request asks for (the workload option ``adapters``), or the base model."""


class Workload(Protocol):
    name: str

    def arrivals(self) -> Iterator[RequestSpec]:
        """Open-loop requests, in non-decreasing ``arrival_s``; may be lazy and very long."""
        ...

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        """Follow-up requests caused by ``spec`` ending at ``finish_s`` (arrival >= finish_s)."""
        ...
