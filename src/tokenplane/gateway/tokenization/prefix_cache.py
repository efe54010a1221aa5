"""A bounded cache of tokenized conversation prefixes, so a growing conversation re-tokenizes only
its new turn.

Key: the digest chain of a request's messages (``digest_k`` covers messages ``0..k-1`` and
everything else the template is rendered with). Value: a prefix of the rendered text that ends
right after an added token (``<|im_start|>``, ``<|im_end|>``...), and its token ids. Why there: a
tokenizer extracts added tokens before it splits and merges anything else, so the text after one
is tokenized independently of the text before it. Only the rest of the next turn's text is
tokenized, behind the same added token as an anchor (so a pre-tokenizer that treats the start of a
string specially sees what it sees in the full text). Where the template renders message by
message (:class:`~.chat_template.SplitTemplate`) the next turn renders only its new messages, after
the entry's ``rest`` (the text its messages end with after the anchor); else it renders the whole
conversation and uses the entry if that text still starts with the entry's (``startswith``, so a
template that renders earlier turns differently only loses the reuse).

Bound: ``max_entries`` conversations and ``max_tokens`` token ids in all (4 bytes each, in
``array('i')``), least recently used dropped first. The defaults (4,096 entries, 4 Mi tokens) hold
about 16 MB of ids plus the texts (about 4 characters per token, so up to ~32 MB more as str).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenplane.gateway.token_blocks import Keys

DEFAULT_CACHE_ENTRIES = 4096
DEFAULT_CACHE_TOKENS = 4 * 1024 * 1024


class CachedPrefix:
    __slots__ = ("anchor", "anchor_id", "ids", "keys", "rest", "text")

    def __init__(
        self,
        text: str,
        ids: array[int],
        anchor: str,
        anchor_id: int,
        rest: str = "",
        keys: Keys | None = None,
    ) -> None:
        # the rendered prefix, ending right after ``anchor`` (kept where the whole conversation is
        # rendered, to check that it still starts so; "" where the template renders per message)
        self.text = text
        self.ids = ids  # the token ids through ``anchor``
        self.anchor = anchor  # the added token's text the prefix ends with
        self.anchor_id = anchor_id
        self.rest = rest  # the rendered text after ``anchor`` that the entry's messages end with
        # block keys of a prompt that starts with ``ids`` (filled when that request was matched)
        self.keys = keys


class PrefixCache:
    """LRU over :class:`CachedPrefix` entries, bounded in entries and in token ids."""

    __slots__ = ("_entries", "hits", "max_entries", "max_tokens", "misses", "tokens")

    def __init__(
        self, max_entries: int = DEFAULT_CACHE_ENTRIES, max_tokens: int = DEFAULT_CACHE_TOKENS
    ) -> None:
        if max_entries < 0 or max_tokens < 0:
            raise ValueError("cache bounds must be >= 0")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[Hashable, CachedPrefix] = OrderedDict()
        self.tokens = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> CachedPrefix | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, entry: CachedPrefix) -> None:
        if self.max_entries == 0 or len(entry.ids) > self.max_tokens:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.tokens -= len(old.ids)
        self._entries[key] = entry
        self.tokens += len(entry.ids)
        while len(self._entries) > self.max_entries or self.tokens > self.max_tokens:
            _, dropped = self._entries.popitem(last=False)
            self.tokens -= len(dropped.ids)
