from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tokenplane.sim.kvcache import KVCache


def test_rejects_non_positive_sizes() -> None:
    with pytest.raises(ValueError):
        KVCache(0, 16)
    with pytest.raises(ValueError):
        KVCache(4, 0)


def test_allocate_and_release_private() -> None:
    kv = KVCache(10, 16)
    assert kv.allocate(0) and kv.allocate(-3)  # no-ops
    assert kv.allocate(4)
    assert (kv.free, kv.used_private, kv.available) == (6, 4, 6)
    assert kv.usage == pytest.approx(0.4)
    assert not kv.allocate(7)  # more than available: refused, nothing changes
    assert (kv.free, kv.used_private) == (6, 4)
    assert kv.allocate(6)
    assert kv.available == 0 and kv.usage == 1.0
    kv.release_private(10)
    kv.release_private(0)
    assert (kv.free, kv.used_private) == (10, 0)
    kv.check()


def _cache_entry(kv: KVCache, h: int, nblocks: int) -> None:
    """Compute ``nblocks`` privately, register them as ``h``, then drop the reference."""
    assert kv.allocate(nblocks)
    kv.register(h, nblocks)
    kv.release([h])


def test_register_then_release_makes_blocks_evictable_and_not_used() -> None:
    kv = KVCache(10, 16)
    assert kv.allocate(3)
    kv.register(7, 2)
    assert (kv.used_private, kv.referenced_cached, kv.evictable) == (1, 2, 0)
    assert kv.usage == pytest.approx(0.3)
    kv.release([7])
    assert (kv.referenced_cached, kv.evictable, kv.free) == (0, 2, 7)
    # usage (vLLM's kv_cache_usage_perc) counts only what requests hold
    assert kv.usage == pytest.approx(0.1)
    assert kv.available == 9
    assert kv.match([7, 8], limit=5) == 1
    kv.check()


def test_eviction_is_lru_over_whole_entries() -> None:
    kv = KVCache(6, 16)
    _cache_entry(kv, 1, 2)
    _cache_entry(kv, 2, 2)
    _cache_entry(kv, 3, 1)
    assert (kv.free, kv.evictable) == (1, 5)
    assert kv.allocate(2)  # needs one block beyond free: evicts the oldest entry (2 blocks)
    assert list(kv.lru) == [2, 3]
    assert 1 not in kv.entries
    assert (kv.free, kv.evictable, kv.used_private) == (1, 3, 2)
    assert kv.allocate(3)  # evicts entry 2 only: it frees enough
    assert list(kv.lru) == [3]
    assert (kv.free, kv.evictable, kv.used_private) == (0, 1, 5)
    assert kv.allocate(1)  # evicts 3
    assert kv.lru == {} and kv.entries == {}
    assert (kv.free, kv.evictable, kv.used_private) == (0, 0, 6)
    kv.check()


def test_acquire_refreshes_nothing_but_moves_entry_out_of_lru() -> None:
    kv = KVCache(6, 16)
    _cache_entry(kv, 1, 2)
    _cache_entry(kv, 2, 2)
    kv.acquire([1])  # referenced: no longer evictable
    assert list(kv.lru) == [2]
    assert (kv.evictable, kv.referenced_cached) == (2, 2)
    assert kv.usage == pytest.approx(2 / 6)
    kv.acquire([1])
    assert kv.entries[1][0] == 2
    assert kv.allocate(4)  # 2 free + entry 2 evicted
    assert 2 not in kv.entries and 1 in kv.entries
    assert not kv.allocate(1)  # entry 1 is referenced and cannot be evicted
    kv.release([1])
    assert kv.evictable == 0  # still one reference
    kv.release([1])
    assert list(kv.lru) == [1] and kv.evictable == 2
    kv.check()


def test_release_puts_deepest_block_first_in_lru() -> None:
    kv = KVCache(8, 16)
    assert kv.allocate(3)
    for h in (10, 11, 12):
        kv.register(h, 1)
    kv.release([10, 11, 12])
    # the chain's head is shared by the most requests: it is evicted last
    assert list(kv.lru) == [12, 11, 10]
    assert kv.allocate(6)  # 5 free + evict 12
    assert list(kv.lru) == [11, 10]
    kv.check()


def test_release_order_is_most_recent_last() -> None:
    kv = KVCache(8, 16)
    _cache_entry(kv, 1, 1)
    _cache_entry(kv, 2, 1)
    kv.acquire([1])
    kv.release([1])  # 1 is now the most recently used
    assert list(kv.lru) == [2, 1]


def test_register_duplicate_frees_the_duplicate_and_shares_the_entry() -> None:
    kv = KVCache(10, 16)
    assert kv.allocate(2)
    assert kv.allocate(2)
    kv.register(5, 2)
    kv.register(5, 2)  # a second request computed the same content meanwhile
    assert kv.entries[5] == [2, 2]
    assert (kv.used_private, kv.referenced_cached, kv.free) == (0, 2, 8)
    kv.check()
    kv.release([5])
    kv.release([5])
    assert (kv.evictable, kv.free) == (2, 8)
    kv.check()


