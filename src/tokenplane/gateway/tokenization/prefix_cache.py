"""A bounded cache of tokenized conversation prefixes, so a growing conversation re-tokenizes only
its new turn.

Key: a hash of everything else the template is rendered with, the number ``k`` of messages the
prefix covers and the last of them (:func:`~.local.prefix_key`); a request's messages are not all
hashed (a JSON body's strings are new objects each request, so hashing them costs a pass over the
whole conversation, ~60 k instructions a request at 6 k characters). Where the template renders
per message the entry keeps its messages (:class:`SeenMessages`) and a hit is taken only where
they are the request's first ``k`` exactly (a memcmp per string, no hash).

Value: a prefix of the rendered text that ends right after an added token (``<|im_start|>``,
``<|im_end|>``...), and its token ids. Why there: a tokenizer extracts added tokens before it
splits and merges anything else, so the text after one is tokenized independently of the text
before it. Only the rest of the next turn's text is tokenized, behind the same added token as an
anchor (so a pre-tokenizer that treats the start of a string specially sees what it sees in the
full text). Where the template renders message by message (:class:`~.chat_template.SplitTemplate`)
the next turn renders only its new messages, after the entry's ``rest`` (the text its messages end
with after the anchor); else it renders the whole conversation and uses the entry if that text
still starts with the entry's (``startswith``, so a template that renders earlier turns differently
only loses the reuse).

Bound: ``max_entries`` conversations, ``max_tokens`` token ids in all (4 bytes each, in
``array('i')``) and ``max_chars`` characters of the texts and messages the entries keep (counted
per entry, though the entries of one conversation share its messages' strings), least recently
used dropped first. The defaults (4,096 entries, 4 Mi tokens, 32 Mi characters) hold about 16 MB
of ids plus up to ~32 MB of text (about 4 characters per token).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenplane.gateway.token_blocks import Keys

DEFAULT_CACHE_ENTRIES = 4096
DEFAULT_CACHE_TOKENS = 4 * 1024 * 1024
CHARS_PER_TOKEN_BOUND = 8
"""``max_chars`` per ``max_tokens``: about twice the usual characters per token, so that it binds
only where messages hold what the template does not render (a large field it ignores)."""


class SeenMessages:
    """The messages a per-message entry covers, as sent, to check that a request starts with them
    (the key names them only by their count and the last one). ``messages``: a copy of each (a
    later stage may change the request's dicts; the strings, immutable, are shared) where all its
    values are strings, else its JSON text; ``plain``: all are dicts of strings, and ``order`` the
    keys of all, in order (dict equality ignores it, a template that iterates a message does not)."""

    __slots__ = ("chars", "messages", "order", "plain")

    def __init__(self, messages: list[Any], order: tuple[Any, ...], plain: bool, chars: int) -> None:
        self.messages = messages
        self.order = order
        self.plain = plain
        self.chars = chars


class CachedPrefix:
    __slots__ = ("anchor", "anchor_id", "ids", "keys", "rest", "seen", "text")

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
        self.seen: SeenMessages | None = None  # the messages it covers (per-message rendering)

    @property
    def chars(self) -> int:
        """Characters kept besides the ids (counted against ``max_chars``)."""
        seen = self.seen
        return len(self.text) + len(self.rest) + len(self.anchor) + (0 if seen is None else seen.chars)


class PrefixCache:
    """LRU over :class:`CachedPrefix` entries, bounded in entries and in token ids."""

    __slots__ = ("_entries", "chars", "hits", "max_chars", "max_entries", "max_tokens", "misses", "tokens")

    def __init__(
        self,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
        max_tokens: int = DEFAULT_CACHE_TOKENS,
        max_chars: int | None = None,
    ) -> None:
        if max_entries < 0 or max_tokens < 0 or (max_chars is not None and max_chars < 0):
            raise ValueError("cache bounds must be >= 0")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self.max_chars = CHARS_PER_TOKEN_BOUND * max_tokens if max_chars is None else max_chars
        self._entries: OrderedDict[Hashable, CachedPrefix] = OrderedDict()
        self.tokens = 0
        self.chars = 0
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
        chars = entry.chars
        if self.max_entries == 0 or len(entry.ids) > self.max_tokens or chars > self.max_chars:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.tokens -= len(old.ids)
            self.chars -= old.chars
        self._entries[key] = entry
        self.tokens += len(entry.ids)
        self.chars += chars
        while (
            len(self._entries) > self.max_entries
            or self.tokens > self.max_tokens
            or self.chars > self.max_chars
        ):
            _, dropped = self._entries.popitem(last=False)
            self.tokens -= len(dropped.ids)
            self.chars -= dropped.chars
