"""The shared prefix index: longest-prefix matching, LRU leaves-first eviction, bounds, forget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.routing.prefix_index import PrefixIndex


def chain(*blocks: int) -> tuple[int, ...]:
    """Chained hashes: each covers every block before it (as the shells compute them)."""
    out, h = [], 0
    for b in blocks:
        h = hash((h, b))
        out.append(h)
    return tuple(out)


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


def test_eviction_removes_leaves_first_and_respects_the_bound() -> None:
    idx = PrefixIndex(max_blocks_per_instance=4)
    old = chain(1, 2, 3)
    idx.insert("x", old, now=1.0)
    new = chain(1, 5, 6)
    idx.insert("x", new, now=2.0)  # 5 distinct blocks -> evict the LRU leaf of `old`
    assert idx.blocks_held("x") == 4
    assert idx.match(old) == {"x": 2}
    assert idx.match(new) == {"x": 3}
    idx.insert("x", chain(7, 8, 9, 10), now=3.0)
    assert idx.blocks_held("x") == 4
    assert idx.match(new) == {}
    assert idx.match(chain(7, 8, 9, 10)) == {"x": 4}


def test_long_request_is_truncated_to_the_bound() -> None:
    idx = PrefixIndex(max_blocks_per_instance=3)
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


def test_last_access_is_recorded() -> None:
    idx = PrefixIndex()
    idx.insert("x", chain(1, 2), now=1.0)
    idx.insert("x", chain(1, 3), now=5.0)
    snap = dict(idx.snapshot()["x"])
    assert sorted(snap.values()) == [1.0, 5.0, 5.0]


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
    idx.set_bound("a", 2)
    assert idx.blocks_held("a") == 2 and idx.blocks_held("b") == 6
    assert idx.match(chain(1, 2, 3, 4, 5, 6)) == {"a": 2, "b": 6}  # "a" kept the shallow prefix
    idx.insert("a", chain(7, 8, 9), now=1.0)
    assert idx.blocks_held("a") == 2
    idx.set_bound("b", 10_000)  # never above the index's own bound
    idx.insert("b", tuple(range(1000, 1200)), now=2.0)
    assert idx.blocks_held("b") == 100


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
        elif isinstance(op, int):
            idx.set_bound(iid, op)
            bounds[iid] = min(op, cap)
        else:
            idx.insert(iid, op, now=float(t))
        assert idx.blocks_held(iid) <= bounds.get(iid, cap)
    assert len(idx) == len({h for entries in idx.snapshot().values() for h, _ in entries})
    expected = {iid: d for iid in idx.instances if (d := reference_depth(idx, probe, iid)) > 0}
    assert idx.match(probe) == expected
