"""Per-request and per-instance measurements a twin run produces; the report reads only these."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec


class RequestRecord(msgspec.Struct, gc=False):
    """Timeline of one request. Times are virtual seconds; ``None`` where the stage never happened.

    ``gc=False``: a run keeps one per request (millions) and they hold only scalars, so they can
    never be part of a reference cycle; the cyclic collector need not scan them.
    """

    request_id: int
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    instance_id: str | None = None
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    prefix_hit_tokens: int = 0
    prefix_bound_tokens: int = 0
    preemptions: int = 0
    ok: bool = False
    reason: str = ""
    route_reason: str = ""
    attempts: int = 1
    interrupted: bool = False

    @property
    def queue_s(self) -> float | None:
        return None if self.scheduled_s is None else self.scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time between output tokens (vLLM's TPOT): decode time over tokens after the first."""
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class InstanceSample:
    """One point of an instance's timeline: busy fraction since the previous sample, KV use now."""

    t_s: float
    busy_fraction: float
    kv_usage: float
    running: int
    waiting: int


@dataclass(slots=True)
class InstanceRecord:
    instance_id: str
    gpu: str
    model: str
    price_per_hour: float
    busy_s: float = 0.0
    alive_s: float = 0.0
    steps: int = 0
    adapter_loads: int = 0  # LoRA adapters loaded into a slot (sim/lora.py)
    samples: list[InstanceSample] = field(default_factory=list)


_floor, _log = math.floor, math.log  # bound once: TbtHistogram.add runs for every engine step or run


@dataclass(slots=True)
class TbtHistogram:
    """Token-weighted histogram of time between tokens, log-spaced buckets (about 2 % wide).

    Decode runs add many identical-ish steps at once, so recording every gap would cost a list
    entry per token; a histogram costs one update per run of steps.
    """

    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0

    def add(self, gap_s: float, weight: int) -> None:
        if weight <= 0 or gap_s <= 0:
            return
        key = _floor(_log(gap_s) * 50.0)
        counts = self.counts
        counts[key] = counts.get(key, 0) + weight
        self.total += weight

    def percentile(self, q: float) -> float | None:
        if self.total == 0:
            return None
        target = q / 100.0 * self.total
        seen = 0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen >= target:
                return math.exp((key + 0.5) / 50.0)
        return math.exp((max(self.counts) + 0.5) / 50.0)
