"""The workload option ``adapters``: requests that ask for LoRA adapters.

:class:`AdapterWorkload` tags each request of any workload with one of ``count`` adapters
(``adapter-0`` ...), drawn from a Zipf law of exponent ``zipf_s`` (adapter ``k`` has weight
``1 / (k + 1) ** s``): a few hot adapters and a long tail, as in multi-tenant fleets. The engine
side (slots, load time) is :mod:`tokenplane.sim.lora`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from itertools import accumulate

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from tokenplane.sim.workloads.base import RequestSpec, Workload


class AdapterSettings(BaseModel):
    """The workload option ``adapters: {count, zipf_s, seed}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(gt=0)
    zipf_s: float = Field(1.0, ge=0)
    seed: int | None = None


def adapter_name(k: int) -> str:
    return f"adapter-{k}"


class AdapterWorkload:
    """``inner``'s requests, each tagged with an adapter drawn from a Zipf law (see module docs)."""

    def __init__(self, inner: Workload, *, count: int, zipf_s: float = 1.0, seed: int = 0) -> None:
        if count <= 0:
            raise ValueError(f"adapters count must be > 0, got {count}")
        self.inner = inner
        self.name = inner.name
        self.names = [adapter_name(k) for k in range(count)]
        self.cum = list(accumulate(1.0 / (k + 1) ** zipf_s for k in range(count)))
        self.seed = seed

    def _tag(self, spec: RequestSpec, rng: random.Random) -> RequestSpec:
        pick = rng.choices(self.names, cum_weights=self.cum)[0]
        return msgspec.structs.replace(spec, adapter=pick)

    def arrivals(self) -> Iterator[RequestSpec]:
        rng = random.Random(self.seed)  # every call replays the same tags
        for spec in self.inner.arrivals():
            yield self._tag(spec, rng)

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        # a follow-up keeps its conversation's adapter
        return [
            msgspec.structs.replace(s, adapter=spec.adapter)
            for s in self.inner.on_finished(spec, finish_s, ok)
        ]
