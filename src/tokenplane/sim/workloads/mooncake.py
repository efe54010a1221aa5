"""Replay of the Mooncake conversation trace (kvcache-ai/Mooncake, FAST'25), read lazily from JSONL.

Each line holds ``timestamp`` (ms from the start), ``input_length``, ``output_length`` and
``hash_ids`` (one id per 512-token prompt block; two requests share KV for their common leading ids).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from tokenplane.sim.workloads.base import RequestSpec

__all__ = ["MooncakeTrace"]


class MooncakeTrace:
    """Open-loop replay of a Mooncake-format JSONL trace.

    ``time_scale`` multiplies arrival times (0.5 replays twice as fast); ``limit`` keeps the first
    ``limit`` requests. Only *full* ``block_tokens`` blocks are hashed: a request keeps
    ``min(len(hash_ids), input_length // block_tokens)`` ids, so the id of a trailing partial block
    is never claimed as cacheable. Request ids run 0..n-1 in file order.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        time_scale: float = 1.0,
        limit: int | None = None,
        model: str = "",
        block_tokens: int = 512,
        tenant: str = "default",
        name: str = "mooncake",
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.path = Path(path)
        self.time_scale = time_scale
        self.limit = limit
        self.model = model
        self.block_tokens = block_tokens
        self.tenant = tenant
        self.name = name

    def arrivals(self) -> Iterator[RequestSpec]:
        scale = self.time_scale / 1000.0
        block = self.block_tokens
        limit = self.limit
        last_ts = -float("inf")
        rid = 0
        if limit == 0:
            return
        with self.path.open("r", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    ts = float(row["timestamp"])
                    inp = int(row["input_length"])
                    out = int(row["output_length"])
                    ids = row.get("hash_ids") or ()
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{self.path}:{lineno}: bad Mooncake record: {exc}") from exc
                if ts < last_ts:
                    raise ValueError(
                        f"{self.path}:{lineno}: timestamp {ts} goes back in time (was {last_ts})"
                    )
                last_ts = ts
                keep = min(len(ids), inp // block)
                out_tokens = max(1, out)
                yield RequestSpec(
                    request_id=rid,
                    arrival_s=ts * scale,
                    prompt_tokens=max(1, inp),
                    output_tokens=out_tokens,
                    block_hashes=tuple(int(h) for h in ids[:keep]),
                    hash_block_tokens=block,
                    tenant=self.tenant,
                    model=self.model,
                    max_output_tokens=out_tokens,
                )
                rid += 1
                if limit is not None and rid >= limit:
                    return

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()
