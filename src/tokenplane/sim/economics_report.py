"""Task economics of one twin run: what each request, workflow and task cost, and which finished.

Attribution (exact by construction). An instance costs ``price_per_hour x alive_s`` (what the fleet
is billed, the report's ``gpu_cost_usd``). That cost is split among the attempts the instance ran in
proportion to their *step-model cost*: ``prefill tokens computed x prefill $/token + output tokens x
decode $/token`` (:func:`tokenplane.core.economics.token_costs` from the instance's price and its
step-time model: prefill throughput at a full chunk, decode throughput at a batch of
:data:`DECODE_BATCH` sequences of :data:`DECODE_CONTEXT` tokens). Prompt tokens served from the
prefix cache are not computed, so reuse makes a request cheaper. Every attempt pays for what it
computed: attempts that timed out, were cancelled, were lost with their instance or finished after
their client left (zombies). Idle time is spread over the work the instance did, so the attributed
costs sum to the fleet's GPU cost (an instance that served nothing stays ``unattributed_cost_usd``);
``idle_cost_usd`` says how much of the total was idle time. Preempted-and-recomputed prefill is not
counted as extra tokens (a first-order simplification; its time still lands in the instance's bill).

Tasks. A request with a workflow belongs to the task ``workflow_id``; one without is a one-step task.
A task *failed* when any of its requests ended without success (shed, expired, timed out, lost ...);
it was *abandoned mid-way* when it failed after at least one of its requests had succeeded (the spend
of its earlier steps is lost too). It *succeeded* when every request ended ok and its last step
(``step == total_steps``) was among them. Anything else (a request still in flight at the end of the
run, the next step not issued yet) is *open* and counts in neither the numerator nor the denominator.
``cost_per_successful_task_usd`` = spend on settled tasks / tasks succeeded, and ``wasted_cost_usd``
= spend on tasks that failed plus failed attempts within tasks that succeeded
(:func:`tokenplane.core.economics.summarize`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenplane.core.economics import (
    EconomicsSummary,
    TaskOutcome,
    TokenCosts,
    summarize_sums,
    token_costs,
)
from tokenplane.core.views import WorkflowContext
from tokenplane.sim.perf_model import StepTimeModel
from tokenplane.sim.records import InstanceRecord, RequestRecord

__all__ = ["DECODE_BATCH", "DECODE_CONTEXT", "UsageRow", "build_economics", "engine_token_costs"]

DECODE_BATCH = 64
DECODE_CONTEXT = 2048

UsageRow = tuple[int, str, int, int, bool]
"""(request_id, instance_id, prefill tokens computed, output tokens, whether it delivered the result)."""


def engine_token_costs(
    steps: StepTimeModel, price_per_hour: float, *, max_num_batched_tokens: int, max_num_seqs: int
) -> TokenCosts:
    """Per-token prices of one instance from its step-time model (see the module docstring)."""
    chunk = max(1, max_num_batched_tokens)
    prefill_s = steps.step_time(chunk, 0, chunk * (chunk + 1) // 2)
    batch = max(1, min(max_num_seqs, DECODE_BATCH))
    decode_s = steps.step_time(batch, batch * DECODE_CONTEXT, 0)
    return token_costs(
        price_per_hour, prefill_tokens_per_s=chunk / prefill_s, decode_tokens_per_s=batch / decode_s
    )


def usage_from_records(records: Sequence[RequestRecord]) -> list[UsageRow]:
    """One attempt per record (the plain fleet): what each completed request computed."""
    return [
        (r.request_id, r.instance_id, r.prompt_tokens - r.prefix_hit_tokens, r.output_tokens, True)
        for r in records
        if r.ok and r.instance_id is not None
    ]


def _round(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def build_economics(
    records: Sequence[RequestRecord],
    instances: Sequence[InstanceRecord],
    *,
    prices: Mapping[str, TokenCosts],
    workflows: Mapping[int, WorkflowContext],
    usage: Sequence[UsageRow] | None = None,
) -> dict[str, Any]:
    """The run's economics keys (flat, JSON-able) plus ``economics``: breakdowns and attribution."""
    bill = {i.instance_id: i.alive_s / 3600.0 * i.price_per_hour for i in instances}
    idle = math.fsum(max(0.0, i.alive_s - i.busy_s) / 3600.0 * i.price_per_hour for i in instances)
    model_of = {i.instance_id: i.model for i in instances}
    unit = {
        iid: (c.prefill_usd_per_token, c.decode_usd_per_token) for iid, c in prices.items() if iid in bill
    }
    # -- attribute each instance's bill to its attempts (weights first, then scale per instance) ----
    per_instance: dict[str, float] = dict.fromkeys(bill, 0.0)
    per_request: dict[int, list[float]] = {}  # [cost, failed-attempt cost, attempts, failed attempts]
    if usage is None:  # one attempt per record
        for r in records:
            iid = r.instance_id
            if r.ok and iid is not None:
                pu = unit.get(iid)
                if pu is not None:
                    w = (r.prompt_tokens - r.prefix_hit_tokens) * pu[0] + r.output_tokens * pu[1]
                    per_instance[iid] += w
                    per_request[r.request_id] = [w, 0.0, 1.0, 0.0, iid]  # type: ignore[list-item]
        scale = {iid: (bill[iid] / w if w > 0 else 0.0) for iid, w in per_instance.items()}
        for acc in per_request.values():
            acc[0] *= scale[acc.pop()]  # type: ignore[index]
    else:
        weights: list[float] = []
        for _, iid, pre, out, _ in usage:
            pu = unit.get(iid)
            w = 0.0 if pu is None else pre * pu[0] + out * pu[1]
            weights.append(w)
            if pu is not None:
                per_instance[iid] += w
        scale = {iid: (bill[iid] / w if w > 0 else 0.0) for iid, w in per_instance.items()}
        for (rid, iid, _, _, delivered), w in zip(usage, weights, strict=True):
            cost = w * scale.get(iid, 0.0)
            row = per_request.get(rid)
            if row is None:
                row = per_request[rid] = [0.0, 0.0, 0.0, 0.0]
            acc = row
            acc[0] += cost
            acc[2] += 1
            if not delivered:
                acc[1] += cost
                acc[3] += 1
    attributed = math.fsum(a[0] for a in per_request.values())
    # -- tasks: sums per (tenant, model, outcome) -------------------------------------------------------
    sums: dict[tuple[str, str, TaskOutcome], list[float]] = {}
    failed_at: dict[str, int] = {}

    def add(
        key: tuple[str, str, TaskOutcome], cost: float, fcost: float, tokens: int, att: float, fatt: float
    ) -> None:
        a = sums.get(key)
        if a is None:
            a = sums[key] = [0.0] * 6
        a[0] += 1
        a[1] += cost
        a[2] += fcost
        a[3] += tokens
        a[4] += att
        a[5] += fatt

    none: list[float] = [0.0, 0.0, 0.0, 0.0]
    tasks: dict[str, dict[str, Any]] = {}
    for r in records:
        wf = workflows.get(r.request_id)
        acc = per_request.get(r.request_id, none)
        iid = r.instance_id
        if wf is None:  # a one-step task
            if r.ok:
                outcome = TaskOutcome.SUCCEEDED
            elif r.reason:
                outcome = TaskOutcome.FAILED
                failed_at["1"] = failed_at.get("1", 0) + 1
            else:
                outcome = TaskOutcome.OPEN
            tokens = r.prompt_tokens + r.output_tokens if r.ok else 0
            model = model_of.get(iid, "") if iid is not None else ""
            add((r.tenant, model, outcome), acc[0], acc[1], tokens, acc[2], acc[3])
            continue
        t = tasks.get(wf.workflow_id)
        if t is None:
            t = tasks[wf.workflow_id] = {
                "tenant": r.tenant,
                "model": "",
                "failed": False,
                "open": False,
                "ok_steps": 0,
                "last_done": False,
                "fail_step": 0,
                "sums": [0.0, 0.0, 0, 0.0, 0.0],
            }
        if iid is not None and not t["model"]:
            t["model"] = model_of.get(iid, "")
        ts = t["sums"]
        ts[0] += acc[0]
        ts[1] += acc[1]
        ts[3] += acc[2]
        ts[4] += acc[3]
        if r.ok:
            t["ok_steps"] += 1
            ts[2] += r.prompt_tokens + r.output_tokens
            if wf.total_steps is None or wf.step >= wf.total_steps:
                t["last_done"] = True
        elif r.reason:
            if not t["failed"]:
                t["fail_step"] = wf.step
            t["failed"] = True
        else:
            t["open"] = True  # still in flight when the run ended
    for t in tasks.values():
        if t["failed"]:
            outcome = TaskOutcome.ABANDONED if t["ok_steps"] > 0 else TaskOutcome.FAILED
            step = str(t["fail_step"])
            failed_at[step] = failed_at.get(step, 0) + 1
        elif t["open"] or not t["last_done"]:
            outcome = TaskOutcome.OPEN
        else:
            outcome = TaskOutcome.SUCCEEDED
        ts = t["sums"]
        add((t["tenant"], t["model"], outcome), ts[0], ts[1], int(ts[2]), ts[3], ts[4])

    def summary_of(keep: Callable[[tuple[str, str, TaskOutcome]], bool]) -> EconomicsSummary:
        by: dict[TaskOutcome, list[float]] = {}
        for key, a in sums.items():
            if keep(key):
                b = by.setdefault(key[2], [0.0] * 6)
                for i in range(6):
                    b[i] += a[i]
        return summarize_sums(by)

    summary = summary_of(lambda k: True)
    gpu_cost = math.fsum(bill.values())
    detail: dict[str, Any] = {
        "attribution": "instance bill (price x alive time) split by step-model token cost",
        "gpu_cost_usd": gpu_cost,
        "attributed_cost_usd": attributed,
        "unattributed_cost_usd": gpu_cost - attributed,
        "idle_cost_usd": idle,
        "failed_attempt_cost_usd": math.fsum(a[1] for a in per_request.values()),
        "tasks_failed_at_step": dict(sorted(failed_at.items(), key=lambda kv: int(kv[0]))),
        "summary": summary.as_dict(),
    }
    tenants = sorted({k[0] for k in sums})
    models = sorted({k[1] for k in sums if k[1]})
    if len(tenants) > 1:
        detail["by_tenant"] = {x: summary_of(lambda k, x=x: k[0] == x).as_dict() for x in tenants}  # type: ignore[misc]
    if len(models) > 1:
        detail["by_model"] = {x: summary_of(lambda k, x=x: k[1] == x).as_dict() for x in models}  # type: ignore[misc]
    cpst = summary.cost_per_successful_task
    return {
        "tasks_completed": summary.tasks_completed,
        "tasks_failed": summary.tasks_failed,
        "tasks_abandoned_midway": summary.tasks_abandoned,
        "tasks_open": summary.tasks_open,
        "task_cost_usd": _round(summary.cost_usd),
        "cost_per_successful_task_usd": cpst,
        "cost_per_successful_task": cpst,
        "success_per_dollar": summary.success_per_dollar,
        "wasted_cost_usd": summary.wasted_cost_usd,
        "economics": detail,
    }
