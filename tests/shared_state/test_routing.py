"""Replicas sharing their approximate prefix indexes: what one learns from another stays matchable."""

from __future__ import annotations

from collections.abc import Sequence

from block_chains import chain
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.routing.prefix_affinity import PrefixAffinityRouter
from tokenplane.core.views import RequestInfo
from tokenplane.shared_state.routing import SharedPrefixRouter, learn


class Wire:
    """Delivers one replica's routing decisions straight into the other's index (pub/sub's job)."""

    def __init__(self) -> None:
        self.to: PrefixAffinityRouter | None = None
        self.sent: list[tuple[str, str, list[int]]] = []

    def publish_routed(self, model: str, instance_id: str, block_hashes: Sequence[int]) -> None:
        self.sent.append((model, instance_id, list(block_hashes)))
        assert self.to is not None
        learn(self.to.index, instance_id, block_hashes, 0.0)


def replicas(bound: int) -> tuple[SharedPrefixRouter, SharedPrefixRouter, Wire]:
    a = PrefixAffinityRouter(max_blocks_per_instance=bound)
    b = PrefixAffinityRouter(max_blocks_per_instance=bound)
    a_to_b, b_to_a = Wire(), Wire()
    a_to_b.to, b_to_a.to = b, a
    return SharedPrefixRouter(a, a.index, "m", a_to_b), SharedPrefixRouter(b, b.index, "m", b_to_a), a_to_b


def route(router: SharedPrefixRouter, instance: str, hashes: tuple[int, ...]) -> None:
    info = RequestInfo(
        request_id="r", model="m", prompt_tokens=64 * len(hashes), max_output_tokens=8, block_hashes=hashes
    )
    router.on_routed(info, instance, now=0.0)


def test_a_receiver_that_aged_the_prefix_out_does_not_match_the_suffix_alone() -> None:
    a, b, a_to_b = replicas(bound=4)  # generations of 2 blocks
    route(a, "x", chain(1))  # b learns x holds block 1
    route(b, "y", chain(1))  # and b itself sends block 1 to y
    for k in range(2, 8):  # a keeps block 1 for x fresh (its own routings touch it); b only learns
        route(a, "x", chain(1, k))
    assert a_to_b.sent[-1][2] == list(chain(1, 7))  # the whole chain, though block 1 was no news to a
    assert b.index.match(chain(1, 7)) == {"x": 2, "y": 1}


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.booleans(),  # routed by replica a (else b)
            st.sampled_from(["x", "y", "z"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=8).map(lambda bs: chain(*bs)),
        ),
        max_size=40,
    ),
    bound=st.integers(1, 10),
    probe=st.lists(st.integers(0, 3), max_size=8).map(lambda bs: chain(*bs)),
)
def test_both_replicas_match_what_a_block_by_block_walk_finds(
    ops: list[tuple[bool, str, tuple[int, ...]]], bound: int, probe: tuple[int, ...]
) -> None:
    a, b, _ = replicas(bound)
    for by_a, instance, hashes in ops:
        route(a if by_a else b, instance, hashes)
    for replica in (a, b):
        index = replica.index
        walked = {i: d for i in index.instances if (d := index.matched_depth(probe, i)) > 0}
        assert index.match(probe) == walked
