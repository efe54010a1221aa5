"""An approximate, bounded index of which instance has recently seen which prompt prefix.

This is the flattened form of SGLang's cache-aware radix tree (sgl-router). Prompt blocks arrive as
a chain of hashes in which each hash covers every token before it, so a hash names a whole prefix and
the tree needs no explicit edges: a dict ``hash -> the instances that hold it`` is the tree, and
the longest cached prefix of a request on an instance is how far one can walk the request's chain
while that instance is among the holders.

Structures:

* ``_holders: dict[hash, int]`` — the shared "tree", one entry per distinct block: a bit mask of
  its holders (each instance owns one bit, reused after it is forgotten). A mask rather than a
  ``set``: an int is not tracked by the cyclic garbage collector, and the gateway's index holds up to
  ``instances × max_blocks_per_instance`` entries; as sets they made every full collection scan them
  all (about 13 ms per collection at 30,000 blocks, measured in the gateway under
  ``bench/gateway_overhead.py``), and a set costs ~200 bytes where a small int costs 28.
* ``_lru: dict[InstanceId, OrderedDict[hash, last_access]]`` — per instance, its blocks in
  least-recently-used order, with the ``now`` of the last request routed there that touched each.

Insertion (``insert``, called from a router's ``on_routed``) touches a request's blocks *deepest
first*, so every prefix is touched after its extensions: in each instance's LRU order a block is
never older than any block below it. Evicting from the LRU end (when an instance holds more than
``max_blocks_per_instance`` blocks) therefore always removes leaves first, and the set each instance
holds stays prefix-closed. A request longer than the bound is indexed by its first
``max_blocks_per_instance`` blocks only.

Matching (``match``) exploits the same property: along a request's chain the holder sets are
nested, so equal masks at both ends of a span mean one set throughout.
``match`` bisects only the spans whose end masks differ, so it costs O(log blocks) dict lookups per
depth at which some instances drop out (typically one or two: a shared system prompt, then the one
instance that saw the conversation), plus one entry per matching instance in the result; never
fleet size × blocks, nor even one lookup per block.

Cost: ``match`` O(drop-out depths × log blocks + matched instances); ``insert``
O(len(chain) + evicted); memory O(instances × ``max_blocks_per_instance``).

How it fails: it is approximate by design. It records where requests were *sent*, not what the
engines actually keep, so an engine that evicted a prefix still counts as holding it until this
index evicts it too; a restarted instance should be ``forget``-ed. A hash collision between two
chains (negligible for 64-bit hashes) could make a match a little too long or too short, never
raise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from tokenplane.core.views import InstanceId

DEFAULT_MAX_BLOCKS_PER_INSTANCE = 200_000


class PrefixIndex:
    def __init__(self, max_blocks_per_instance: int = DEFAULT_MAX_BLOCKS_PER_INSTANCE) -> None:
        if isinstance(max_blocks_per_instance, bool) or not isinstance(max_blocks_per_instance, int):
            raise TypeError("max_blocks_per_instance must be an integer")
        if max_blocks_per_instance < 1:
            raise ValueError(f"max_blocks_per_instance must be >= 1, got {max_blocks_per_instance}")
        self.max_blocks_per_instance = max_blocks_per_instance
        self._holders: dict[int, int] = {}
        self._lru: dict[InstanceId, OrderedDict[int, float]] = {}
        self._bit: dict[InstanceId, int] = {}  # an instance's bit in the holder masks
        self._ids: list[InstanceId | None] = []  # bit position -> instance (None: free)
        self._free: list[int] = []
        self._bounds: dict[InstanceId, int] = {}  # an instance's own, lower bound (set_bound)

    def _holding(self, mask: int) -> Iterator[InstanceId]:
        ids = self._ids
        while mask:
            low = mask & -mask
            iid = ids[low.bit_length() - 1]
            assert iid is not None  # a set bit always names a live instance
            yield iid
            mask ^= low

    # -- reads (never change state) ------------------------------------------------------------

    def match(self, block_hashes: Sequence[int]) -> dict[InstanceId, int]:
        """Matched prefix depth (in blocks, >= 1) per instance holding at least the first block."""
        depths: dict[InstanceId, int] = {}
        n = len(block_hashes)
        if n == 0:
            return depths
        get = self._holders.get
        first = get(block_hashes[0], 0)
        if not first:
            return depths
        last = get(block_hashes[n - 1], 0) if n > 1 else first
        if last == first:
            for iid in self._holding(first):  # the common case of one holder set all the way down
                depths[iid] = n
            return depths
        # Holder sets are nested along a chain (see the module docstring), so equal masks at both
        # ends of a span mean one set throughout: bisect only the spans whose ends differ. Each pair
        # (k, k + 1) of adjacent blocks with different holders gives the depth k + 1 of the
        # instances that drop out there.
        stack = [(0, first, n - 1, last)]
        while stack:
            lo, lo_mask, hi, hi_mask = stack.pop()
            if lo_mask == hi_mask:
                continue
            if hi == lo + 1:
                for iid in self._holding(lo_mask & ~hi_mask):
                    depths[iid] = hi
                continue
            mid = (lo + hi) // 2
            mid_mask = get(block_hashes[mid], 0)
            stack.append((mid, mid_mask, hi, hi_mask))
            stack.append((lo, lo_mask, mid, mid_mask))
        for iid in self._holding(last):
            depths[iid] = n
        return depths

    def matched_depth(self, block_hashes: Sequence[int], instance_id: InstanceId) -> int:
        """The matched prefix depth of one instance (0 when it holds none)."""
        lru = self._lru.get(instance_id)
        if lru is None:
            return 0
        depth = 0
        for h in block_hashes:
            if h not in lru:
                break
            depth += 1
        return depth

    def bound(self, instance_id: InstanceId) -> int:
        """The most blocks this index holds for the instance (:meth:`set_bound`, else the default)."""
        return self._bounds.get(instance_id, self.max_blocks_per_instance)

    def blocks_held(self, instance_id: InstanceId) -> int:
        lru = self._lru.get(instance_id)
        return 0 if lru is None else len(lru)

    @property
    def instances(self) -> list[InstanceId]:
        return list(self._lru)

    def __len__(self) -> int:
        """Distinct blocks held by at least one instance."""
        return len(self._holders)

    def snapshot(self) -> dict[InstanceId, tuple[tuple[int, float], ...]]:
        """Each instance's ``(hash, last_access)`` pairs in LRU order (oldest first); for tests."""
        return {iid: tuple(lru.items()) for iid, lru in self._lru.items()}

    # -- writes (called from on_routed / forget) -----------------------------------------------

    def insert(self, instance_id: InstanceId, block_hashes: Sequence[int], now: float) -> None:
        """Record that a request with this chain was routed to ``instance_id`` at ``now``."""
        if not block_hashes:
            return
        cap = self._bounds.get(instance_id, self.max_blocks_per_instance)
        if len(block_hashes) > cap:
            block_hashes = block_hashes[:cap]
        lru = self._lru.get(instance_id)
        if lru is None:
            lru = self._lru[instance_id] = OrderedDict()
            if self._free:  # a forgotten instance's bit
                pos = self._free.pop()
                self._ids[pos] = instance_id
            else:
                pos = len(self._ids)
                self._ids.append(instance_id)
            self._bit[instance_id] = 1 << pos
        bit = self._bit[instance_id]
        holders = self._holders
        get = holders.get
        for h in reversed(block_hashes):  # deepest first: each prefix ends up newer than its extensions
            if h in lru:
                lru.move_to_end(h)
            else:
                holders[h] = get(h, 0) | bit
            lru[h] = now
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            self._drop_holder(old, bit)

    def set_bound(self, instance_id: InstanceId, blocks: int) -> None:
        """Hold at most ``blocks`` blocks for this instance (at most ``max_blocks_per_instance``):
        its engine's KV cache size in blocks. A block the engine cannot be holding any more (it
        has room for fewer) is stale knowledge, and memory that grows with traffic until the
        default bound: with the 200,000 default, ~40 MB an instance."""
        cap = max(1, min(blocks, self.max_blocks_per_instance))
        if self._bounds.get(instance_id) == cap:
            return
        self._bounds[instance_id] = cap
        lru = self._lru.get(instance_id)
        if lru is not None and len(lru) > cap:
            bit = self._bit[instance_id]
            while len(lru) > cap:
                old, _ = lru.popitem(last=False)
                self._drop_holder(old, bit)

    def forget(self, instance_id: InstanceId) -> None:
        """Drop everything recorded for an instance (removed, restarted or drained)."""
        lru = self._lru.pop(instance_id, None)
        if lru is None:
            return
        bit = self._bit.pop(instance_id)
        for h in lru:
            self._drop_holder(h, bit)
        pos = bit.bit_length() - 1
        self._ids[pos] = None  # every mask has lost this bit: it may name another instance now
        self._free.append(pos)

    def _drop_holder(self, block: int, bit: int) -> None:
        owners = self._holders.get(block)
        if owners is None:
            return
        owners &= ~bit
        if owners:
            self._holders[block] = owners
        else:
            del self._holders[block]
