"""A memo of answers per ``Authorization`` header that holds no header (nor any key in one).

A client sends the same header on every request, and what the gateway derives from it (the tenant
behind the key, the key's quota id) costs a SHA-256 each time; so the answer is remembered per
header. The header itself is not kept: an entry is filed under a keyed 128-bit tag, two of
Python's own string hashes (SipHash, keyed per process), of the header and of a random
per-process salt followed by the header. A lookup compares tags only (which an attacker cannot
steer byte by byte), and a guess has to match both halves of a remembered header's tag (a chance
of about 2**-128 per entry) to get its answer.

Bounded: at most ``limit`` headers; the one put past that starts the memo over (no order to keep
per hit, and a flood of distinct headers costs one clear per ``limit`` of them).

Staleness: the memo answers what was put, until it is cleared or starts over; it does not know
when an answer stops being true. An owner whose answers can change must :meth:`HeaderMemo.clear`
it when they may have (the authenticator does on a revocation: which headers carried the revoked
key is not known, none being kept); an owner whose answers cannot (a digest of the header) never
needs to. A config reload builds a new authenticator, and with it a new, empty memo.
"""

from __future__ import annotations

import os
from typing import Generic, TypeVar

V = TypeVar("V")


class HeaderMemo(Generic[V]):
    """Answers per header, by keyed tag (see the module docstring); at most ``limit`` of them."""

    __slots__ = ("_entries", "_salt", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a header memo holds at least one header, not {limit}")
        self.limit = limit
        # hash(header) -> (hash(salt + header), its answer)
        self._entries: dict[int, tuple[int, V]] = {}
        self._salt = os.urandom(16).hex()

    def get(self, header: str) -> V | None:
        """The answer put for ``header`` since the last clear, or None."""
        known = self._entries.get(hash(header))
        if known is not None and known[0] == hash(self._salt + header):
            return known[1]
        return None

    def put(self, header: str, answer: V) -> None:
        """Remember ``answer`` for ``header`` (starting over first when full)."""
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[hash(header)] = (hash(self._salt + header), answer)

    def clear(self) -> None:
        """Forget every answer (when any of them may no longer be true)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
