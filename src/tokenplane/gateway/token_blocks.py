"""A prompt's token ids and their chain keys (:func:`~tokenplane.gateway.kv_events.chain_keys`),
computed once per request and block size, and for a prompt that extends a tokenized one (the next
turn of a conversation, from the tokenizer's prefix cache) only past the blocks that one already
keyed: the parent-key chain goes on from its last full block inside the shared prefix.

Exactness: a block's key covers its tokens and, through its parent, every token before it, so the
first ``len(prefix) // block_size`` keys of any prompt that starts with ``prefix`` are the prefix's
own; the rest are chained from the last of them as :func:`chain_keys` would.

Memory: the keys are shared with the prefix cache's entry for the next turn (about
``len(ids) / block_size`` ints, some 2-3 bytes per token at block size 16, on top of the cache's
4 bytes of ids per token); a request holds its seed's keys only until it computes its own.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from tokenplane.gateway.kv_events import content_key

KeySpec = tuple[int, int | None]  # (block size, LoRA id)
Keys = dict[KeySpec, list[int]]


class TokenBlocks:
    __slots__ = ("_seed", "_seed_len", "hashed", "ids", "known")

    def __init__(self, ids: Sequence[int], seed: Keys | None = None, seed_len: int = 0) -> None:
        self.ids = ids
        # keys computed for this prompt, per spec; shared with the cache entry it leaves behind
        self.known: Keys = {}
        self._seed = seed  # keys of an earlier prompt whose first ``seed_len`` ids this one starts with
        self._seed_len = seed_len
        self.hashed = 0  # blocks this prompt hashed itself (all specs)

    def keys(self, block_size: int, lora_id: int | None = None) -> list[int]:
        """:func:`~tokenplane.gateway.kv_events.chain_keys` of ``ids``, hashing only new blocks."""
        spec = (block_size, lora_id)
        keys = self.known.get(spec)
        if keys is not None:
            return keys
        ids = self.ids
        seed = self._seed.get(spec) if self._seed else None
        done = min(len(seed), self._seed_len // block_size) if seed else 0
        keys = seed[:done] if seed else []
        parent = keys[-1] if keys else None
        # the ids still to key, as one list: a block's tuple is built from a list slice (the
        # ints already boxed) rather than from an ``array`` slice (a new array, then each id boxed)
        rest = ids[done * block_size :]
        todo: list[int] = rest.tolist() if isinstance(rest, array) else list(rest)
        for start in range(0, len(todo) - block_size + 1, block_size):
            parent = content_key(parent, todo[start : start + block_size], lora_id)
            keys.append(parent)
        self.hashed += len(keys) - done
        self.known[spec] = keys
        if self._seed is not None and self._seed.keys() <= self.known.keys():
            self._seed = None  # every spec the seed had is taken: let it go
        return keys