def test_register_duplicate_of_evictable_entry_revives_it() -> None:
    kv = KVCache(10, 16)
    _cache_entry(kv, 5, 2)
    assert kv.allocate(2)
    kv.register(5, 2)
    assert kv.lru == {}
    assert kv.entries[5] == [1, 2]
    assert (kv.evictable, kv.referenced_cached, kv.used_private, kv.free) == (0, 2, 0, 8)
    kv.check()


def test_match_respects_limit_order_and_prefix_caching_flag() -> None:
    kv = KVCache(10, 16)
    for h in (1, 2, 3):
        _cache_entry(kv, h, 1)
    assert kv.match([1, 2, 3, 4], limit=10) == 3
    assert kv.match([1, 2, 3], limit=2) == 2
    assert kv.match([1, 9, 3], limit=10) == 1  # a chain matches only from its start
    assert kv.match([9, 1], limit=10) == 0
    assert kv.match([], limit=10) == 0
    off = KVCache(10, 16, prefix_caching=False)
    assert off.allocate(2)
    off.register(1, 2)  # ignored: the blocks stay private
    assert off.entries == {} and off.used_private == 2
    assert off.match([1], limit=10) == 0
    off.check()


def test_check_detects_drift() -> None:
    kv = KVCache(4, 16)
    assert kv.allocate(1)
    kv.used_private += 1
    with pytest.raises(ValueError, match="leaked"):
        kv.check()
    kv = KVCache(4, 16)
    _cache_entry(kv, 1, 1)
    kv.evictable += 1
    with pytest.raises(ValueError, match="drifted"):
        kv.check()


class KVMachine(RuleBasedStateMachine):
    """Random legal sequences of operations, as an engine would issue them."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCache(24, 16)
        self.private = 0  # private blocks we hold
        self.refs: list[int] = []  # one entry per reference we hold

    @rule(n=st.integers(0, 30))
    def allocate(self, n: int) -> None:
        before = self.kv.available
        ok = self.kv.allocate(n)
        assert ok == (n <= before)
        if ok:
            self.private += max(n, 0)
            assert self.kv.available == before - max(n, 0)

    @precondition(lambda self: self.private > 0)
    @rule(data=st.data())
    def release_private(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, self.private))
        self.kv.release_private(n)
        self.private -= n

    @precondition(lambda self: self.private > 0)
    @rule(h=st.integers(0, 7), data=st.data())
    def register(self, h: int, data: st.DataObject) -> None:
        nb = data.draw(st.integers(1, min(self.private, 3)))
        self.kv.register(h, nb)
        self.private -= nb
        self.refs.append(h)

    @rule(data=st.data())
    def acquire_match(self, data: st.DataObject) -> None:
        chain = data.draw(st.lists(st.integers(0, 7), max_size=4))
        n = self.kv.match(chain, limit=data.draw(st.integers(0, 4)))
        assert all(h in self.kv.entries for h in chain[:n])
        self.kv.acquire(chain[:n])
        self.refs.extend(chain[:n])

    @precondition(lambda self: bool(self.refs))
    @rule(data=st.data())
    def release_refs(self, data: st.DataObject) -> None:
        k = data.draw(st.integers(1, len(self.refs)))
        picked = [self.refs.pop(data.draw(st.integers(0, len(self.refs) - 1))) for _ in range(k)]
        self.kv.release(picked)

    @invariant()
    def accounting_holds(self) -> None:
        kv = self.kv
        kv.check()
        assert kv.available >= 0 and kv.free >= 0 and kv.evictable >= 0
        assert kv.used_private == self.private
        assert 0.0 <= kv.usage <= 1.0
        held = sum(kv.entries[h][1] for h in set(self.refs))
        assert kv.referenced_cached == held
        for h in set(self.refs):
            assert kv.entries[h][0] == self.refs.count(h)

    def teardown(self) -> None:
        kv = self.kv
        kv.release_private(self.private)
        kv.release(self.refs)
        kv.check()
        assert kv.used_private == 0 and kv.referenced_cached == 0
        assert kv.free + kv.evictable == kv.total_blocks
        assert kv.usage == 0.0
        assert kv.allocate(kv.total_blocks)  # everything cached is reclaimable
        assert kv.entries == {} and kv.evictable == 0


KVMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)
TestKVMachine = KVMachine.TestCase


def test_park_caches_free_blocks_deepest_first_and_skips_known_hashes() -> None:
    kv = KVCache(6, 16)
    _cache_entry(kv, 9, 1)  # an older cached entry: evicted before the parked ones
    kv.park([1, 2, 3, 9])  # 9 is already cached: no block for it
    assert (kv.free, kv.evictable, kv.usage) == (2, 4, 0.0)
    assert list(kv.lru) == [9, 3, 2, 1]  # a preempted sequence's leading block is evicted last
    assert kv.match([1, 2, 3], 3) == 3
    kv.check()
    kv.park([])
    kv.check()
