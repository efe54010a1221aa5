"""Synthetic open-loop traffic: renewal arrival processes and token-length distributions.

Lazy and cheap per request, so that millions of specs stream through the simulator without being
held in memory.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import msgspec

from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.dists import (
    ArrivalProcess,
    IntDist,
    LengthDist,
    interarrival_sampler,
    weibull_shape_for_cv,
)

__all__ = ["IntDist", "LengthDist", "SyntheticWorkload", "weibull_shape_for_cv"]


class ServiceClass(msgspec.Struct, frozen=True):
    """A share of the requests with their own priority class and TTFT budget (mixed budgets)."""

    weight: float = 1.0
    priority: int = 0
    latency_budget_s: float | None = None


class SyntheticWorkload:
    """Requests from a renewal process with mean rate ``rate_rps`` and inter-arrival cv ``cv``.

    ``process``: ``poisson`` (cv 1), ``gamma`` (shape 1/cv²) or ``weibull`` (shape solved from cv).
    Stops after ``num_requests`` requests or at ``duration_s`` seconds, whichever comes first (neither:
    endless). Prompt lengths: ``shared_prefix_tokens`` (a system prompt shared by every request of
    one of ``prefix_groups`` groups, chosen uniformly) plus a draw from ``prompt`` (at least 1 token).

    Block hashes (only when ``shared_prefix_tokens > 0``; otherwise ``()``, as nothing is shareable):
    one id per full ``hash_block_tokens`` block, the group's shared full blocks first (identical
    across the group), then ids unique to the request (a block straddling the end of the shared
    prefix is unique). Every ``arrivals()`` call replays the same stream for the same ``seed``;
    request ids are 0..n-1 in arrival order.
    """

    def __init__(
        self,
        *,
        rate_rps: float,
        num_requests: int | None = None,
        duration_s: float | None = None,
        process: ArrivalProcess = "poisson",
        cv: float = 1.0,
        prompt: LengthDist | None = None,
        output: LengthDist | None = None,
        seed: int = 0,
        shared_prefix_tokens: int = 0,
        prefix_groups: int = 1,
        hash_block_tokens: int = 16,
        tenant: str = "default",
        model: str = "",
        start_s: float = 0.0,
        name: str = "synthetic",
        classes: Sequence[ServiceClass] = (),
    ) -> None:
        if num_requests is not None and num_requests < 0:
            raise ValueError(f"num_requests must be >= 0, got {num_requests}")
        if duration_s is not None and duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {duration_s}")
        if shared_prefix_tokens < 0:
            raise ValueError(f"shared_prefix_tokens must be >= 0, got {shared_prefix_tokens}")
        if prefix_groups < 1:
            raise ValueError(f"prefix_groups must be >= 1, got {prefix_groups}")
        if hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1, got {hash_block_tokens}")
        # Validates rate, process and cv up front (raises ValueError on nonsense).
        interarrival_sampler(random.Random(0), process, rate_rps, cv)
        self.rate_rps = rate_rps
        self.num_requests = num_requests
        self.duration_s = duration_s
        self.process = process
        self.cv = cv
        self.prompt = prompt if prompt is not None else LengthDist.lognormal(1000, 1.0, min=1)
        self.output = output if output is not None else LengthDist.lognormal(200, 1.0, min=1)
        self.seed = seed
        self.shared_prefix_tokens = shared_prefix_tokens
        self.prefix_groups = prefix_groups
        self.hash_block_tokens = hash_block_tokens
        self.tenant = tenant
        self.model = model
        self.start_s = start_s
        self.name = name
        self.classes = tuple(classes)

    def arrivals(self) -> Iterator[RequestSpec]:
        specs = self._arrivals()
        return self._with_classes(specs) if self.classes else specs

    def _arrivals(self) -> Iterator[RequestSpec]:
        rng = random.Random(self.seed)
        gap = interarrival_sampler(rng, self.process, self.rate_rps, self.cv)
        draw_prompt = self.prompt.int_sampler(rng)
        draw_output = self.output.int_sampler(rng)
        n_max = self.num_requests
        t_end = None if self.duration_s is None else self.start_s + self.duration_s
        tenant, model, block = self.tenant, self.model, self.hash_block_tokens
        shared = self.shared_prefix_tokens
        spec = RequestSpec
        t = self.start_s
        rid = 0
        if shared == 0:
            while n_max is None or rid < n_max:
                t += gap()
                if t_end is not None and t > t_end:
                    return
                p = draw_prompt()
                o = draw_output()
                o = o if o > 0 else 1
                yield spec(rid, t, p if p > 0 else 1, o, (), block, tenant, model, o)
                rid += 1
            return
        groups = self.prefix_groups
        n_shared = shared // block
        group_hashes = [tuple(range(g * n_shared, (g + 1) * n_shared)) for g in range(groups)]
        next_id = groups * n_shared
        randbelow = rng.randrange
        while n_max is None or rid < n_max:
            t += gap()
            if t_end is not None and t > t_end:
                return
            g = randbelow(groups) if groups > 1 else 0
            p = draw_prompt()
            p = shared + (p if p > 0 else 1)
            o = draw_output()
            o = o if o > 0 else 1
            n_own = p // block - n_shared
            hashes = group_hashes[g] + tuple(range(next_id, next_id + n_own))
            next_id += n_own
            yield spec(rid, t, p, o, hashes, block, tenant, model, o)
            rid += 1

    def _with_classes(self, specs: Iterator[RequestSpec]) -> Iterator[RequestSpec]:
        """Give each request a service class drawn (by weight, own generator) from ``classes``."""
        rng = random.Random(f"tokenplane-classes:{self.seed}")
        classes = self.classes
        weights = [c.weight for c in classes]
        replace = msgspec.structs.replace
        for spec in specs:
            c = rng.choices(classes, weights)[0]
            yield replace(spec, priority=c.priority, latency_budget_s=c.latency_budget_s)

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()
