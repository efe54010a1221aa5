"""Capacity planning for agentic demand: the cheapest fleet that meets the SLOs (``tokenplane plan``).

Demand is users x calls per user x tokens per call (the talk's two multiplying factors):

    request rate           = users x calls_per_user_per_hour / 3600            [calls/s]
    required token rate    = request rate x (mean prompt + mean output tokens)  [tokens/s]
    task rate              = request rate / steps_per_task                      [tasks/s]

e.g. 1,000 users x 12 calls/h x (1,500 + 300) tokens = 3.33 calls/s = 6,000 tokens/s.

Search, per GPU type of the catalogue (each a few dozen small twin runs, well under a second each):

1. **Per-instance capacity**: the highest Poisson rate of this workload that one instance serves
   with every request completed and at least ``slo.attainment`` of them within the TTFT and TBT
   SLOs. Found by doubling from a small rate until a run fails, then bisecting
   (``search.bisect_steps`` times). Each probe runs ``max(probe_duration_s, min_probe_requests /
   rate)`` virtual seconds.
2. **Closed-form fleet size**: ``ceil(request rate / per-instance capacity)``.
3. **Verification with the twin**: the whole demand on fleets from two below to
   ``search.max_extra_instances`` above that size (a fleet multiplexes better than one instance, so
   fewer may do; routing imbalance may need more). The smallest fleet meeting the SLOs is this GPU
   type's answer; the cheapest answer per hour over all GPU types wins (ties: more headroom).

Outputs: GPU type, count, cost per hour, headroom (how much more demand the chosen fleet still
serves within the SLOs, bisected with the twin up to 4x the demand: 0.25 = 25 % more), cost per
successful task, and ``plan.png``, cost per hour against fleet size for every GPU
type (filled markers meet the SLOs). A task succeeds when all of its steps meet the SLO; with the
twin's per-request attainment ``p`` the task success rate is estimated as ``p ** steps_per_task``
(steps taken as independent), and cost per successful task = cost per hour / (tasks per hour x
task success rate).

Limits (conservative on purpose): calls are independent Poisson arrivals without shared prefixes,
so prefix-cache reuse between the steps of a task, which lowers prefill work, is not credited; the
engine is the twin's calibrated vLLM model, not a measurement of your deployment.

The package holds the demand and its settings (:mod:`.spec`, what ``plan SPEC.yaml`` reads), the
search with the twin (:mod:`.search`, :func:`plan`) and what it found (:mod:`.result`: the JSON
document, the summary line, the plot).
"""

from __future__ import annotations

from tokenplane.planning.result import FleetPoint, GpuPlan, PlanResult
from tokenplane.planning.search import plan
from tokenplane.planning.spec import (
    GpuOption,
    PlanError,
    PlanSlo,
    PlanSpec,
    SearchSettings,
    load_plan_spec,
    parse_plan_spec,
    required_token_throughput,
)

__all__ = [
    "FleetPoint",
    "GpuOption",
    "GpuPlan",
    "PlanError",
    "PlanResult",
    "PlanSlo",
    "PlanSpec",
    "SearchSettings",
    "load_plan_spec",
    "parse_plan_spec",
    "plan",
    "required_token_throughput",
]
