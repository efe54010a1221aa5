"""The cached prefix expected to survive an instance's queue: the full match with nothing queued or
room for everything, less as the queued work overcommits the KV cache, never more than matched."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.routing.kv_survival import queued_kv_tokens, surviving_prefix_tokens
from tokenplane.core.views import InstanceView, RequestInfo

CAPACITY = 5000


def req(prompt: int = 2000, max_out: int = 100) -> RequestInfo:
    return RequestInfo("r", "m", prompt_tokens=prompt, max_output_tokens=max_out)


def inst(
    tokens: int, requests: int = 2, running: int = 0, waiting: int = 0, capacity: int = CAPACITY
) -> InstanceView:
    return InstanceView(
        "i0", outstanding_requests=requests, outstanding_tokens=tokens, running=running,
        waiting=waiting, kv_capacity_tokens=capacity,
    )  # fmt: skip


def test_examples() -> None:
    r = req(2000, 100)
    assert surviving_prefix_tokens(1600, r, inst(0, requests=0)) == 1600  # nothing queued ahead
    assert surviving_prefix_tokens(1600, r, inst(4500, requests=0, running=3)) == 1600  # not ours: stale
    assert surviving_prefix_tokens(1600, r, inst(4400)) == 1600  # 4400 + 400 + 100 = 4900 fits
    # 8000 + 400 + 100 = 8500 against 5000: sqrt(5000 / 8500) = 0.767 of the match
    assert surviving_prefix_tokens(1600, r, inst(8000)) == 1227
    # the instance reports twice the requests this gateway has in flight there: twice the work
    assert surviving_prefix_tokens(1600, r, inst(4000, requests=2, running=3, waiting=1)) == 1227
    assert surviving_prefix_tokens(1600, r, inst(8000, capacity=0)) == 1600  # capacity unknown
    assert surviving_prefix_tokens(0, r, inst(8000)) == 0


def test_peer_replicas_work_counts_as_known() -> None:
    r = req(2000, 100)
    # the other replica shares its 4000 tokens in flight there: 8000 in all, as if one control plane
    shared = msgspec.structs.replace(inst(4000), peer_outstanding_requests=2, peer_outstanding_tokens=4000)
    assert queued_kv_tokens(shared) == 8000
    assert surviving_prefix_tokens(1600, r, shared) == 1227
    # nothing from here, the peer's work alone: it is known, so it counts (no scrape needed)
    theirs = msgspec.structs.replace(inst(0, 0), peer_outstanding_requests=2, peer_outstanding_tokens=8000)
    assert surviving_prefix_tokens(1600, r, theirs) == 1227
    # the instance reports more than both replicas know of: scaled by reported / known (4 / 2)
    more = msgspec.structs.replace(
        inst(2000, 1, running=3, waiting=1), peer_outstanding_requests=1, peer_outstanding_tokens=2000
    )
    assert queued_kv_tokens(more) == 8000
    # reported fewer than known (a stale scrape): no scaling down
    stale = msgspec.structs.replace(
        inst(4000, running=1), peer_outstanding_requests=2, peer_outstanding_tokens=4000
    )
    assert queued_kv_tokens(stale) == 8000


matched_st = st.integers(0, 20_000)
tokens_st = st.integers(0, 200_000)
requests_st = st.integers(0, 64)
reported_st = st.integers(0, 64)
capacity_st = st.integers(0, 100_000)
prompt_st = st.integers(1, 20_000)
out_st = st.integers(0, 4096)


@given(matched_st, tokens_st, tokens_st, requests_st, reported_st, reported_st, capacity_st, prompt_st,
       out_st)  # fmt: skip
def test_more_queued_work_never_leaves_more(
    matched: int, a: int, b: int, n: int, running: int, waiting: int, cap: int, prompt: int, out: int
) -> None:
    r = req(prompt, out)
    lo, hi = sorted((a, b))
    fewer = surviving_prefix_tokens(matched, r, inst(lo, n, running, waiting, cap))
    more = surviving_prefix_tokens(matched, r, inst(hi, n, running, waiting, cap))
    assert 0 <= more <= fewer <= matched


@given(matched_st, tokens_st, requests_st, reported_st, reported_st, capacity_st, prompt_st, out_st)
def test_more_reported_requests_never_leave_more(
    matched: int, tokens: int, n: int, r1: int, r2: int, cap: int, prompt: int, out: int
) -> None:
    r = req(prompt, out)
    lo, hi = sorted((r1, r2))
    assert surviving_prefix_tokens(matched, r, inst(tokens, n, hi, 0, cap)) <= surviving_prefix_tokens(
        matched, r, inst(tokens, n, lo, 0, cap)
    )


@given(matched_st, tokens_st, reported_st, reported_st, capacity_st, prompt_st, out_st)
def test_an_empty_queue_keeps_the_full_match(
    matched: int, tokens: int, running: int, waiting: int, cap: int, prompt: int, out: int
) -> None:
    # nothing of this control plane's in flight there: what the events report is what it reuses
    view = inst(tokens, 0, running, waiting, cap)
    assert surviving_prefix_tokens(matched, req(prompt, out), view) == matched


@given(matched_st, requests_st, reported_st, capacity_st, prompt_st, out_st, st.data())
def test_free_kv_for_everything_keeps_the_full_match(
    matched: int, n: int, reported: int, cap: int, prompt: int, out: int, data: st.DataObject
) -> None:
    room = cap - max(0, prompt - matched) - out
    # the in-flight work, scaled to the reported requests, plus this request's own fits the cache
    scale = max(1.0, reported / n) if n else 1.0
    tokens = data.draw(st.integers(0, max(0, int(room / scale))))
    view = inst(tokens, n, reported, 0, cap)
    if queued_kv_tokens(view) + max(0, prompt - matched) + out <= cap:
        assert surviving_prefix_tokens(matched, req(prompt, out), view) == matched


@given(matched_st, tokens_st, tokens_st, requests_st, requests_st, reported_st, capacity_st, prompt_st,
       out_st)  # fmt: skip
def test_peer_work_never_leaves_more(
    matched: int, tokens: int, peer: int, n: int, pn: int, reported: int, cap: int, prompt: int, out: int
) -> None:
    r = req(prompt, out)
    alone = inst(tokens, n, reported, 0, cap)
    shared = msgspec.structs.replace(alone, peer_outstanding_requests=pn, peer_outstanding_tokens=peer)
    if pn == 0 or tokens * pn <= peer * n:
        # the peers' work is at least as heavy per request as this replica's: never more survives
        assert surviving_prefix_tokens(matched, r, shared) <= surviving_prefix_tokens(matched, r, alone)
    assert 0 <= surviving_prefix_tokens(matched, r, shared) <= matched
