"""Replay of the Mooncake conversation trace (kvcache-ai/Mooncake, FAST'25), read lazily from JSONL.

Each line holds ``timestamp`` (ms from the start), ``input_length``, ``output_length`` and
``hash_ids`` (one id per 512-token prompt block; two requests share KV for their common leading ids).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.replay import TraceReplay

__all__ = ["MooncakeTrace"]


class MooncakeTrace(TraceReplay):
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
        super().__init__(path, time_scale, limit, model, tenant, name)
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.block_tokens = block_tokens

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
                yield self._request(rid, ts * scale, inp, out, tuple(int(h) for h in ids[:keep]), block)
                rid += 1
                if limit is not None and rid >= limit:
                    return
