"""What the trace replays (:mod:`.azure`, :mod:`.mooncake`) share: their options, checked, and how
one row of a trace becomes a request."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenplane.sim.workloads.base import DEFAULT_HASH_BLOCK_TOKENS, RequestSpec

__all__ = ["TraceReplay"]


class TraceReplay:
    """Open-loop replay of a trace file: arrival times multiplied by ``time_scale``, the first
    ``limit`` rows (all when ``None``), no follow-up requests."""

    def __init__(
        self, path: str | Path, time_scale: float, limit: int | None, model: str, tenant: str, name: str
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.path = Path(path)
        self.time_scale = time_scale
        self.limit = limit
        self.model = model
        self.tenant = tenant
        self.name = name

    def _request(
        self,
        rid: int,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        block_hashes: tuple[int, ...] = (),
        hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS,
    ) -> RequestSpec:
        """A row's request: at least one token in and out, and the client asks for what the trace
        generated."""
        out = max(1, output_tokens)
        return RequestSpec(
            request_id=rid,
            arrival_s=arrival_s,
            prompt_tokens=max(1, prompt_tokens),
            output_tokens=out,
            block_hashes=block_hashes,
            hash_block_tokens=hash_block_tokens,
            tenant=self.tenant,
            model=self.model,
            max_output_tokens=out,
        )

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()
