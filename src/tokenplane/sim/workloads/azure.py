"""Replay of the Azure LLM inference trace (Azure/AzurePublicDataset, Splitwise ISCA'24).

CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps like ``2023-11-16 18:15:46.6805900``
(seven fractional digits, parsed by hand). No prompt content, so no prefix hashes.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import date
from pathlib import Path

from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.replay import TraceReplay

__all__ = ["AzureTrace", "parse_azure_timestamp"]


def parse_azure_timestamp(text: str) -> tuple[int, float]:
    """``'2023-11-16 18:15:46.6805900'`` -> (whole seconds since 0001-01-01, fraction of a second).

    Split in two so that differences keep sub-microsecond precision.
    """
    text = text.strip()
    day_part, _, time_part = text.partition(" ")
    if not time_part:
        day_part, _, time_part = text.partition("T")
    hh, mm, ss = time_part.split(":")
    whole, _, frac = ss.partition(".")
    frac = frac.rstrip("Z")
    secs = date.fromisoformat(day_part).toordinal() * 86400 + int(hh) * 3600 + int(mm) * 60 + int(whole)
    return secs, (int(frac) / 10 ** len(frac)) if frac else 0.0


class AzureTrace(TraceReplay):
    """Open-loop replay of an Azure-format CSV; arrivals relative to the first row, times ``time_scale``."""

    def __init__(
        self,
        path: str | Path,
        *,
        time_scale: float = 1.0,
        limit: int | None = None,
        model: str = "",
        tenant: str = "default",
        name: str = "azure",
    ) -> None:
        super().__init__(path, time_scale, limit, model, tenant, name)

    def arrivals(self) -> Iterator[RequestSpec]:
        limit = self.limit
        if limit == 0:
            return
        scale = self.time_scale
        with self.path.open("r", encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                return
            cols = [h.strip() for h in header]
            try:
                i_ts, i_in, i_out = (cols.index(c) for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
            except ValueError as exc:
                raise ValueError(
                    f"{self.path}: expected header TIMESTAMP,ContextTokens,GeneratedTokens, got {header}"
                ) from exc
            first: tuple[int, float] | None = None
            last = -float("inf")
            rid = 0
            for lineno, row in enumerate(reader, start=2):
                if not row:
                    continue
                try:
                    ts = row[i_ts]
                    secs, frac = parse_azure_timestamp(ts)
                    inp = int(row[i_in])
                    out = int(row[i_out])
                except (ValueError, IndexError) as exc:
                    raise ValueError(f"{self.path}:{lineno}: bad Azure record {row}: {exc}") from exc
                if first is None:
                    first = (secs, frac)
                rel = (secs - first[0]) + (frac - first[1])
                if rel < last:
                    raise ValueError(f"{self.path}:{lineno}: timestamp {ts} goes back in time")
                last = rel
                yield self._request(rid, rel * scale, inp, out)
                rid += 1
                if limit is not None and rid >= limit:
                    return
