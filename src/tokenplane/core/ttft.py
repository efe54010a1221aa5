"""A model pool's observed time to first token, and the one up-front SLO rule both shells apply.

:class:`PoolTtft` wraps one pool's :class:`~tokenplane.core.shedding.TtftPredictor`. Each shell
feeds it the TTFT of every attempt that produced a first token, with the queue the instance
reported when the attempt was sent (the gateway when a stream's relay ends, the twin at the
engine's first-token event), and reads it twice:

* an instance's view carries ``predicted_ttft_s = (waiting + 1) x mean_prefill_s`` (the requests
  it reports waiting, then the newcomer's own prefill, each at the pool's observed mean); 0
  (unknown) before the first observation and for an instance whose weights are not warm (the
  placement router then adds its own readiness delay): :meth:`PoolTtft.view_ttft_s`;
* admission's up-front rule, :func:`ttft_up_front`: before a request is offered to the queue, it
  is shed with ``TTFT_OVER_BUDGET`` when the core's :class:`~tokenplane.core.shedding.LoadShedder`
  says ``now + predicted TTFT > deadline`` (the deadline is the queue's: arrival plus the request's
  ``latency_budget_s``, else its class's budget, capped by its workflow's deadline). Nothing is
  predicted before the pool's first observation (``NO_PREDICTION``: a pool that has served nothing
  builds no views for it), an infinite prediction (no usable instance) sheds nothing here
  (``NO_USABLE_INSTANCE``: routing answers that with its own error), and when the shedder's first
  reason is another one (a passed deadline, queue depth or wait) the queue's own checks answer it
  (``LEFT_TO_QUEUE``).

``PoolTtft.version`` moves when the mean moved by more than :data:`TTFT_REPUBLISH_RATIO` since
last published and at least :data:`TTFT_REPUBLISH_MIN_S` has passed since then (the clock is the
caller's ``now``): a shell rebuilds its views then, not at every observation. The time floor bounds
the rebuilds by time, not by traffic: with prompt lengths varying several-fold, a 2 % move came
with nearly every other first token, and the twin rebuilt all the views of a 1,024-instance fleet
that often (14x the CPU of 30,000 requests of ``bench/sim_speed.py``'s day run, measured side by
side); views are then at most that much staler than the mean, about one metrics scrape.

:func:`free_kv_bytes` is the view's ``hbm_free_bytes`` in both shells: no runtime publishes free
HBM, so it is the free KV cache in bytes, ``capacity x (1 - kv_usage) x bytes per token``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import StrEnum

import msgspec

from tokenplane.core.admission import AdmissionQueue, PriorityClass
from tokenplane.core.shedding import LoadShedder, ShedReason, TtftPredictor, load_signal
from tokenplane.core.views import InstanceView, RequestInfo

TTFT_REPUBLISH_RATIO = 0.02
"""Views carry a new predicted TTFT when the pool's mean prefill time moved by more than this
fraction since they were built: every observation would otherwise rebuild every view."""

TTFT_REPUBLISH_MIN_S = 1.0
"""...and at most once per this many seconds of the caller's clock."""

WARM = "warm"


class PoolTtft:
    """One model pool's :class:`~tokenplane.core.shedding.TtftPredictor`, fed with observed TTFTs
    (see the module docstring). Before the first observation nothing is predicted."""

    __slots__ = ("mean_prefill_s", "observed", "predictor", "published_s", "version")

    def __init__(self, predictor: TtftPredictor | None = None) -> None:
        self.predictor = predictor if predictor is not None else TtftPredictor()
        self.observed = 0
        self.version = 0
        self.mean_prefill_s = 0.0  # as last published to views; 0 before the first observation
        self.published_s = -math.inf

    def observe(self, ttft_s: float, waiting_ahead: int, *, now: float) -> None:
        """An attempt got its first token ``ttft_s`` after it was sent, behind ``waiting_ahead``;
        ``now``: the caller's clock, for the republish floor."""
        self.predictor.observe(ttft_s, waiting_ahead=max(0, waiting_ahead))
        self.observed += 1
        mean = self.predictor.mean_prefill_s
        published = self.mean_prefill_s
        if not published or (
            abs(mean - published) > TTFT_REPUBLISH_RATIO * published
            and now - self.published_s >= TTFT_REPUBLISH_MIN_S
        ):
            self.mean_prefill_s = mean
            self.published_s = now
            self.version += 1

    def has_observed(self) -> bool:
        return self.observed > 0

    def for_waiting(self, waiting: int) -> float:
        return (max(0, waiting) + 1) * self.mean_prefill_s

    def view_ttft_s(self, waiting: int, weights: str) -> float:
        """An instance view's ``predicted_ttft_s``: 0 (unknown) unless its weights are warm."""
        return (max(0, waiting) + 1) * self.mean_prefill_s if weights == WARM else 0.0


def free_kv_bytes(capacity_tokens: int, kv_usage: float, bytes_per_token: int) -> int:
    """An instance view's ``hbm_free_bytes``: its free KV cache in bytes (0 when either is unknown).
    A usage outside [0, 1] is clamped; NaN counts as full, as the placement router reads it."""
    if not 0.0 <= kv_usage <= 1.0:
        kv_usage = 0.0 if kv_usage < 0.0 else 1.0
    return int(capacity_tokens * (1.0 - kv_usage) * bytes_per_token)


class UpFrontReason(StrEnum):
    """Why :func:`ttft_up_front` shed a request or let it through to the queue."""

    NO_PREDICTION = "no_prediction"
    NO_USABLE_INSTANCE = "no_usable_instance"
    LEFT_TO_QUEUE = "left_to_queue"
    WITHIN_BUDGET = "within_budget"
    TTFT_OVER_BUDGET = "ttft_over_budget"


class UpFront(msgspec.Struct, frozen=True):
    """The up-front rule's answer: shed or not, why, and what it read."""

    shed: bool
    reason: UpFrontReason
    predicted_ttft_s: float = 0.0
    deadline_s: float = math.inf


_NOT_PREDICTING = UpFront(False, UpFrontReason.NO_PREDICTION)


def ttft_up_front(
    ttft: PoolTtft,
    views: Callable[[], Sequence[InstanceView]],
    info: RequestInfo,
    priority: PriorityClass,
    queue: AdmissionQueue,
    shedder: LoadShedder,
    *,
    now: float,
) -> UpFront:
    """Shed ``info`` before it is offered when its predicted TTFT is over its budget (see the
    module docstring). ``views``: the pool's instances, read only once the pool predicts."""
    if not ttft.has_observed():
        return _NOT_PREDICTING
    deadline = queue.deadline_for(info, priority, info.latency_budget_s)
    signal = load_signal(
        views(),
        queue_depth=queue.depth,
        oldest_wait_s=queue.oldest_wait_s(now=now),
        predictor=ttft.predictor,
        prompt_tokens=info.prompt_tokens,
    )
    predicted = signal.predicted_ttft_s
    if not math.isfinite(predicted):
        return UpFront(False, UpFrontReason.NO_USABLE_INSTANCE, predicted, deadline)
    decision = shedder.decide(priority, signal, now=now, deadline_s=deadline)
    if decision.reason is ShedReason.TTFT_OVER_BUDGET:
        return UpFront(True, UpFrontReason.TTFT_OVER_BUDGET, predicted, deadline)
    if decision.shed:
        return UpFront(False, UpFrontReason.LEFT_TO_QUEUE, predicted, deadline)
    return UpFront(False, UpFrontReason.WITHIN_BUDGET, predicted, deadline)
