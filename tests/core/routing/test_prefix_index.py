"""The shared prefix index: longest-prefix matching, generational leaves-first eviction, bounds, forget."""

from __future__ import annotations

import pytest
from block_chains import chain
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.routing.prefix_index import PrefixIndex


def reference_depth(index: PrefixIndex, hashes: tuple[int, ...], iid: str) -> int:
    return index.matched_depth(hashes, iid)


def test_match_depths() -> None:
    idx = PrefixIndex()
    a = chain(1, 2, 3, 4)
    b = chain(1, 2, 9)
    idx.insert("x", a, now=1.0)
    idx.insert("y", b, now=2.0)
    assert idx.match(a) == {"x": 4, "y": 2}
    assert idx.match(b) == {"x": 2, "y": 3}
    assert idx.match(chain(1, 2, 3, 7, 8)) == {"x": 3, "y": 2}
    assert idx.match(chain(5)) == {}
    assert idx.match(()) == {}
    assert idx.blocks_held("x") == 4 and idx.blocks_held("y") == 3
    assert len(idx) == 5  # 1, 1-2 shared; 1-2-3, 1-2-3-4, 1-2-9


def test_generations_evict_untouched_blocks_leaves_first_and_respect_the_bound() -> None:
    idx = PrefixIndex(max_blocks_per_instance=4)  # generations of 2 blocks
    old = chain(1, 2, 3)  # indexed by its first 2 blocks
    idx.insert("x", old, now=1.0)
    assert idx.blocks_held("x") == 2 and idx.match(old) == {"x": 2}
    new = chain(1, 5)
    idx.insert("x", new, now=2.0)  # a rotation: chain(1, 2) stays, in the old generation
    assert idx.blocks_held("x") == 3
    assert idx.match(new) == {"x": 2} and idx.match(old) == {"x": 2}
    assert idx.snapshot()["x"] == ((old[1], 1), (new[1], 0), (new[0], 0))  # 1 touched again: young
    idx.insert("x", chain(7, 8), now=3.0)  # rotates: old[1] (untouched since) goes, the leaf first
    assert idx.blocks_held("x") == 4
    assert idx.match(old) == {"x": 1} and idx.match(new) == {"x": 2}
    assert idx.match(chain(7, 8)) == {"x": 2}
    idx.insert("x", chain(9, 10), now=4.0)
    assert idx.blocks_held("x") == 4
    assert idx.match(new) == {} and idx.match(chain(9, 10)) == {"x": 2}
    assert idx.match(chain(7, 8)) == {"x": 2}


def test_long_request_is_truncated_to_half_the_bound() -> None:
    idx = PrefixIndex(max_blocks_per_instance=5)
    long = chain(*range(10))
    idx.insert("x", long, now=0.0)
    assert idx.blocks_held("x") == 3
    assert idx.match(long) == {"x": 3}


def test_forget_drops_an_instance() -> None:
    idx = PrefixIndex()
    idx.insert("x", chain(1, 2), now=0.0)
    idx.insert("y", chain(1, 3), now=0.0)
    idx.forget("x")
    idx.forget("nobody")
    assert idx.match(chain(1, 2)) == {"y": 1}
    assert idx.instances == ["y"]
    assert len(idx) == 2


def test_hashes_beyond_64_bits_are_kept_too() -> None:
    idx = PrefixIndex()
    big = (2**70, 2**70 + 1)
    idx.insert("x", chain(1), now=0.0)
    idx.insert("x", big, now=0.0)
    assert idx.match(big) == {"x": 2} and idx.blocks_held("x") == 3
    idx.forget("x")
    assert len(idx) == 0


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_bound(bad: int) -> None:
    with pytest.raises(ValueError):
        PrefixIndex(bad)


