"""An approximate, bounded index of which instance has recently seen which prompt prefix.

This is the flattened form of SGLang's cache-aware radix tree (sgl-router). Prompt blocks arrive as
a chain of hashes in which each hash covers every token before it, so a hash names a whole prefix and
the tree needs no explicit edges: a dict ``hash -> the instances that hold it`` is the tree, and
the longest cached prefix of a request on an instance is how far one can walk the request's chain
while that instance is among the holders.

Structures:

* ``_holders: dict[hash, int]`` — the shared "tree", one entry per distinct block: a bit mask of
  its holders. Each instance owns a *pair* of bits (reused after it is forgotten), one per
  generation (below); it holds a block when either of its bits is set. A mask rather than a
  ``set``: an int is not tracked by the cyclic garbage collector and costs nothing for masks up to
  256 (CPython shares those objects), where a set costs ~200 bytes.
* per instance, a :class:`_Generations`: the hashes it added in its *young* generation (an
  append-only ``array('q')``: 8 bytes a hash, and no reference to the caller's int object, which
  would keep a second 40-byte copy of every hash another instance created alive; a list for a chain
  with hashes outside 64 bits), the same for its *old* generation, which bit of its pair marks the
  young one, and how many blocks it holds.

Eviction is a two-generation approximation of LRU (the "clock"/segmented-LRU family), chosen for its
memory: a per-instance ``OrderedDict`` costs ~100 bytes per entry more than an array slot (8 bytes).
Touching a block that is not in the young generation (new, or only in the old one) sets its young
bit, clears its old bit and appends it to the young list. When the young list reaches half the
instance's bound, the generation *rotates*: every block of the old list whose old bit is still set
(not touched since) is dropped, the young list becomes the old one, and the two bits swap roles.
So an instance holds exactly the blocks touched since the start of its previous generation:

* it never holds more than its bound ``B``: the young list rotates at ⌈B/2⌉ entries, and a
  rotation also runs before a new block would make it hold more than ``B`` (odd ``B``). Once traffic
  has filled it, it holds between about B/2 (just after a rotation) and ``B`` blocks (about ¾ B on
  average): the price of not keeping an exact order;
* a request's chain is indexed by its first ⌈B/2⌉ blocks, so one insert never triggers two
  rotations that would drop what it just touched: after ``insert(i, chain)``, ``match(chain)[i]``
  is ``min(len(chain), ⌈B/2⌉)``;
* eviction is prefix-closed. ``insert`` touches a request's blocks *deepest first* (the first ⌈B/2⌉
  blocks of a longer chain: a prefix), so every prefix is touched no earlier than any of its
  extensions, in every insert. An instance's held set is {blocks last touched at or after an
  instant t} (the start of its old generation; a rotation only moves t forward, and
  ``set_bound`` rotates or empties the instance), and if an extension's last touch is ≥ t, so is
  its prefix's. Hence the set each instance holds is prefix-closed, after any sequence of inserts,
  rotations, ``set_bound`` and ``forget``. (A generation's array is in *first*-touch order, not
  last-touch order: a prefix already young when an extension is appended is not appended again. So
  no cut of an array by position is prefix-closed, which is why ``set_bound`` never cuts one.)

Matching (``match``) exploits the same property: along a request's chain the holder *sets* (each
mask with an instance's two bits folded into one) are nested, so equal sets at both ends of a span
mean one set throughout. ``match`` bisects only the spans whose end sets differ, so it costs
O(log blocks) dict lookups per depth at which some instances drop out (typically one or two: a
shared system prompt, then the one instance that saw the conversation), plus one entry per matching
instance in the result; never fleet size × blocks, nor even one lookup per block.

Cost: ``match`` O(drop-out depths × log blocks + matched instances); ``insert``
O(len(chain)) amortised (a rotation walks the old list once per ⌈B/2⌉ additions); memory
O(instances × ``max_blocks_per_instance``): one dict entry and key per distinct block plus one array
slot per (instance, block), two while a block touched again sits in both generations' arrays.

How it fails: it is approximate by design. It records where requests were *sent*, not what the
engines actually keep, so an engine that evicted a prefix still counts as holding it until this
index evicts it too; a restarted instance should be ``forget``-ed. Its eviction is coarser than
LRU: a block touched once just before a rotation outlives one touched often a little earlier, and
an instance may hold as little as half its bound (nothing, after ``set_bound`` lowers it below what
its last generation touched).
A hash collision between two chains (negligible for 64-bit hashes) could make a match a little too
long or too short, never raise.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

from tokenplane.core.views import InstanceId

DEFAULT_MAX_BLOCKS_PER_INSTANCE = 200_000


class _Generations:
    """One instance's two generations (see the module docstring)."""

    def __init__(self, pair_bit: int) -> None:
        self.young: array[int] | list[int] = array("q")
        self.old: array[int] | list[int] = array("q")
        self.young_bit = pair_bit
        self.old_bit = pair_bit << 1
        self.held = 0


