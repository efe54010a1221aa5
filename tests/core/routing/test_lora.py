"""The lora-affinity scorer and the lora-aware router: properties and the choices they make."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.routing import build_router
from tokenplane.core.routing.lora import LoraAffinityScorer
from tokenplane.core.views import InstanceView, RequestInfo

ADAPTERS = [f"a{i}" for i in range(6)]


def _req(adapter: str | None, rid: str = "r") -> RequestInfo:
    return RequestInfo(request_id=rid, model="m", prompt_tokens=10, max_output_tokens=10, adapter=adapter)


views = st.lists(
    st.builds(
        lambda i, held, q: InstanceView(instance_id=f"i{i}", adapters=frozenset(held), waiting=q),
        st.integers(0, 1000),
        st.sets(st.sampled_from(ADAPTERS), max_size=4),
        st.integers(0, 50),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda v: v.instance_id,
)


@given(
    views,
    st.sampled_from([None, *ADAPTERS]),
    st.integers(0, 4),
    st.lists(st.tuples(st.sampled_from(ADAPTERS), st.integers(0, 7))),
)
def test_scores_in_unit_interval_and_select_changes_nothing(
    candidates: list[InstanceView], adapter: str | None, limit: int, sent: list[tuple[str, int]]
) -> None:
    scorer = LoraAffinityScorer(max_adapters=limit)
    router = build_router({"name": "lora-aware", "params": {"max_adapters": limit}}, random.Random(0))
    for a, k in sent:  # some history of where adapters were sent
        target = candidates[k % len(candidates)].instance_id
        scorer.on_routed(_req(a), target, now=0.0)
        router.on_routed(_req(a), target, now=0.0)
    req = _req(adapter)
    first = scorer.score(req, candidates, now=1.0)
    assert all(0.0 <= s <= 1.0 for s in first)
    assert scorer.score(req, candidates, now=1.0) == first  # scoring does not change state
    d1 = router.select(req, candidates, now=1.0)
    assert router.select(req, candidates, now=1.0) == d1
    assert d1.instance_id in {v.instance_id for v in candidates}
    if adapter is None:
        assert first == [1.0] * len(candidates)


def test_prefers_the_instance_holding_the_adapter_until_its_queue_is_deepest() -> None:
    router = build_router({"name": "lora-aware", "params": {"max_adapters": 2}}, random.Random(0))
    fleet = [
        InstanceView(instance_id="x", adapters=frozenset({"a0", "a1"}), waiting=4),
        InstanceView(instance_id="y", adapters=frozenset({"a2", "a3"}), waiting=2),
        InstanceView(instance_id="z", adapters=frozenset({"a4"}), waiting=3),
    ]
    assert router.select(_req("a2"), fleet, now=0.0).instance_id == "y"
    assert router.select(_req("a0"), fleet, now=0.0).instance_id == "x"  # loaded beats a free slot
    busy = [fleet[0], fleet[1], InstanceView(instance_id="z", adapters=frozenset({"a4"}), waiting=0)]
    busy[0] = InstanceView(instance_id="x", adapters=frozenset({"a0", "a1"}), waiting=40)
    # x holds a0 but has the deepest queue; z is idle with a free slot: load balancing wins
    assert router.select(_req("a0"), busy, now=0.0).instance_id == "z"


def test_own_record_of_sent_adapters_counts_until_the_instance_is_forgotten() -> None:
    router = build_router({"name": "lora-aware", "params": {"max_adapters": 1}}, random.Random(0))
    fleet = [InstanceView(instance_id="x"), InstanceView(instance_id="y")]
    router.on_routed(_req("a5"), "y", now=0.0)  # not reported yet, but the router sent it there
    assert router.select(_req("a5"), fleet, now=0.0).instance_id == "y"
    router.forget("y")
    assert router.select(_req("a5"), fleet, now=0.0).instance_id == "x"  # ties go to the first
