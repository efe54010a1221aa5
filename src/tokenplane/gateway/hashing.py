"""Prompt-block hashing for the request path, memoised over the prefixes requests share.

:func:`~tokenplane.core.prompt_hash.block_hashes` costs about 1.3 µs per 64-character block (a
BLAKE2b update, copy and digest), so a 5,000-character prompt costs 100 µs: more than the rest of
the gateway's own work on a request. But prompts that matter for prefix routing share long
prefixes (a system prompt, a conversation so far), and a chained hash of a shared prefix is the
same for every request. :class:`BlockHasher` remembers ``(previous chain hash, block bytes) ->
chain hash`` for recent blocks, walks a request's blocks through that memo while they hit, and on
the first miss hashes the rest exactly as ``block_hashes`` does (one bulk update of the prefix
already matched, then block by block, recording each new link).

Result: identical to ``block_hashes(text)`` (a memo key includes the previous link, so it names the
whole prefix up to a 64-bit hash collision, which the prefix index already conflates). Cost: a hit
is a 64-byte slice and a dict lookup (about 0.2 µs a block); a miss adds one dict insert to the
plain cost. Memory: at most ``max_entries`` links (about 200 bytes each), evicted oldest first.
"""

from __future__ import annotations

import hashlib
from itertools import islice

from tokenplane.core.prompt_hash import CHARS_PER_TOKEN, DEFAULT_BLOCK_TOKENS

DEFAULT_MAX_ENTRIES = 1 << 17
"""About 25 MB at most: 128 Ki links of 64 bytes (8 Mi characters of distinct prefixes)."""

_ROOT = -1  # the "previous link" of a first block; real links are >= 0 (63-bit)


class BlockHasher:
    """``hashes(text) == block_hashes(text, block_tokens)``, memoised across requests."""

    __slots__ = ("_memo", "max_entries", "size")

    def __init__(
        self, block_tokens: int = DEFAULT_BLOCK_TOKENS, max_entries: int = DEFAULT_MAX_ENTRIES
    ) -> None:
        if block_tokens <= 0:
            raise ValueError("block_tokens must be positive")
        self.size = block_tokens * CHARS_PER_TOKEN
        self.max_entries = max_entries
        self._memo: dict[tuple[int, bytes], int] = {}

    def hashes(self, text: str) -> tuple[int, ...]:
        size = self.size
        data = text.encode("utf-8", "surrogatepass")
        end = len(data) // size * size
        memo = self._memo
        get = memo.get
        out: list[int] = []
        prev = _ROOT
        pos = 0
        while pos < end:
            link = get((prev, data[pos : pos + size]))
            if link is None:
                break
            out.append(link)
            prev = link
            pos += size
        if pos == end:
            return tuple(out)
        h = hashlib.blake2b(digest_size=8)
        if pos:
            h.update(data[:pos])
        update = h.update
        copy = h.copy
        from_bytes = int.from_bytes
        while pos < end:
            block = data[pos : pos + size]
            update(block)
            link = from_bytes(copy().digest(), "big") >> 1
            memo[(prev, block)] = link
            out.append(link)
            prev = link
            pos += size
        excess = len(memo) - self.max_entries
        if excess > 0:  # oldest first (dicts keep insertion order); amortised O(1) per insert
            for key in list(islice(memo, excess)):
                del memo[key]
        return tuple(out)

    def __len__(self) -> int:
        return len(self._memo)
