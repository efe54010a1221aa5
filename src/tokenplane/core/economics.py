"""Cost attribution and task economics: what a request cost, and what a *finished task* cost.

Attribution model (exact by construction, no shared state):

* An instance costs ``price_per_hour`` whether busy or idle. At its measured (or calibrated)
  throughput it processes ``prefill_tokens_per_s`` prompt tokens per second while prefilling and
  emits ``decode_tokens_per_s`` output tokens per second (summed over its running batch) while
  decoding. One second of the instance therefore costs ``price_per_hour / 3600`` and buys that many
  tokens, so

      prefill_cost_per_token = price_per_hour / 3600 / prefill_tokens_per_s
      decode_cost_per_token  = price_per_hour / 3600 / decode_tokens_per_s

  and an attempt costs ``prompt_tokens_computed x prefill_cost_per_token + output_tokens x
  decode_cost_per_token`` (:func:`attempt_cost`). ``prompt_tokens_computed`` is the prompt minus the
  tokens served from the prefix cache: reuse is cheaper, and shows up as such. At the throughput
  the figures were measured at, the attributed costs of all requests sum to the instance's busy
  cost; idle time is attributed to nobody (it shows in fleet cost, not in request cost).
* Where the shell knows an interval's cost and the tokens each in-flight request processed in it
  (the twin knows both per engine step), :func:`split_interval_cost` splits that cost among the
  requests in proportion to tokens: the parts sum exactly to the interval cost.
* A failed attempt still consumed GPU time: it costs what its tokens cost (tokens processed until
  it failed), and that cost is charged to the request and to its workflow. A retried request costs
  the sum of all its attempts. Nothing is written off.

Task economics (:func:`summarize`): the unit of success is the finished task (a workflow; a request
without a workflow is a one-step task). ``cost_per_successful_task`` is the spend on *every settled
task* (succeeded, failed, abandoned; retries and failed attempts included) divided by the number of
tasks that succeeded: the money spent on tasks that failed is the price of the ones that finished.
``success_per_dollar`` is its reciprocal. Tasks still open are reported apart and counted in
neither. Both are ``None`` where undefined (no success, no spend), never ``inf`` or ``nan``.

Everything here is a pure function over plain records; a shell (twin report, gateway ``/metrics``,
the ledger) feeds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Protocol

import msgspec

from tokenplane.core.errors import InvalidCostInput

__all__ = [
    "EconomicsSummary",
    "InvalidCostInput",
    "OutcomeTotals",
    "TaskCost",
    "TaskOutcome",
    "TaskSpend",
    "TokenCosts",
    "add_task",
    "attempt_cost",
    "cost_per_million_tokens",
    "cost_per_successful_task",
    "split_interval_cost",
    "success_per_dollar",
    "summarize",
    "summarize_by",
    "summarize_sums",
    "summarize_totals",
    "token_costs",
]

SECONDS_PER_HOUR = 3600.0


class TaskOutcome(StrEnum):
    """How a task (workflow) ended; ``OPEN`` while it has not."""

    OPEN = "open"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABANDONED = "abandoned"

    @property
    def settled(self) -> bool:
        return self is not TaskOutcome.OPEN


class TokenCosts(msgspec.Struct, frozen=True):
    """Dollars per prompt token computed and per output token emitted on one instance."""

    prefill_usd_per_token: float
    decode_usd_per_token: float


def _check_non_negative(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise InvalidCostInput(f"{name} must be a finite number >= 0, got {value!r}")


def _check_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise InvalidCostInput(f"{name} must be a finite number > 0, got {value!r}")


def token_costs(
    price_per_hour: float, *, prefill_tokens_per_s: float, decode_tokens_per_s: float
) -> TokenCosts:
    """Per-token prices of an instance from its hourly price and its token throughput.

    ``decode_tokens_per_s`` is the instance's aggregate output rate at the batch size it typically
    runs (not one stream's rate): a busier instance makes each token cheaper, which is the point.
    """
    _check_non_negative("price_per_hour", price_per_hour)
    _check_positive("prefill_tokens_per_s", prefill_tokens_per_s)
    _check_positive("decode_tokens_per_s", decode_tokens_per_s)
    per_s = price_per_hour / SECONDS_PER_HOUR
    return TokenCosts(per_s / prefill_tokens_per_s, per_s / decode_tokens_per_s)


def attempt_cost(costs: TokenCosts, *, prompt_tokens_computed: int, output_tokens: int) -> float:
    """Dollars one attempt cost: the prompt tokens it computed and the output tokens it emitted.

    Pass what actually ran: prompt tokens minus prefix-cache hits, output tokens emitted until the
    attempt ended (a failed attempt pays for what it used up to its failure).
    """
    _check_non_negative("prompt_tokens_computed", prompt_tokens_computed)
    _check_non_negative("output_tokens", output_tokens)
    return prompt_tokens_computed * costs.prefill_usd_per_token + output_tokens * costs.decode_usd_per_token


def split_interval_cost(interval_cost_usd: float, tokens_by_request: Mapping[str, int]) -> dict[str, float]:
    """Split one instance's cost over an interval among its in-flight requests, by tokens processed.

    The parts sum to ``interval_cost_usd`` (up to float rounding); a request that processed no token
    gets 0. With no tokens at all the interval was idle and nothing is attributed (empty result).
    """
    _check_non_negative("interval_cost_usd", interval_cost_usd)
    total = 0
    for rid, n in tokens_by_request.items():
        _check_non_negative(f"tokens of {rid}", n)
        total += n
    if total == 0:
        return {}
    return {rid: interval_cost_usd * n / total for rid, n in tokens_by_request.items()}


class TaskCost(msgspec.Struct, frozen=True):
    """One task's spend and outcome, the input of :func:`summarize`.

    ``cost_usd`` includes every attempt of every step (failed ones and retries);
    ``failed_attempt_cost_usd`` is the part of it spent on attempts that failed.
    """

    workflow_id: str
    tenant: str
    outcome: TaskOutcome
    cost_usd: float
    model: str = ""
    attempts: int = 0
    failed_attempts: int = 0
    failed_attempt_cost_usd: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0


class EconomicsSummary(msgspec.Struct, frozen=True):
    """Aggregates over a set of tasks (see the module docstring for the definitions)."""

    tasks_completed: int
    tasks_failed: int
    """Tasks that did not succeed: a step failed terminally, or the task was abandoned."""
    tasks_abandoned: int
    """The abandoned part of ``tasks_failed``."""
    tasks_open: int
    cost_usd: float
    """Spend on settled tasks (open tasks excluded)."""
    cost_open_usd: float
    wasted_cost_usd: float
    """Spend on tasks that did not succeed plus failed attempts within tasks that did."""
    tokens: int
    attempts: int
    failed_attempts: int
    cost_per_successful_task: float | None
    success_per_dollar: float | None
    cost_per_million_tokens: float | None

    @property
    def tasks_settled(self) -> int:
        return self.tasks_completed + self.tasks_failed

    def as_dict(self) -> dict[str, float | int | None]:
        """Flat, JSON-able; the keys the twin's ``report.json`` and ``/metrics`` use."""
        return {f: getattr(self, f) for f in self.__struct_fields__}


def cost_per_successful_task(total_cost_usd: float, succeeded: float) -> float | None:
    """Total spend divided by tasks that succeeded (a count, or a rate with a cost rate); ``None``
    with no success."""
    return total_cost_usd / succeeded if succeeded > 0 else None


def success_per_dollar(succeeded: float, total_cost_usd: float) -> float | None:
    """Tasks that succeeded per dollar spent; ``None`` when nothing was spent."""
    return succeeded / total_cost_usd if total_cost_usd > 0 else None


def cost_per_million_tokens(total_cost_usd: float, tokens: float) -> float | None:
    """Dollars per million tokens (prompt + output); ``None`` with no token."""
    return total_cost_usd / (tokens / 1e6) if tokens > 0 else None


class OutcomeTotals(msgspec.Struct, frozen=True):
    """Sums over the tasks of one outcome: what a SQL ``GROUP BY outcome`` returns."""

    tasks: int = 0
    cost_usd: float = 0.0
    failed_attempt_cost_usd: float = 0.0
    tokens: int = 0
    attempts: int = 0
    failed_attempts: int = 0


def summarize_totals(by_outcome: Mapping[TaskOutcome, OutcomeTotals]) -> EconomicsSummary:
    """Task economics from per-outcome sums (the ledger aggregates in SQL and calls this)."""
    zero = OutcomeTotals()
    ok = by_outcome.get(TaskOutcome.SUCCEEDED, zero)
    failed = by_outcome.get(TaskOutcome.FAILED, zero)
    abandoned = by_outcome.get(TaskOutcome.ABANDONED, zero)
    open_ = by_outcome.get(TaskOutcome.OPEN, zero)
    settled = (ok, failed, abandoned)
    cost = math.fsum(t.cost_usd for t in settled)
    tokens = sum(t.tokens for t in settled)
    return EconomicsSummary(
        tasks_completed=ok.tasks,
        tasks_failed=failed.tasks + abandoned.tasks,
        tasks_abandoned=abandoned.tasks,
        tasks_open=open_.tasks,
        cost_usd=cost,
        cost_open_usd=open_.cost_usd,
        wasted_cost_usd=math.fsum((ok.failed_attempt_cost_usd, failed.cost_usd, abandoned.cost_usd)),
        tokens=tokens,
        attempts=sum(t.attempts for t in settled),
        failed_attempts=sum(t.failed_attempts for t in settled),
        cost_per_successful_task=cost_per_successful_task(cost, ok.tasks),
        success_per_dollar=success_per_dollar(ok.tasks, cost),
        cost_per_million_tokens=cost_per_million_tokens(cost, tokens),
    )


class TaskSpend(Protocol):
    """What :func:`add_task` reads: a :class:`TaskCost`, or a ledger's workflow summary."""

    @property
    def cost_usd(self) -> float: ...
    @property
    def failed_attempt_cost_usd(self) -> float: ...
    @property
    def tokens_in(self) -> int: ...
    @property
    def tokens_out(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def failed_attempts(self) -> int: ...


def add_task(sums: list[float], t: TaskSpend, sign: int = 1) -> None:
    """Add (``sign`` 1) or take back (-1) one task in an outcome's running sums, laid out as
    :class:`OutcomeTotals` (tasks, cost, failed-attempt cost, tokens, attempts, failed attempts)."""
    sums[0] += sign
    sums[1] += sign * t.cost_usd
    sums[2] += sign * t.failed_attempt_cost_usd
    sums[3] += sign * (t.tokens_in + t.tokens_out)
    sums[4] += sign * t.attempts
    sums[5] += sign * t.failed_attempts


def summarize_sums(by_outcome: Mapping[TaskOutcome, Sequence[float]]) -> EconomicsSummary:
    """:func:`summarize_totals` from running sums kept by :func:`add_task`."""
    return summarize_totals(
        {
            o: OutcomeTotals(int(a[0]), float(a[1]), float(a[2]), int(a[3]), int(a[4]), int(a[5]))
            for o, a in by_outcome.items()
        }
    )


def summarize(tasks: Iterable[TaskCost]) -> EconomicsSummary:
    """Task economics over ``tasks`` (any order, any mix of outcomes)."""
    acc: dict[TaskOutcome, list[float]] = {o: [0.0] * 6 for o in TaskOutcome}
    for t in tasks:
        add_task(acc[TaskOutcome(t.outcome)], t)
    return summarize_sums(acc)


def summarize_by(tasks: Iterable[TaskCost], key: Callable[[TaskCost], str]) -> dict[str, EconomicsSummary]:
    """:func:`summarize` per group, e.g. ``key=lambda t: t.tenant`` or ``lambda t: t.model``."""
    groups: dict[str, list[TaskCost]] = {}
    for t in tasks:
        groups.setdefault(key(t), []).append(t)
    return {k: summarize(v) for k, v in sorted(groups.items())}
