"""Load shedding on queue depth, queue wait and predicted TTFT, lowest priority first.

Algorithm. :class:`LoadShedder.decide` takes a request's priority class and deadline and a
:class:`LoadSignal` for its pool (gateway queue depth, the oldest queued request's wait, the predicted
TTFT of a request joining now) and answers KEEP or SHED with the first reason that applies:

1. ``DEADLINE_PASSED``: ``now >= deadline``;
2. ``QUEUE_DEPTH``: ``queue_depth >= thresholds[class].max_queue_depth``;
3. ``QUEUE_WAIT``: ``oldest_wait_s >= thresholds[class].max_queue_wait_s``;
4. ``TTFT_OVER_BUDGET``: ``now + predicted_ttft_s > deadline``: the work would be spent on a request
   that misses its deadline anyway;
5. otherwise ``KEEP`` (``UNDER_LIMITS``).

Thresholds are per class and must not decrease from batch to standard to interactive (checked at
construction), so for any one signal and deadline, if interactive is shed, batch is shed too: batch
sheds first, interactive last. ``math.inf`` means "never on this signal". Load is measured as queued
work, not utilisation: a GPU at 100 % with an empty queue is fine, one at 60 % with a deep queue is not.

TTFT model (:class:`TtftPredictor`). An instance serves its waiting requests roughly one prefill after
another, so a request joining it waits for them, then runs its own prefill::

    ttft(instance) = (waiting + queue_depth / n_usable) × mean_prefill_s
                     + prompt_tokens / prefill_tokens_per_s

``waiting`` is the instance's reported queue, ``queue_depth / n_usable`` the gateway queue spread over
the usable instances. The pool's prediction is the minimum over usable (ready and healthy) instances
(the router picks a good one); ``inf`` with none. ``mean_prefill_s`` is an EWMA (``alpha``) of
observed ``ttft / (waiting_ahead + 1)``, fed through :meth:`TtftPredictor.observe`.

Params (:meth:`LoadShedder.from_params`)::

    thresholds:
      batch:       {max_queue_depth: 64,   max_queue_wait_s: 5}
      standard:    {max_queue_depth: 256,  max_queue_wait_s: 15}
      interactive: {max_queue_depth: 1024, max_queue_wait_s: 30}

Cost: O(1) per decision; the predictor is O(instances). Failure modes: the model ignores batching
(prefills of several requests overlap, so it overestimates under light load and sheds a little early
for tight budgets) and chunked prefill interleaving with decode (it underestimates on instances busy
decoding long outputs); reported ``waiting`` lags by one scrape. It is a guard against hopeless work,
not a latency forecast.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

import msgspec

from tokenplane.core.admission import PriorityClass
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.views import InstanceView

DEFAULT_MEAN_PREFILL_S = 0.2
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
DEFAULT_EWMA_ALPHA = 0.1


class ShedAction(StrEnum):
    KEEP = "keep"
    SHED = "shed"


class ShedReason(StrEnum):
    UNDER_LIMITS = "under_limits"
    DEADLINE_PASSED = "deadline_passed"
    QUEUE_DEPTH = "queue_depth"
    QUEUE_WAIT = "queue_wait"
    TTFT_OVER_BUDGET = "ttft_over_budget"


class LoadSignal(msgspec.Struct, frozen=True):
    queue_depth: int = 0
    oldest_wait_s: float = 0.0
    predicted_ttft_s: float = 0.0


class ShedThresholds(msgspec.Struct, frozen=True):
    max_queue_depth: float = math.inf
    max_queue_wait_s: float = math.inf


class ShedDecision(msgspec.Struct, frozen=True):
    action: ShedAction
    reason: ShedReason
    priority: PriorityClass

    @property
    def shed(self) -> bool:
        return self.action is ShedAction.SHED


DEFAULT_THRESHOLDS: Mapping[PriorityClass, ShedThresholds] = {
    PriorityClass.BATCH: ShedThresholds(64, 5.0),
    PriorityClass.STANDARD: ShedThresholds(256, 15.0),
    PriorityClass.INTERACTIVE: ShedThresholds(1024, 30.0),
}


class LoadShedder:
    def __init__(self, thresholds: Mapping[PriorityClass, ShedThresholds] | None = None) -> None:
        merged = dict(DEFAULT_THRESHOLDS)
        merged.update(thresholds or {})
        ordered = [merged[c] for c in sorted(PriorityClass)]
        for t in ordered:
            if not (t.max_queue_depth >= 0 and t.max_queue_wait_s >= 0):
                raise InvalidPolicyConfig(f"shedder: thresholds must be >= 0, got {t}")
        for low, high in itertools.pairwise(ordered):
            if high.max_queue_depth < low.max_queue_depth or high.max_queue_wait_s < low.max_queue_wait_s:
                raise InvalidPolicyConfig(
                    "shedder: thresholds must not decrease from batch to standard to interactive "
                    f"(lower priority sheds first), got {merged}"
                )
        self.thresholds: Mapping[PriorityClass, ShedThresholds] = merged

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> LoadShedder:
        owner = "shedder 'queue'"
        raw = ParamReader(owner, params, ("thresholds",)).raw("thresholds") or {}
        if not isinstance(raw, Mapping):
            raise InvalidPolicyConfig(f"{owner}: thresholds must be a mapping of class to limits")
        parsed: dict[PriorityClass, ShedThresholds] = {}
        for name, limits in raw.items():
            r = ParamReader(f"{owner} class {name!r}", limits, ("max_queue_depth", "max_queue_wait_s"))
            base = DEFAULT_THRESHOLDS[PriorityClass.from_name(str(name))]
            parsed[PriorityClass.from_name(str(name))] = ShedThresholds(
                r.float_("max_queue_depth", base.max_queue_depth, min_value=0.0),
                r.float_("max_queue_wait_s", base.max_queue_wait_s, min_value=0.0),
            )
        return cls(parsed)

    def decide(
        self, priority: PriorityClass, signal: LoadSignal, *, now: float, deadline_s: float | None = None
    ) -> ShedDecision:
        limits = self.thresholds[priority]
        if deadline_s is not None and now >= deadline_s:
            return ShedDecision(ShedAction.SHED, ShedReason.DEADLINE_PASSED, priority)
        if signal.queue_depth >= limits.max_queue_depth:
            return ShedDecision(ShedAction.SHED, ShedReason.QUEUE_DEPTH, priority)
        if signal.oldest_wait_s >= limits.max_queue_wait_s:
            return ShedDecision(ShedAction.SHED, ShedReason.QUEUE_WAIT, priority)
        if deadline_s is not None and now + signal.predicted_ttft_s > deadline_s:
            return ShedDecision(ShedAction.SHED, ShedReason.TTFT_OVER_BUDGET, priority)
        return ShedDecision(ShedAction.KEEP, ShedReason.UNDER_LIMITS, priority)


class TtftPredictor:
    """Queue-times-prefill TTFT model (see the module docstring); state changes only in ``observe``."""

    def __init__(
        self,
        *,
        mean_prefill_s: float = DEFAULT_MEAN_PREFILL_S,
        prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        alpha: float = DEFAULT_EWMA_ALPHA,
    ) -> None:
        if not (mean_prefill_s >= 0 and prefill_tokens_per_s > 0 and 0 < alpha <= 1):
            raise InvalidPolicyConfig(
                "ttft predictor: need mean_prefill_s >= 0, prefill_tokens_per_s > 0, 0 < alpha <= 1"
            )
        self.mean_prefill_s = mean_prefill_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.alpha = alpha

    def observe(self, ttft_s: float, *, waiting_ahead: int) -> None:
        """Fold one observed TTFT (of a request that found ``waiting_ahead`` waiting) into the mean."""
        if not (ttft_s >= 0 and math.isfinite(ttft_s)) or waiting_ahead < 0:
            return
        sample = ttft_s / (waiting_ahead + 1)
        self.mean_prefill_s += self.alpha * (sample - self.mean_prefill_s)

    def predict(
        self, views: Sequence[InstanceView], *, queue_depth: int = 0, prompt_tokens: int = 0
    ) -> float:
        usable = [v for v in views if v.ready and v.healthy]
        if not usable:
            return math.inf
        spread = queue_depth / len(usable)
        own = prompt_tokens / self.prefill_tokens_per_s
        return min((v.waiting + spread) * self.mean_prefill_s for v in usable) + own


def load_signal(
    views: Sequence[InstanceView],
    *,
    queue_depth: int,
    oldest_wait_s: float,
    predictor: TtftPredictor,
    prompt_tokens: int = 0,
) -> LoadSignal:
    """Build a pool's :class:`LoadSignal` from its views and the gateway queue's state."""
    return LoadSignal(
        queue_depth=queue_depth,
        oldest_wait_s=oldest_wait_s,
        predicted_ttft_s=predictor.predict(views, queue_depth=queue_depth, prompt_tokens=prompt_tokens),
    )
