"""Where a text's added tokens lie, for the encoders that do not track offsets (tiktoken,
fastokens): their ids come with the text, and an added token's span is found when the prefix cache
asks for it (one or two near the end), by a search of the text for the added tokens' texts. Why
that is exact: such an encoder gives an added token's id only where it split that token's text out
of the input, leftmost, as the search does (:func:`~.encoder.load_encoder` checks it), so the k-th
added id from the end is the k-th match from the end."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

from tokenplane.gateway.tokenization.plain import _WS_CHARS


class Pieces:
    """tiktoken's ids; where an added token's text lies is found when asked (:meth:`token_to_chars`
    is asked for one or two added tokens near the end, by the prefix cache)."""

    __slots__ = ("_added_ids", "_spans", "_split", "_sync", "_text", "_whole", "ids")

    def __init__(
        self,
        ids: Sequence[int],
        text: str,
        split: re.Pattern[str],
        added_ids: frozenset[int],
        sync: bool = False,
    ) -> None:
        self.ids = ids
        self._text = text
        self._split = split
        self._added_ids = added_ids
        self._sync = sync
        self._spans: list[tuple[int, int]] | None = None
        self._whole = False

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None:
        added = self._added_ids
        ids = self.ids
        if ids[token_index] not in added:
            return None
        after = 0  # the k-th added id from the end is the k-th added token's match from the end
        for i in range(token_index + 1, len(ids)):
            if ids[i] in added:
                after += 1
        spans = self._spans
        if spans is None or (len(spans) <= after and not self._whole):
            spans = self._spans = self._find(after + 1)
        return spans[len(spans) - 1 - after]

    def last_added(self, bound: int) -> tuple[int, int, int] | None:
        """The last added token whose text ends at or before ``bound``: its index in ``ids`` and
        its span in the text (``None``: there is none). What :meth:`token_to_chars` gives for the
        last added id whose span so ends, found with one search of the text (from after a space
        some way before ``bound`` where ``sync``, as :meth:`_find`) and one walk back over the
        ids: the k-th match from the end is the k-th added id from the end."""
        spans: list[tuple[int, int]] | None = None
        for found in self._near(bound):
            if found and found[0][1] <= bound:
                spans = found
                break
        if spans is None:
            spans = [m.span() for m in self._split.finditer(self._text)]
        at = len(spans) - 1
        while at >= 0 and spans[at][1] > bound:
            at -= 1
        if at < 0:
            return None
        after = len(spans) - 1 - at  # the added ids after the one wanted
        added, ids = self._added_ids, self.ids
        i = len(ids) - 1
        while i >= 0:
            if ids[i] in added:
                if not after:
                    a0, a1 = spans[at]
                    return i, a0, a1
                after -= 1
            i -= 1
        return None

    def _find(self, need: int) -> list[tuple[int, int]]:
        """The added tokens' matches, in order: the last ``need`` at least (all where fewer). With
        ``sync`` (no added token holds a white space) the search starts after a space some way
        from the end (``_TAILS`` characters, the shorter first: the prefix cache asks for one or
        two a few characters from the end), where the whole text's search passes no match: the
        same matches from there, without searching the whole text (~25 k instructions a request)."""
        for spans in self._near(len(self._text)):
            if len(spans) >= need:
                return spans
        self._whole = True
        return [m.span() for m in self._split.finditer(self._text)]

    def _near(self, end: int) -> Iterator[list[tuple[int, int]]]:
        """With ``sync``, the matches from after a space ``_TAILS`` characters before ``end`` (the
        shorter first), while such a start lies within the text; nothing without ``sync``."""
        if not self._sync:
            return
        text, split = self._text, self._split
        for tail in _TAILS:
            start = end - tail
            if start <= 0:
                return
            yield [m.span() for m in split.finditer(text, text.rfind(" ", 0, start) + 1)]


_TAILS = (64, 512)


class AddedTokens:
    """What :class:`Pieces` needs to find a text's added tokens, built once per encoder: their
    alternation, longest first (so the leftmost match is the longest, as ``tokenizers`` splits
    them), their ids, and whether a search may start near the end of a text (``sync``: no added
    token holds a white space)."""

    __slots__ = ("ids", "split", "sync")

    def __init__(self, added: Mapping[str, int]) -> None:
        alternatives = sorted(added, key=len, reverse=True)
        self.split = re.compile("|".join(map(re.escape, alternatives)) if alternatives else "(?!)")
        self.ids = frozenset(added.values())
        self.sync = not any(c.isspace() or c in _WS_CHARS for t in added for c in t)

    def pieces(self, ids: Sequence[int], text: str) -> Pieces:
        return Pieces(ids, text, self.split, self.ids, self.sync)
