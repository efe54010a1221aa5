"""Weighted: a scoring profile in the llm-d endpoint-picker style (filters → scorers → picker).

Algorithm, per request: drop unusable (not ready / not healthy) instances, apply the profile's
filters in order, let each scorer score every remaining candidate in [0, 1], sum the scores
weighted by each scorer's ``weight``, and let the picker choose. Reason ``WEIGHTED_SCORE``; an
empty list after filtering is ``NO_CANDIDATES``. The totals are divided by the sum of the weights, so
they too lie in [0, 1] (the division does not change the ranking); with ``record_scores`` the
decision carries them as ``{instance_id: total}``.

Params::

    filters: [ready | kv-below | queue-below, ...]    # names or {name, params}; default none
    scorers: [{name, weight, params}, ...]            # default prefix-overlap×2, queue-depth, kv-usage
    picker: max-score | {name: random-top, params: {top_k: 3}}   # default max-score
    max_blocks_per_instance: 200000                   # bound of the shared prefix index
    record_scores: false                              # attach per-instance totals to decisions

Weights are numbers >= 0 (default 1; 0 disables a scorer). The router owns one
:class:`~tokenplane.core.routing.prefix_index.PrefixIndex`, binds it to every scorer that reads one
(``prefix-overlap``) and updates it in ``on_routed`` — only if some scorer reads it. ``select`` never
changes it; ``forget(instance_id)`` drops an instance's entries.

Stateful parts: a filter or scorer (with weight > 0) that has ``on_routed``, ``on_finished`` and
``forget`` (the :class:`RoutingObserver` protocol, e.g. ``workflow-affinity``) is called from the
router's methods of the same name, after the prefix index, in profile order (filters, then scorers).
That is the only place its state may change; ``select`` only reads it.

Other profiles reuse this router under their own name (``seven-axis`` builds one through
:func:`build_weighted` with its own defaults).

Cost: the sum of the filters' and scorers' passes (each O(candidates), plus the prefix walk), one list
of totals per scorer, and a dict only with ``record_scores``. Several times the cost of a least-load
pass; use it where the better choice pays for that.

How it fails: as well as its parts do. Scores mix absolute (kv-usage, prefix-overlap) and relative
(queue-depth, outstanding-tokens) signals, so weights tuned on one fleet size may not carry over; the
reported signals lag, and a strict ``max-score`` picker herds on stale scores (use ``random-top``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, Family, PluginSpec, build, register
from tokenplane.core.routing.base import FILTERS, PICKERS, ROUTERS, SCORERS, Filter, Picker, Scorer
from tokenplane.core.routing.candidates import NO_CANDIDATES, usable
from tokenplane.core.routing.pickers import MaxScorePicker
from tokenplane.core.routing.prefix_index import DEFAULT_MAX_BLOCKS_PER_INSTANCE, PrefixIndex
from tokenplane.core.routing.scorers import PrefixIndexConsumer
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo, RouteDecision, RouteReason

DEFAULT_SCORERS: tuple[Mapping[str, Any], ...] = (
    {"name": "prefix-overlap", "weight": 2.0},
    {"name": "queue-depth", "weight": 1.0},
    {"name": "kv-usage", "weight": 1.0},
)
DEFAULT_PICKER = "max-score"
_OWNER = "router 'weighted'"
T = TypeVar("T")


@runtime_checkable
class RoutingObserver(Protocol):
    """A filter or scorer with state: it hears what the shell did, through the router."""

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None: ...

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None: ...

    def forget(self, instance_id: InstanceId) -> None: ...


class WeightedRouter:
    name = "weighted"

    def __init__(
        self,
        *,
        scorers: Sequence[tuple[Scorer, float]],
        filters: Sequence[Filter] = (),
        picker: Picker | None = None,
        max_blocks_per_instance: int = DEFAULT_MAX_BLOCKS_PER_INSTANCE,
        record_scores: bool = False,
        name: str = "weighted",
    ) -> None:
        self.name = name
        for scorer, weight in scorers:
            if not weight >= 0:
                raise ValueError(f"scorer {scorer.name!r}: weight must be >= 0, got {weight}")
        self.filters = tuple(filters)
        self.scorers = tuple((s, float(w)) for s, w in scorers if w > 0)
        self.picker: Picker = picker if picker is not None else MaxScorePicker()
        self.record_scores = record_scores
        self.index = PrefixIndex(max_blocks_per_instance)
        self._uses_index = False
        for scorer, _ in self.scorers:
            if isinstance(scorer, PrefixIndexConsumer):
                scorer.bind_prefix_index(self.index)
                self._uses_index = True
        weight_sum = 0.0
        for _, weight in self.scorers:  # same order as the totals, so a total never exceeds it
            weight_sum += weight
        self._weight_sum = weight_sum
        parts: list[object] = [*self.filters, *(s for s, _ in self.scorers)]
        self._observers: tuple[RoutingObserver, ...] = tuple(
            p for p in parts if isinstance(p, RoutingObserver)
        )

    def select(
        self, request: RequestInfo, candidates: Sequence[InstanceView], *, now: float
    ) -> RouteDecision:
        pool = usable(candidates)
        for f in self.filters:
            if not pool:
                break
            pool = f.filter(request, pool, now=now)
        if not pool:
            return NO_CANDIDATES
        totals: list[float] | None = None
        for scorer, weight in self.scorers:
            scores = scorer.score(request, pool, now=now)
            if totals is None:
                totals = [weight * s for s in scores]
            else:
                totals = [t + weight * s for t, s in zip(totals, scores, strict=True)]
        if totals is None:
            totals = [0.0] * len(pool)
        chosen = pool[self.picker.pick(totals)].instance_id
        if not self.record_scores:
            return RouteDecision(chosen, RouteReason.WEIGHTED_SCORE)
        ws = self._weight_sum
        recorded = {v.instance_id: (t / ws if ws > 0 else 0.0) for v, t in zip(pool, totals, strict=True)}
        return RouteDecision(chosen, RouteReason.WEIGHTED_SCORE, scores=recorded)

    def on_routed(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        if self._uses_index:
            self.index.insert(instance_id, request.block_hashes, now)
        for observer in self._observers:
            observer.on_routed(request, instance_id, now=now)

    def on_finished(self, request: RequestInfo, instance_id: InstanceId, *, now: float) -> None:
        for observer in self._observers:
            observer.on_finished(request, instance_id, now=now)

    def forget(self, instance_id: InstanceId) -> None:
        self.index.forget(instance_id)
        for observer in self._observers:
            observer.forget(instance_id)


WEIGHTED_PARAMS = ("filters", "scorers", "picker", "max_blocks_per_instance", "record_scores")
"""The params :func:`build_weighted` accepts (profiles built on it add their own)."""


def _as_list(value: Any, key: str, owner: str = _OWNER) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidPolicyConfig(f"{owner}: param {key!r} must be a list, got {value!r}")
    return list(value)


def _build_part(raw: Any, family: Family[T], ctx: BuildContext, owner: str = _OWNER) -> T:
    try:
        return build(PluginSpec.parse(raw, default_kind=family.kind), ctx, family)
    except InvalidPolicyConfig as exc:
        raise InvalidPolicyConfig(f"{owner}: {exc}") from exc


def _weight(item: Mapping[str, Any], owner: str = _OWNER) -> float:
    weight = item.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight >= 0:
        raise InvalidPolicyConfig(
            f"{owner}: scorer {item.get('name')!r}: weight must be a number >= 0, got {weight!r}"
        )
    return float(weight)


def build_weighted(
    params: Mapping[str, Any],
    ctx: BuildContext,
    *,
    owner: str = _OWNER,
    name: str = "weighted",
    default_scorers: Sequence[Any] = DEFAULT_SCORERS,
    default_filters: Sequence[Any] = (),
) -> WeightedRouter:
    """Build a weighted profile from ``params`` (keys :data:`WEIGHTED_PARAMS`), naming ``owner`` in errors."""
    reader = ParamReader(owner, params, WEIGHTED_PARAMS)
    filter_items = _as_list(reader.raw("filters", list(default_filters)), "filters", owner)
    filters = [_build_part(f, FILTERS, ctx, owner) for f in filter_items]
    scorer_items = _as_list(reader.raw("scorers", default_scorers), "scorers", owner)
    if not scorer_items:
        raise InvalidPolicyConfig(f"{owner}: param 'scorers' must name at least one scorer")
    scorers: list[tuple[Scorer, float]] = []
    for item in scorer_items:
        if isinstance(item, Mapping):
            rest = {k: v for k, v in item.items() if k != "weight"}
            scorers.append((_build_part(rest, SCORERS, ctx, owner), _weight(item, owner)))
        else:
            scorers.append((_build_part(item, SCORERS, ctx, owner), 1.0))
    picker = _build_part(reader.raw("picker", DEFAULT_PICKER), PICKERS, ctx, owner)
    return WeightedRouter(
        scorers=scorers,
        filters=filters,
        picker=picker,
        max_blocks_per_instance=reader.int_(
            "max_blocks_per_instance", DEFAULT_MAX_BLOCKS_PER_INSTANCE, min_value=1
        ),
        record_scores=reader.bool_("record_scores", False),
        name=name,
    )


@register(ROUTERS, "weighted")
def _build(params: Mapping[str, Any], ctx: BuildContext) -> WeightedRouter:
    return build_weighted(params, ctx)