class PrefixIndex:
    def __init__(self, max_blocks_per_instance: int = DEFAULT_MAX_BLOCKS_PER_INSTANCE) -> None:
        if isinstance(max_blocks_per_instance, bool) or not isinstance(max_blocks_per_instance, int):
            raise TypeError("max_blocks_per_instance must be an integer")
        if max_blocks_per_instance < 1:
            raise ValueError(f"max_blocks_per_instance must be >= 1, got {max_blocks_per_instance}")
        self.max_blocks_per_instance = max_blocks_per_instance
        self._holders: dict[int, int] = {}
        self._gens: dict[InstanceId, _Generations] = {}
        self._ids: list[InstanceId | None] = []  # pair position -> instance (None: free)
        self._free: list[int] = []
        self._low = 0  # the low bit of every pair in use: folds a mask into one bit per instance
        self._bounds: dict[InstanceId, int] = {}  # an instance's own, lower bound (set_bound)

    def _holding(self, folded: int) -> Iterator[InstanceId]:
        ids = self._ids
        while folded:
            low = folded & -folded
            iid = ids[(low.bit_length() - 1) >> 1]
            assert iid is not None  # a set bit always names a live instance
            yield iid
            folded ^= low

    # -- reads (never change state) ------------------------------------------------------------

    def match(self, block_hashes: Sequence[int]) -> dict[InstanceId, int]:
        """Matched prefix depth (in blocks, >= 1) per instance holding at least the first block."""
        depths: dict[InstanceId, int] = {}
        n = len(block_hashes)
        if n == 0:
            return depths
        get = self._holders.get
        low = self._low
        first = get(block_hashes[0], 0)
        if not first:
            return depths
        first = (first | first >> 1) & low
        if n > 1:
            last = get(block_hashes[n - 1], 0)
            last = (last | last >> 1) & low
        else:
            last = first
        if last == first:
            for iid in self._holding(first):  # the common case of one holder set all the way down
                depths[iid] = n
            return depths
        # Holder sets are nested along a chain (see the module docstring), so equal sets at both
        # ends of a span mean one set throughout: bisect only the spans whose ends differ. Each pair
        # (k, k + 1) of adjacent blocks with different holders gives the depth k + 1 of the
        # instances that drop out there.
        stack = [(0, first, n - 1, last)]
        while stack:
            lo, lo_set, hi, hi_set = stack.pop()
            if lo_set == hi_set:
                continue
            if hi == lo + 1:
                for iid in self._holding(lo_set & ~hi_set):
                    depths[iid] = hi
                continue
            mid = (lo + hi) // 2
            mid_set = get(block_hashes[mid], 0)
            mid_set = (mid_set | mid_set >> 1) & low
            stack.append((mid, mid_set, hi, hi_set))
            stack.append((lo, lo_set, mid, mid_set))
        for iid in self._holding(last):
            depths[iid] = n
        return depths

    def matched_depth(self, block_hashes: Sequence[int], instance_id: InstanceId) -> int:
        """The matched prefix depth of one instance (0 when it holds none)."""
        gens = self._gens.get(instance_id)
        if gens is None:
            return 0
        pair = gens.young_bit | gens.old_bit
        get = self._holders.get
        depth = 0
        for h in block_hashes:
            if not get(h, 0) & pair:
                break
            depth += 1
        return depth

    def bound(self, instance_id: InstanceId) -> int:
        """The most blocks this index holds for the instance (:meth:`set_bound`, else the default)."""
        return self._bounds.get(instance_id, self.max_blocks_per_instance)

    def blocks_held(self, instance_id: InstanceId) -> int:
        gens = self._gens.get(instance_id)
        return 0 if gens is None else gens.held

    @property
    def instances(self) -> list[InstanceId]:
        return list(self._gens)

    def __len__(self) -> int:
        """Distinct blocks held by at least one instance."""
        return len(self._holders)

    def snapshot(self) -> dict[InstanceId, tuple[tuple[int, int], ...]]:
        """Each instance's ``(hash, generation)`` pairs (1: old, 0: young), old generation first, each
        in the order first touched in it; for tests."""
        get = self._holders.get
        out: dict[InstanceId, tuple[tuple[int, int], ...]] = {}
        for iid, g in self._gens.items():
            old = tuple((h, 1) for h in g.old if get(h, 0) & g.old_bit)
            out[iid] = old + tuple((h, 0) for h in g.young)
        return out

    # -- writes (called from on_routed / forget) -----------------------------------------------

    def insert(self, instance_id: InstanceId, block_hashes: Sequence[int], now: float) -> None:
        """Record that a request with this chain was routed to ``instance_id`` at ``now`` (the
        generations order touches by call order; ``now`` is accepted for the routers' interface)."""
        if not block_hashes:
            return
        cap = self._bounds.get(instance_id, self.max_blocks_per_instance)
        half = (cap + 1) >> 1
        if len(block_hashes) > half:
            block_hashes = block_hashes[:half]
        gens = self._gens.get(instance_id)
        if gens is None:
            gens = self._add(instance_id)
        holders = self._holders
        get = holders.get
        young = gens.young
        young_bit = gens.young_bit
        for h in reversed(block_hashes):  # deepest first: each prefix is touched after its extensions
            mask = get(h, 0)
            if mask & young_bit:
                continue
            if len(young) >= half or gens.held >= cap:
                while len(gens.young) >= half or gens.held >= cap:
                    self._rotate(gens)
                young = gens.young
                young_bit = gens.young_bit
                mask = get(h, 0)
            if mask & gens.old_bit:  # touched again: from the old generation to the young one
                holders[h] = mask ^ gens.old_bit | young_bit
            else:
                holders[h] = mask | young_bit
                gens.held += 1
            try:
                young.append(h)
            except OverflowError:  # not a 64-bit hash: this generation keeps a list
                young = gens.young = [*young, h]

    def _add(self, instance_id: InstanceId) -> _Generations:
        if self._free:  # a forgotten instance's pair
            pos = self._free.pop()
            self._ids[pos] = instance_id
        else:
            pos = len(self._ids)
            self._ids.append(instance_id)
        self._low |= 1 << (2 * pos)
        gens = self._gens[instance_id] = _Generations(1 << (2 * pos))
        return gens

    def _rotate(self, gens: _Generations) -> None:
        """Drop the old generation's untouched blocks; the young generation becomes the old one."""
        holders = self._holders
        get = holders.get
        old_bit = gens.old_bit
        dropped = 0
        for h in gens.old:
            mask = get(h, 0)
            if mask & old_bit:
                dropped += 1
                mask ^= old_bit
                if mask:
                    holders[h] = mask
                else:
                    del holders[h]
        gens.held -= dropped
        gens.old = gens.young
        gens.young = array("q")
        gens.young_bit, gens.old_bit = old_bit, gens.young_bit

    def set_bound(self, instance_id: InstanceId, blocks: int) -> None:
        """Hold at most ``blocks`` blocks for this instance (at most ``max_blocks_per_instance``):
        its engine's KV cache size in blocks. A block the engine cannot be holding any more (it
        has room for fewer) is stale knowledge, and memory that grows with traffic until the
        default bound. Lowering a bound rotates the instance's generations once; if it still holds
        too many, it forgets them all. Keeping "the most recent part" instead would need the order
        of *last* touches, which the arrays do not keep (module docstring): any cut by position can
        keep an extension without its prefix. Bounds change rarely (an engine's KV cache size is
        learned once), so the index refills within one generation."""
        cap = max(1, min(blocks, self.max_blocks_per_instance))
        if self._bounds.get(instance_id) == cap:
            return
        self._bounds[instance_id] = cap
        gens = self._gens.get(instance_id)
        if gens is None or (gens.held <= cap and len(gens.young) <= (cap + 1) >> 1):
            return
        self._rotate(gens)  # the young generation becomes the old one: only old blocks are dropped
        if gens.held > cap:
            self._rotate(gens)  # the (empty) young one becomes old: every block goes

    def forget(self, instance_id: InstanceId) -> None:
        """Drop everything recorded for an instance (removed, restarted or drained)."""
        gens = self._gens.pop(instance_id, None)
        if gens is None:
            return
        pair = gens.young_bit | gens.old_bit
        holders = self._holders
        get = holders.get
        for blocks in (gens.old, gens.young):
            for h in blocks:
                mask = get(h, 0)
                if mask & pair:
                    mask &= ~pair
                    if mask:
                        holders[h] = mask
                    else:
                        del holders[h]
        pos = (min(gens.young_bit, gens.old_bit).bit_length() - 1) >> 1
        self._low &= ~(1 << (2 * pos))
        self._ids[pos] = None  # every mask has lost this pair: it may name another instance now
        self._free.append(pos)
