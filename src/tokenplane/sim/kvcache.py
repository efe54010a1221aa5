"""Paged KV-cache accounting with prefix caching, in the manner of vLLM's block manager.

Memory is ``total_blocks`` blocks of ``block_size`` tokens. A prompt's leading full blocks are
identified by chained hashes (each covers every token before it); a block computed by one request
is registered under its hash and can be reused by any later request whose chain matches from the
start. Registered blocks are reference counted; when the last reference goes, they stay cached
and become evictable in LRU order. Everything else a sequence holds is private.

Invariant (checked by :meth:`check`): ``free + evictable + referenced cached + private == total``.
Private blocks are tracked by the engine in aggregate (``used_private``), since decode growth is
accounted for in bulk.

Usage as vLLM reports it (``kv_cache_usage_perc``) counts blocks held by requests; cached blocks
nobody references count as free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class KVCache:
    __slots__ = (
        "block_size",
        "entries",
        "evictable",
        "free",
        "lru",
        "prefix_caching",
        "referenced_cached",
        "total_blocks",
        "used_private",
    )

    def __init__(self, total_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        if total_blocks <= 0 or block_size <= 0:
            raise ValueError("total_blocks and block_size must be positive")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.free = total_blocks
        # hash -> [refcount, nblocks]
        self.entries: dict[int, list[int]] = {}
        self.lru: OrderedDict[int, int] = OrderedDict()  # unreferenced entries: hash -> nblocks
        self.evictable = 0
        self.referenced_cached = 0
        self.used_private = 0

    # -- queries -------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        return self.free + self.evictable

    @property
    def usage(self) -> float:
        return (self.total_blocks - self.free - self.evictable) / self.total_blocks

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """Number of leading ``hashes`` (at most ``limit``) that are cached."""
        if not self.prefix_caching:
            return 0
        entries = self.entries
        n = 0
        for h in hashes:
            if n >= limit or h not in entries:
                break
            n += 1
        return n

    # -- private blocks ------------------------------------------------------------------------
    def allocate(self, n: int) -> bool:
        """Take ``n`` private blocks, evicting LRU cached blocks if needed; False if impossible."""
        if n <= 0:
            return True
        if n > self.free + self.evictable:
            return False
        if n > self.free:
            self._evict(n - self.free)
        self.free -= n
        self.used_private += n
        return True

    def release_private(self, n: int) -> None:
        if n:
            self.used_private -= n
            self.free += n

    def _evict(self, need: int) -> None:
        lru, entries = self.lru, self.entries
        freed = 0
        while freed < need:
            h, nb = lru.popitem(last=False)
            del entries[h]
            freed += nb
        self.evictable -= freed
        self.free += freed

    # -- cached (shared) blocks ----------------------------------------------------------------
    def acquire(self, hashes: Sequence[int]) -> None:
        """Add a reference to each (already cached) hash."""
        entries, lru = self.entries, self.lru
        for h in hashes:
            e = entries[h]
            if e[0] == 0:
                del lru[h]
                self.evictable -= e[1]
                self.referenced_cached += e[1]
            e[0] += 1

    def release(self, hashes: Sequence[int]) -> None:
        """Drop a reference to each hash; unreferenced ones become evictable, most recent last."""
        entries, lru = self.entries, self.lru
        # Release deepest first so that, among one chain, the leading blocks (shared by more
        # requests) are the last to be evicted.
        for h in reversed(hashes):
            e = entries[h]
            e[0] -= 1
            if e[0] == 0:
                lru[h] = e[1]
                self.evictable += e[1]
                self.referenced_cached -= e[1]

    def park(self, hashes: Sequence[int]) -> None:
        """Turn one free block per hash (not already cached) into a cached, unreferenced entry:
        the full blocks a preempted sequence computed, freed deepest first as vLLM frees them."""
        entries, lru = self.entries, self.lru
        n = 0
        for h in reversed(hashes):
            if h not in entries:
                entries[h] = [0, 1]
                lru[h] = 1
                n += 1
        self.free -= n
        self.evictable += n

    def register(self, h: int, nblocks: int) -> None:
        """Turn ``nblocks`` private blocks holding hash ``h`` into a cached, referenced entry.

        If another request registered the same content meanwhile, reference that entry and free
        the duplicate.
        """
        if not self.prefix_caching:
            return
        e = self.entries.get(h)
        self.used_private -= nblocks
        if e is None:
            self.entries[h] = [1, nblocks]
            self.referenced_cached += nblocks
            return
        self.free += nblocks
        if e[0] == 0:
            del self.lru[h]
            self.evictable -= e[1]
            self.referenced_cached += e[1]
        e[0] += 1

    def check(self) -> None:
        """Raise AssertionError-free ValueError if the accounting does not add up."""
        ref = sum(nb for rc, nb in self.entries.values() if rc > 0)
        ev = sum(nb for rc, nb in self.entries.values() if rc == 0)
        if ref != self.referenced_cached or ev != self.evictable or ev != sum(self.lru.values()):
            raise ValueError(f"cached-block accounting drifted: ref={ref}/{self.referenced_cached} ev={ev}")
        total = self.free + self.evictable + self.referenced_cached + self.used_private
        if total != self.total_blocks or min(self.free, self.used_private) < 0:
            raise ValueError(
                f"blocks leaked: free={self.free} evictable={self.evictable} "
                f"cached={self.referenced_cached} private={self.used_private} total={self.total_blocks}"
            )