# A small universe of chains (prefixes share early blocks), inserted into a few instances.
chains = st.lists(st.integers(0, 3), min_size=0, max_size=12).map(lambda bs: chain(*bs))
# None: forget the instance (its bit in the holder masks is then reused by the next newcomer)
ops = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.one_of(chains, st.none())), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, cap=st.integers(1, 12), probe=chains)
def test_index_bounded_and_match_agrees_with_a_per_instance_walk(
    ops: list[tuple[str, tuple[int, ...] | None]], cap: int, probe: tuple[int, ...]
) -> None:
    idx = PrefixIndex(max_blocks_per_instance=cap)
    for t, (iid, hashes) in enumerate(ops):
        if hashes is None:
            idx.forget(iid)
            assert idx.blocks_held(iid) == 0 and iid not in idx.instances
            continue
        idx.insert(iid, hashes, now=float(t))
        assert idx.blocks_held(iid) <= cap
        if hashes:  # a chain just inserted always matches, as far as it is indexed
            assert idx.match(hashes)[iid] == min(len(hashes), (cap + 1) // 2)
    assert len(idx) == len({h for entries in idx.snapshot().values() for h, _ in entries})
    got = idx.match(probe)
    expected = {iid: d for iid in idx.instances if (d := reference_depth(idx, probe, iid)) > 0}
    assert got == expected
    before = idx.snapshot()
    idx.match(probe)
    assert idx.snapshot() == before
    # every held set stays prefix-closed (what makes eviction leaves-first)
    for iid, entries in before.items():
        held = {h for h, _ in entries}
        for _, hashes in ops:
            for k, h in enumerate(hashes or ()):
                if h in held:
                    assert set(hashes[:k]) <= held, iid


def test_set_bound_trims_an_instance_to_its_kv_cache_size() -> None:
    idx = PrefixIndex(max_blocks_per_instance=100)
    idx.insert("a", chain(1, 2, 3, 4, 5, 6), now=0.0)
    idx.insert("b", chain(1, 2, 3, 4, 5, 6), now=0.0)
    idx.set_bound("a", 2)  # a rotation leaves 6 > 2: "a" forgets them all
    assert idx.blocks_held("a") == 0 and idx.blocks_held("b") == 6
    assert idx.match(chain(1, 2, 3, 4, 5, 6)) == {"b": 6}
    idx.insert("a", chain(7, 8, 9), now=1.0)  # indexed by its first block
    assert idx.blocks_held("a") == 1 and idx.match(chain(7)) == {"a": 1}
    idx.set_bound("b", 7)  # 6 fit in 7, but the young generation is over half: one rotation
    assert idx.blocks_held("b") == 6 and idx.match(chain(1, 2, 3, 4, 5, 6)) == {"b": 6}
    idx.set_bound("b", 10_000)  # never above the index's own bound
    idx.insert("b", tuple(range(1000, 1200)), now=2.0)
    assert idx.blocks_held("b") == 56  # 6 + 44 fill the young generation; it rotates; 6 more
    for t in range(10):
        idx.insert("b", tuple(range(2000 + 50 * t, 2050 + 50 * t)), now=3.0 + t)
        assert 50 <= idx.blocks_held("b") <= 100


def test_lowering_a_bound_never_keeps_an_extension_without_its_prefix() -> None:
    """Found by hypothesis in CI: the prefix was young first (its own request), its extension was
    appended after it, so cutting the array's oldest entries dropped the prefix and kept the
    extension."""
    idx = PrefixIndex(max_blocks_per_instance=3)
    short, long = chain(1), chain(1, 2)
    idx.insert("a", short, now=0.0)
    idx.insert("a", long, now=1.0)
    idx.set_bound("a", 1)
    held = {h for h, _ in idx.snapshot()["a"]}
    assert long[1] not in held or long[0] in held
    assert idx.match(long).get("a", 0) == idx.matched_depth(long, "a")


bounded_ops = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.one_of(chains, st.none(), st.integers(1, 12)),  # insert, forget, or set_bound
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=bounded_ops, cap=st.integers(1, 12), probe=chains)
def test_per_instance_bounds_hold_and_match_still_agrees(
    ops: list[tuple[str, tuple[int, ...] | int | None]], cap: int, probe: tuple[int, ...]
) -> None:
    idx = PrefixIndex(max_blocks_per_instance=cap)
    bounds: dict[str, int] = {}
    for t, (iid, op) in enumerate(ops):
        if op is None:
            idx.forget(iid)
            # every trace is gone: no match names it, no block is kept for it alone
            assert all(iid not in idx.match(h) for _, h in ops if isinstance(h, tuple) and h)
            assert len(idx) == len({h for entries in idx.snapshot().values() for h, _ in entries})
        elif isinstance(op, int):
            idx.set_bound(iid, op)
            bounds[iid] = min(op, cap)
        else:
            idx.insert(iid, op, now=float(t))
            if op:  # deeper blocks indexed under an earlier, higher bound may still be held
                half = (bounds.get(iid, cap) + 1) // 2
                assert min(len(op), half) <= idx.match(op)[iid] <= len(op)
        assert idx.blocks_held(iid) <= bounds.get(iid, cap)
    assert len(idx) == len({h for entries in idx.snapshot().values() for h, _ in entries})
    expected = {iid: d for iid in idx.instances if (d := reference_depth(idx, probe, iid)) > 0}
    assert idx.match(probe) == expected
    for iid, entries in idx.snapshot().items():  # prefix-closed after bounds changed, too
        held = {h for h, _ in entries}
        assert len(held) == len(entries) == idx.blocks_held(iid)
        for _, op in ops:
            if isinstance(op, tuple):
                for k, h in enumerate(op):
                    if h in held:
                        assert set(op[:k]) <= held, iid
