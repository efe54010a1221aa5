"""Workflow value: what is at stake when one step of a multi-step task is served, shed or retried.

Request R is at step k of n; steps 1..k-1 already cost S = ``workflow.sunk_cost_usd``. If R fails and
that ends the workflow, the task is lost, and S with it. A scheduler that sees only R's own demand
cannot weigh that; this module puts a number on it. There is no rule that later steps always win:
every decision is an expected-value comparison, and a late step of a task that is unlikely to finish
(or past its deadline) can rank below new work.

Model (all in USD; ``p`` = ``p_step_success``, the chance that one served step succeeds)::

    c      = this step's cost       = (prompt + max_output tokens) × usd_per_million_tokens / 1e6
    c_next = a later step's cost    = S / (k − 1) when the workflow has spent, else c
    r      = steps after this one   = n − k   (unknown n: ``unknown_remaining_steps``)
    C      = cost to finish         = c + r × c_next
    V      = value of the task      = value_multiple × (S + C)
    P      = P(finish | served)     = p^(r + 1), 0 once the workflow's deadline has passed
    stake  = P × V − C

``V`` treats what a task will have cost as a revealed lower bound on what it is worth to its owner
(``value_multiple`` > 1: nobody runs a task worth less than it costs). S is not recovered by serving
R; it is evidence of the value that failing R would destroy. Shedding or failing a step is assumed
to end its workflow (P(finish | shed) = 0), as in the talk's example.

Decisions:

* **Shedding** (:meth:`WorkflowValueModel.compare_for_shedding`): shedding frees capacity, so the
  first victim is the one that loses the least value per unit of capacity freed, ``stake / c``
  (the density rule of a fractional knapsack). With the defaults a new single request scores
  ``value_multiple × p − 1`` ≈ 0.9, the fifth step of a five-step task that spent 4c about 8.5, a new
  five-step task about 2.7, and step 2 of a forty-step task with ``p`` = 0.95 below zero (it is
  unlikely to finish and costly to carry): new cheap work goes before the fifth step of an
  expensive task, and a long shot goes before both.
* **Retry** (:meth:`WorkflowValueModel.retry_worth`): a step failed and, without a retry, its workflow
  ends. A retry costing ``a`` that succeeds with ``q`` is worth it when
  ``q × (p^r × V − r × c_next) > a``: the value it saves, net of the steps still to pay for, beats
  what it costs. The retry budget still bounds how many retries happen; this says which deserve one.

Params (defaults as named constants): ``p_step_success`` 0.95, ``value_multiple`` 2.0,
``usd_per_million_tokens`` 0.2, ``unknown_remaining_steps`` 0.

Cost: O(1) arithmetic per call. How it fails: V is a proxy (a tenant's real task value is unknown;
give ``value_multiple`` per tenant if it matters), ``p`` is one number for every step and instance,
and the cost of later steps is the mean of the earlier ones, which under-counts tasks whose context
grows step by step. The shells should fill ``sunk_cost_usd`` from the ledger; without it every step
looks like the first and the model reduces to a request-level one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from tokenplane.core.params import ParamReader
from tokenplane.core.views import RequestInfo

DEFAULT_P_STEP_SUCCESS = 0.95
DEFAULT_VALUE_MULTIPLE = 2.0
DEFAULT_USD_PER_MILLION_TOKENS = 0.2
DEFAULT_UNKNOWN_REMAINING_STEPS = 0


class Stake(msgspec.Struct, frozen=True):
    """The parts of one request's expected-value assessment (for decisions' reasons and logs)."""

    step_cost_usd: float
    next_step_cost_usd: float
    steps_after: int
    cost_to_finish_usd: float
    task_value_usd: float
    p_finish: float
    stake_usd: float
    density: float
    """``stake_usd / step_cost_usd``: what shedding the step loses per unit of capacity it frees
    (computed in units of the step's cost, so equal shapes of work compare exactly equal)."""


MAX_SUNK_COST_USD = 1e12
"""Reported sunk costs are clamped here, so a corrupt report cannot turn the arithmetic into inf/NaN."""


def _sunk(x: float) -> float:
    if math.isnan(x) or x <= 0:
        return 0.0
    return min(x, MAX_SUNK_COST_USD)


class WorkflowValueModel:
    """Expected-value model of a request's workflow (see the module docstring)."""

    def __init__(
        self,
        *,
        p_step_success: float = DEFAULT_P_STEP_SUCCESS,
        value_multiple: float = DEFAULT_VALUE_MULTIPLE,
        usd_per_million_tokens: float = DEFAULT_USD_PER_MILLION_TOKENS,
        unknown_remaining_steps: int = DEFAULT_UNKNOWN_REMAINING_STEPS,
    ) -> None:
        if not 0.0 < p_step_success <= 1.0:
            raise ValueError(f"p_step_success must be in (0, 1], got {p_step_success}")
        if not (value_multiple > 0 and math.isfinite(value_multiple)):
            raise ValueError(f"value_multiple must be > 0, got {value_multiple}")
        if not (usd_per_million_tokens > 0 and math.isfinite(usd_per_million_tokens)):
            raise ValueError(f"usd_per_million_tokens must be > 0, got {usd_per_million_tokens}")
        if unknown_remaining_steps < 0:
            raise ValueError(f"unknown_remaining_steps must be >= 0, got {unknown_remaining_steps}")
        self.p_step_success = p_step_success
        self.value_multiple = value_multiple
        self.usd_per_million_tokens = usd_per_million_tokens
        self.unknown_remaining_steps = unknown_remaining_steps

    @classmethod
    def from_params(cls, params: Mapping[str, Any], owner: str = "workflow value") -> WorkflowValueModel:
        reader = ParamReader(
            owner,
            params,
            ("p_step_success", "value_multiple", "usd_per_million_tokens", "unknown_remaining_steps"),
        )
        return cls(
            p_step_success=reader.float_(
                "p_step_success", DEFAULT_P_STEP_SUCCESS, min_value=0.0, exclusive_min=True, max_value=1.0
            ),
            value_multiple=reader.float_(
                "value_multiple", DEFAULT_VALUE_MULTIPLE, min_value=0.0, exclusive_min=True
            ),
            usd_per_million_tokens=reader.float_(
                "usd_per_million_tokens", DEFAULT_USD_PER_MILLION_TOKENS, min_value=0.0, exclusive_min=True
            ),
            unknown_remaining_steps=reader.int_(
                "unknown_remaining_steps", DEFAULT_UNKNOWN_REMAINING_STEPS, min_value=0
            ),
        )

    # -- the assessment --------------------------------------------------------------------------

    def assess(self, request: RequestInfo, *, now: float | None = None) -> Stake:
        """Every term of the model for one request; ``now`` enables the deadline check."""
        tokens = max(1, max(0, request.prompt_tokens) + max(0, request.max_output_tokens))
        step_cost = tokens * self.usd_per_million_tokens / 1e6
        wf = request.workflow
        sunk, next_cost, after, expired = 0.0, step_cost, 0, False
        if wf is not None:
            step = max(1, wf.step)
            sunk = _sunk(wf.sunk_cost_usd)
            if step > 1 and sunk > 0:
                next_cost = sunk / (step - 1)
            if wf.total_steps is not None:
                after = max(0, wf.total_steps - step)
            else:
                after = self.unknown_remaining_steps
            deadline = wf.deadline_s
            expired = now is not None and deadline is not None and deadline <= now
        p_finish = 0.0 if expired else self.p_step_success ** (after + 1)
        # In units of this step's cost first: the density of a single request does not depend on
        # its size, and sizes do not leak rounding noise into comparisons.
        to_finish_units = 1.0 + after * (next_cost / step_cost)
        density = p_finish * self.value_multiple * (sunk / step_cost + to_finish_units) - to_finish_units
        to_finish = step_cost + after * next_cost
        value = self.value_multiple * (sunk + to_finish)
        return Stake(
            step_cost_usd=step_cost,
            next_step_cost_usd=next_cost,
            steps_after=after,
            cost_to_finish_usd=to_finish,
            task_value_usd=value,
            p_finish=p_finish,
            stake_usd=p_finish * value - to_finish,
            density=density,
        )

    def stake(self, request: RequestInfo, *, now: float | None = None) -> float:
        """Expected value of serving the request (USD): ``P(finish | served) × V − cost to finish``."""
        return self.assess(request, now=now).stake_usd

    # -- decisions -------------------------------------------------------------------------------

    def compare_for_shedding(self, a: RequestInfo, b: RequestInfo, *, now: float | None = None) -> int:
        """-1 when ``a`` should be shed before ``b``, 1 for the reverse, 0 when they tie.

        A comparator: ``sorted(requests, key=functools.cmp_to_key(model.compare_for_shedding))``
        lists victims first. Ranks by :attr:`Stake.density` (value lost per dollar of capacity freed).
        """
        da = self.assess(a, now=now).density
        db = self.assess(b, now=now).density
        return -1 if da < db else (1 if da > db else 0)

    def retry_worth(
        self,
        request: RequestInfo,
        attempt_cost_usd: float,
        p_success: float,
        *,
        now: float | None = None,
    ) -> bool:
        """Whether one more attempt at a failed step pays for itself, given that without it the
        workflow ends: ``p_success × (p^r × V − r × c_next) > attempt_cost_usd``."""
        if not 0.0 <= p_success <= 1.0:
            raise ValueError(f"p_success must be in [0, 1], got {p_success}")
        if not (attempt_cost_usd >= 0 and math.isfinite(attempt_cost_usd)):
            raise ValueError(f"attempt_cost_usd must be a finite number >= 0, got {attempt_cost_usd}")
        s = self.assess(request, now=now)
        if s.p_finish == 0.0:
            return False  # past its deadline: nothing left to save
        rest = self.p_step_success**s.steps_after * s.task_value_usd - s.steps_after * s.next_step_cost_usd
        return p_success * rest > attempt_cost_usd


DEFAULT_MODEL = WorkflowValueModel()


def stake(
    request: RequestInfo, *, now: float | None = None, model: WorkflowValueModel = DEFAULT_MODEL
) -> float:
    """:meth:`WorkflowValueModel.stake` with the default (or a given) model."""
    return model.stake(request, now=now)


def compare_for_shedding(
    a: RequestInfo, b: RequestInfo, *, now: float | None = None, model: WorkflowValueModel = DEFAULT_MODEL
) -> int:
    """:meth:`WorkflowValueModel.compare_for_shedding` with the default (or a given) model."""
    return model.compare_for_shedding(a, b, now=now)


def retry_worth(
    request: RequestInfo,
    attempt_cost_usd: float,
    p_success: float,
    *,
    now: float | None = None,
    model: WorkflowValueModel = DEFAULT_MODEL,
) -> bool:
    """:meth:`WorkflowValueModel.retry_worth` with the default (or a given) model."""
    return model.retry_worth(request, attempt_cost_usd, p_success, now=now)
