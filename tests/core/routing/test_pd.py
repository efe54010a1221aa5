"""The pd-pair policy: table-driven choices and hypothesis properties (scores in [0, 1], select pure)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.routing import PairReason, PdPairRouter, build_pair_router
from tokenplane.core.views import InstanceView, RequestInfo

REQ = RequestInfo(request_id="r", model="m", prompt_tokens=1000, max_output_tokens=100)


def view(iid: str, **kw: object) -> InstanceView:
    base: dict[str, object] = {"kv_capacity_tokens": 100_000}
    base.update(kw)
    return InstanceView(instance_id=iid, **base)  # type: ignore[arg-type]


def test_prefill_by_queued_tokens_and_decode_by_kv_headroom_and_batch() -> None:
    router = build_pair_router("pd-pair")
    pre = [view("p0", outstanding_tokens=9000), view("p1", outstanding_tokens=1000)]
    dec = [
        view("d0", kv_usage=0.9, outstanding_requests=2),
        view("d1", kv_usage=0.2, outstanding_requests=2),
        view("d2", kv_usage=0.2, outstanding_requests=8),
    ]
    d = router.select_pair(REQ, pre, dec, now=0.0)
    assert (d.prefill_id, d.decode_id, d.reason) == ("p1", "d1", PairReason.PAIRED)
    assert d.routed and 0.0 <= d.prefill_score <= 1.0 and 0.0 <= d.decode_score <= 1.0


def test_prefix_held_on_a_prefill_instance_outweighs_a_little_load() -> None:
    req = RequestInfo(
        request_id="r", model="m", prompt_tokens=1000, max_output_tokens=10, cached_prefix_tokens={"p0": 900}
    )
    pre = [view("p0", outstanding_tokens=2000), view("p1", outstanding_tokens=1800)]
    assert build_pair_router("pd-pair").select_pair(req, pre, [view("d0")], now=0.0).prefill_id == "p0"
    no_prefix = build_pair_router({"name": "pd-pair", "params": {"prefix_weight": 0}})
    assert no_prefix.select_pair(req, pre, [view("d0")], now=0.0).prefill_id == "p1"


def test_decode_without_room_for_the_prompt_scores_zero_on_kv() -> None:
    router = PdPairRouter(kv_weight=1.0, batch_weight=0.0)
    full = view("d0", kv_usage=0.995)
    (s,) = router.decode_scores(REQ, [full])
    assert s == 0.0


def test_not_ready_instances_are_not_candidates_and_empty_pools_say_which() -> None:
    router = build_pair_router("pd-pair")
    pre = [view("p0", ready=False), view("p1")]
    dec = [view("d0", healthy=False), view("d1")]
    d = router.select_pair(REQ, pre, dec, now=0.0)
    assert (d.prefill_id, d.decode_id) == ("p1", "d1")
    none_p = router.select_pair(REQ, [view("p0", ready=False)], dec, now=0.0)
    assert (none_p.routed, none_p.reason) == (False, PairReason.NO_PREFILL)
    none_d = router.select_pair(REQ, pre, [], now=0.0)
    assert (none_d.routed, none_d.reason, none_d.decode_id) == (False, PairReason.NO_DECODE, None)


@pytest.mark.parametrize(
    "params",
    [
        {"kv_weight": -1},
        {"kv_weight": 0, "batch_weight": 0},
        {"prefill_load_weight": float("inf")},
        {"nope": 1},
    ],
)
def test_bad_params_fail_at_build(params: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicyConfig, match="pd-pair"):
        build_pair_router({"name": "pd-pair", "params": params})


views_st = st.builds(
    InstanceView,
    instance_id=st.text(min_size=1, max_size=4),
    ready=st.booleans(),
    healthy=st.booleans(),
    outstanding_requests=st.integers(0, 10_000),
    outstanding_tokens=st.integers(0, 10_000_000),
    kv_usage=st.floats(0.0, 1.0),
    kv_capacity_tokens=st.integers(0, 2_000_000),
)
request_st = st.builds(
    RequestInfo,
    request_id=st.just("r"),
    model=st.just("m"),
    prompt_tokens=st.integers(0, 200_000),
    max_output_tokens=st.integers(0, 10_000),
    cached_prefix_tokens=st.none()
    | st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 300_000)),
)
weights_st = st.tuples(*(st.floats(0.0, 100.0) for _ in range(4))).filter(
    lambda w: w[0] + w[1] > 0 and w[2] + w[3] > 0
)


@settings(max_examples=100, deadline=None)
@given(request_st, st.lists(views_st, max_size=6), st.lists(views_st, max_size=6), weights_st)
def test_scores_in_unit_interval_and_select_is_pure(
    req: RequestInfo, pre: list[InstanceView], dec: list[InstanceView], w: tuple[float, float, float, float]
) -> None:
    router = PdPairRouter(*w)
    for s in [*router.prefill_scores(req, pre), *router.decode_scores(req, dec)]:
        assert 0.0 <= s <= 1.0
    state = copy.deepcopy(vars(router))
    first = router.select_pair(req, pre, dec, now=1.0)
    assert router.select_pair(req, pre, dec, now=1.0) == first  # same inputs, same pair
    assert vars(router) == state  # select changes nothing
    if first.routed:
        assert first.prefill_id in {v.instance_id for v in pre if v.ready and v.healthy}
        assert first.decode_id in {v.instance_id for v in dec if v.ready and v.healthy}
    else:
        assert first.prefill_id is None and first.decode_id is None
