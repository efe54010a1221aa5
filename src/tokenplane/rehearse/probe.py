"""The calibration probe of a rehearsal: the request path's fixed cost, measured on the idle stack.

Before the workload (:func:`tokenplane.rehearse.live.drive_live`), :func:`probe_path` sends a few
requests shaped like the workload's first ones (unique prompts, two output tokens), one at a time
through the same client code; for each, the client's time to the first chunk less the emulator's own
TTFT (its ``vllm:time_to_first_token_seconds`` before and after). The median is the figure the twin
runs with (``request_path.first_chunk_s``); nothing of the workload run sets it. The probe's
requests are left out of the routing reasons and per-hop means reported.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenplane.rehearse.errors import RehearsalError
from tokenplane.rehearse.fleet import histogram_totals
from tokenplane.rehearse.prompts import prompt_text
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.scenario import RunSettings
from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.factory import build_workload
from tokenplane.sim.workloads.traces import traces_dir

if TYPE_CHECKING:  # a type only: the driver's module imports this one (its results carry a probe's)
    from tokenplane.rehearse.driver import Driver


#: Probe requests: a multiple of the fleet size at least this (a round-robin router then starts the
#: workload where it would have without the probe), after one warm-up request per instance (not
#: counted: it opens the client's and the gateway's connections, which the workload's requests find
#: open).
PROBE_REQUESTS = 16
PROBE_OUTPUT_TOKENS = 2
#: Probe request ids: above any workload's, so their prompts share no tokens with the workload's.
PROBE_ID_BASE = 1 << 40
#: The TTFT histograms the probe reads (the live run too, less what the probe left in them).
INSTANCE_TTFT = "vllm:time_to_first_token_seconds"
GATEWAY_TTFT = "tokenplane_ttft_seconds"


@dataclass
class PathProbe:
    """The calibration probe's per-request times to the first chunk, seen at three places."""

    client_ttft_s: list[float] = field(default_factory=list)
    gateway_ttft_s: list[float] = field(default_factory=list)
    instance_ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)

    @property
    def first_chunk_s(self) -> float:
        """The request path's fixed cost: median of (client TTFT - instance TTFT), never negative."""
        pairs = zip(self.client_ttft_s, self.instance_ttft_s, strict=True)
        return max(0.0, statistics.median(c - i for c, i in pairs))

    def summary(self) -> dict[str, Any]:
        med = statistics.median
        c, g, i = self.client_ttft_s, self.gateway_ttft_s, self.instance_ttft_s
        return {
            "requests": len(c),
            "prompt_tokens_median": statistics.median(self.prompt_tokens),
            "first_chunk_s": self.first_chunk_s,
            "client_ttft_median_s": med(c),
            "gateway_ttft_median_s": med(g),
            "instance_ttft_median_s": med(i),
            # the path in two parts: gateway <-> instance, and client + HTTP <-> gateway
            "gateway_hop_s": med([a - b for a, b in zip(g, i, strict=True)]),
            "client_hop_s": med([a - b for a, b in zip(c, g, strict=True)]),
            # the spread of the figure (quartiles of client - instance): a loaded machine widens it
            "first_chunk_quartiles_s": statistics.quantiles([a - b for a, b in zip(c, i, strict=True)], n=4),
        }


async def probe_path(driver: Driver, prompt_tokens: list[int]) -> PathProbe:
    """Send one request per entry of ``prompt_tokens``, one at a time on the idle stack, through
    the driver's own client code; time each one's first chunk at the client, the gateway and the
    instance (the histograms' sums just before and after each request)."""
    session, stack = driver.session, driver.stack
    urls, gateway = [em.url for em in stack.emulators], [stack.gateway]
    out = PathProbe()
    for k, tokens in enumerate(prompt_tokens[: len(stack.emulators)]):  # warm-up, not counted
        spec = RequestSpec(PROBE_ID_BASE - 1 - k, 0.0, tokens, PROBE_OUTPUT_TOKENS, (), 16, tenant="probe")
        rec = RequestRecord(spec.request_id, spec.tenant, driver.now(), tokens, PROBE_OUTPUT_TOKENS)
        await driver.attempt(spec, rec, prompt_text(spec))
    for k, tokens in enumerate(prompt_tokens):
        spec = RequestSpec(PROBE_ID_BASE + k, 0.0, tokens, PROBE_OUTPUT_TOKENS, (), 16, tenant="probe")
        prompt = prompt_text(spec)
        inst0, _ = await histogram_totals(session, urls, INSTANCE_TTFT)
        gw0, _ = await histogram_totals(session, gateway, GATEWAY_TTFT)
        rec = RequestRecord(spec.request_id, spec.tenant, driver.now(), tokens, PROBE_OUTPUT_TOKENS)
        reason = await driver.attempt(spec, rec, prompt)
        if reason or rec.first_token_s is None:
            raise RehearsalError(f"the calibration probe's request {k} failed ({reason or 'no token'})")
        inst1, _ = await histogram_totals(session, urls, INSTANCE_TTFT)
        gw1, _ = await histogram_totals(session, gateway, GATEWAY_TTFT)
        out.client_ttft_s.append(rec.first_token_s - rec.arrival_s)
        out.gateway_ttft_s.append(gw1 - gw0)
        out.instance_ttft_s.append(inst1 - inst0)
        out.prompt_tokens.append(tokens)
        await asyncio.sleep(0.02)  # let the instance go idle again
    return out


def probe_prompt_sizes(run: RunSettings, traces: str | Path | None) -> list[int]:
    """Prompt sizes for the probe: those of the workload's first requests (its shape, not its
    measured outcome), :data:`PROBE_REQUESTS` rounded up to a multiple of the fleet size."""
    n = -(-PROBE_REQUESTS // run.fleet.instances) * run.fleet.instances
    fresh = build_workload(run.workload, traces=traces_dir(traces), seed=run.seed)
    sizes = [spec.prompt_tokens for spec in itertools.islice(fresh.arrivals(), n)]
    return [max(16, sizes[k % len(sizes)]) for k in range(n)] if sizes else [512] * n
