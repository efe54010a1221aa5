"""tiktoken's pattern without its lookahead, where that splits a text the same way.

GPT-2's, Llama 3's and Qwen 2's pre-tokenizer patterns end in ``\\s+(?!\\S)|\\s+``; the lookahead
sends tiktoken's regex engine (``fancy_regex``) to its backtracking VM for the whole pattern, which
was ~80 % of an encode's instructions. Without it the pattern runs as one automaton, and gives the
same pieces on any text with no run of two or more white spaces before a non-space
(:func:`plain_pattern` says why); :func:`may_have_wide_gap` tells, cheaply, which texts may have one
(those go to the pattern with its lookahead, :class:`~.encoder.TiktokenEncoder`). For the patterns
of :data:`CUT_EXACT`, :func:`gap_cuts` finds where to cut a text with wide gaps into texts without
any, each then encoded with the plain pattern (:func:`encode_cut`): the same ids again.
"""

from __future__ import annotations

import codecs
import itertools
import re
from array import array
from collections.abc import Iterable, Mapping, Set
from typing import Any

_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""Unicode's White_Space, which ``\\s`` is in tiktoken's regex engine (not Python's ``\\s``: that
one also takes U+001C..U+001F)."""
_LOOKAHEAD_TAIL = r"|\s+(?!\S)|\s+"
_WIDE_GAP = re.compile(f"[{_WS}]{{2,}}[^{_WS}]")
"""Where ``\\s+(?!\\S)`` and ``\\s+`` part: two or more white spaces before a non-space."""
_WS_CHARS = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000").union(
    map(chr, range(0x2000, 0x200B))
)
_ASCII_OTHERS = "\t\n\x0b\x0c\r"
_OTHERS = _ASCII_OTHERS + "".join(sorted(_WS_CHARS - set(_ASCII_OTHERS) - {" "}))
"""The white spaces other than the space: those an ASCII text can hold first."""


def may_have_wide_gap(text: str) -> bool:
    """Whether ``text`` may have a :data:`_WIDE_GAP`: whether two white spaces touch anywhere (a
    superset: a run at the very end counts too). A substring search and a look around each white
    space other than the space (few in chat text), instead of the regex's attempt at every space
    (~200 instructions a character)."""
    if "  " in text:
        return True
    ws = _WS_CHARS
    for c in _ASCII_OTHERS if text.isascii() else _OTHERS:
        i = text.find(c)
        while i >= 0:
            if (i and text[i - 1] in ws) or text[i + 1 : i + 2] in ws:
                return True
            i = text.find(c, i + 1)
    return False


def plain_pattern(pattern: str) -> str | None:
    """``pattern`` less its lookahead, where that changes no split of a text without a wide gap.

    A pattern ``X|\\s+(?!\\S)|\\s+`` (GPT-2's, Llama 3's, Qwen 2's) with no lookaround in ``X``:
    at a position where ``X`` fails and a white space starts a run of them, ``\\s+(?!\\S)`` takes
    the run less its last character where the run is followed by a non-space, else the whole run,
    as ``\\s+`` does; they differ only where that rest of the run is two or more characters long
    before a non-space, which a text with no :data:`_WIDE_GAP` has nowhere. ``X|\\s+`` has no
    lookaround, so tiktoken's regex engine runs it as one automaton instead of its backtracking
    VM (which was ~80 % of an encode's instructions). ``None``: not of that form."""
    if not pattern.endswith(_LOOKAHEAD_TAIL):
        return None
    head = pattern[: -len(_LOOKAHEAD_TAIL)]
    if any(look in head for look in ("(?=", "(?!", "(?<")):
        return None
    return head + r"|\s+"


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""What ``ByteLevel(use_regex=true)`` splits with (``tokenizers``' byte_level.rs)."""
_LLAMA3_HEAD = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_LLAMA3_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CUT_EXACT: dict[str, bool] = {
    GPT2_PATTERN: False,
    _LLAMA3_HEAD + r"\p{N}{1,3}" + _LLAMA3_TAIL: True,  # Llama 3's
    _LLAMA3_HEAD + r"\p{N}" + _LLAMA3_TAIL: True,  # Qwen 2's
}
r"""The patterns :func:`gap_cuts` cuts exactly for, and whether a run of white spaces that ends in
``\r`` or ``\n`` is no wide gap for them (``True``: ``\s*[\r\n]+``, before the lookahead, takes
all of it that is left, in both patterns).

Why a cut is exact. Take a run of white spaces ``text[a:b]``, ``b - a >= 2``, before a non-space
``text[b]``, and ``q = b - 1``. In GPT-2's pattern no piece takes a white space after its first
character, and at ``a`` only ``\s+(?!\S)`` matches (every other alternative needs a non-space at
``a + 1``): it ends at ``q``. In Llama 3's and Qwen 2's, a piece may take ``\r``/``\n`` after
punctuation, and ``\s*[\r\n]+`` takes up to the run's last newline; where ``text[q]`` is neither,
both end before ``q``; from where the rest of the run starts, every other alternative needs a
non-space next, and ``\s+(?!\S)`` ends at ``q`` (or, the rest being ``text[q]`` alone, a piece
starts at ``q``). So a piece starts at ``q``: the pieces of ``text[q:]`` are the text's from
``q`` on (no lookbehind, no anchor), and those of ``text[:q]`` the text's before it: a match in
``text[:q]`` is one in the text (its only lookahead, ``(?!\S)``, at the end of ``text[:q]`` sees
``text[q]``, a white space, in the text), and each of the text's pieces before ``q`` ends by
``q``. After every such cut no part has a wide gap (a run at a part's end is followed by nothing,
where both patterns take it whole), so the plain pattern splits each part as the lookahead's
does. Added tokens (split out first, from each part alike) are never cut where none holds a white
space, and a run before one (the end of a text for the pattern) is not cut: ``None``."""


def _touching(text: str) -> list[int]:
    """Where two white spaces touch (the first one's index), at least once in every run of two
    or more (the same searches as :func:`may_have_wide_gap`)."""
    at: list[int] = []
    i = text.find("  ")
    while i >= 0:
        at.append(i)
        i = text.find("  ", i + 2)
    ws = _WS_CHARS
    for c in _ASCII_OTHERS if text.isascii() else _OTHERS:
        i = text.find(c)
        while i >= 0:
            if i and text[i - 1] in ws:
                at.append(i - 1)
            elif text[i + 1 : i + 2] in ws:
                at.append(i)
            i = text.find(c, i + 1)
    at.sort()
    return at


_RUN = re.compile(f"[{_WS}]*")


def cut_flag(pattern: str, added: Iterable[str]) -> bool | None:
    """:data:`CUT_EXACT`'s flag for ``pattern``; ``None``: not there, or an added token holds a
    white space (cut, it would be split)."""
    if any(c in _WS_CHARS for token in added for c in token):
        return None
    return CUT_EXACT.get(pattern)


def gap_cuts(text: str, newline_ends: bool, added_firsts: str) -> list[int] | None:
    """Where to cut ``text`` (:data:`CUT_EXACT`'s pattern; ``newline_ends`` its flag) into parts
    without a wide gap: before the last white space of each run of two or more before a non-space.
    ``None``: a run comes before one of ``added_firsts`` (the added tokens' first characters)."""
    cuts: list[int] = []
    end = 0
    n = len(text)
    for i in _touching(text):
        if i < end:
            continue  # (in the run already seen)
        m = _RUN.match(text, i)
        end = m.end() if m is not None else i
        if end >= n:
            break
        if newline_ends and text[end - 1] in "\r\n":
            continue
        if text[end] in added_firsts:
            return None
        cuts.append(end - 1)
    return cuts


_ASCII_WS = _ASCII_OTHERS + " "
_NON_ASCII_WS = tuple(sorted(_WS_CHARS - set(_ASCII_WS)))


class GapCuts:
    """:func:`gap_cuts` for one pattern's flag and one set of added tokens, the search done in C:
    the text written as one byte a character (``?`` for each non-ASCII one), those bytes
    translated to their classes (``s``: a white space; ``n``: ``\\r`` or ``\\n`` where they end
    no wide gap; ``a``: an added token's first character; ``x``: any other), where every cut is
    at the middle of a ``ss``/``ns`` then ``x``, found by ``bytes.find``, and a ``ss``/``ns``
    then ``a`` is :func:`gap_cuts`' ``None``. Instead of a Python step at each newline and
    touching white spaces (~170 instructions a character on paragraph text), ~50.

    Where that is not the same as :func:`gap_cuts` (a non-ASCII text with a non-ASCII white space,
    or added tokens with a non-ASCII or ``?`` first character) it calls :func:`gap_cuts`."""

    __slots__ = ("_cut_at", "_firsts", "_newline_ends", "_stop_at", "_table", "_unsure")

    def __init__(self, newline_ends: bool, added_firsts: str) -> None:
        table = bytearray(b"x" * 256)
        for c in _ASCII_WS:
            table[ord(c)] = ord("n" if newline_ends and c in "\r\n" else "s")
        for c in added_firsts:
            if c in _WS_CHARS:
                raise ValueError("an added token that starts with a white space is never cut for")
            if c.isascii():
                table[ord(c)] = ord("a")
        self._table = bytes(table)
        self._newline_ends = newline_ends
        self._firsts = added_firsts
        self._cut_at = (b"ssx", b"nsx") if newline_ends else (b"ssx",)
        self._stop_at = (b"ssa", b"nsa") if newline_ends else (b"ssa",)
        # a non-ASCII character, written "?", could be an added token's first one
        self._unsure = not added_firsts.isascii() or "?" in added_firsts

    def __call__(self, text: str) -> list[int] | None:
        if not text.isascii() and (self._unsure or any(c in text for c in _NON_ASCII_WS)):
            return gap_cuts(text, self._newline_ends, self._firsts)
        classes = text.encode("ascii", "replace").translate(self._table)
        for stop in self._stop_at:
            if stop in classes:
                return None
        cuts: list[int] = []
        for at in self._cut_at:
            i = classes.find(at)
            while i >= 0:
                cuts.append(i + 1)
                i = classes.find(at, i + 3)
        if len(self._cut_at) > 1:
            cuts.sort()
        return cuts


def cut_marker(added: Mapping[str, int]) -> tuple[str, bytes] | None:
    """An added token and its id's bytes in tiktoken's buffer: :func:`encode_cut` joins the parts
    with it, for one call instead of one a part (an added token is split out first, so the parts
    are encoded apart all the same; none holds a white space, so none spans a cut)."""
    if not added:
        return None
    token = min(added)
    return token, array("i", [added[token]]).tobytes()


def encode_cut(
    plain: Any, text: str, cuts: list[int], added: Set[str], marker: tuple[str, bytes] | None = None
) -> array[int]:
    """``text``'s ids by ``plain`` (:func:`plain_pattern`'s encoding), part by part between
    :func:`gap_cuts`' ``cuts``; ``UnicodeEncodeError`` on a lone surrogate. With ``marker``
    (:func:`cut_marker`) and the text without it: the parts joined by it, encoded at once, and its
    id taken out (where each of its matches in the bytes is one whole id, else part by part)."""
    fast = plain._core_bpe.encode_to_tiktoken_buffer
    out = array("i")
    bounds = [0, *cuts, len(text)]
    if marker is not None and marker[0] not in text:
        joined = marker[0].join([text[a:b] for a, b in itertools.pairwise(bounds)])
        parts = bytes(memoryview(fast(joined, added)).cast("B")).split(marker[1])
        if len(parts) == len(bounds) - 1 and not any(len(part) % 4 for part in parts):
            out.frombytes(b"".join(parts))
            return out
    for a, b in itertools.pairwise(bounds):
        out.frombytes(memoryview(fast(text[a:b], added)).cast("B"))
    return out


_OTHER_ASCII_WS = "\t\x0b\x0c\r"


class GapMarks:
    """The text with ``marker`` (an added token) at each of :func:`gap_cuts`' cuts, inserted in C:
    one ``re.sub`` a pair of white spaces (``"\\n\\n"``, ``"\\n "``, ``" \\n"``, ``"  "``) followed by
    a non-space that starts no added token, the marker put between the two. A run is cut once,
    before its last white space (the other pairs in it are followed by a white space or by the
    marker, an added token). Where an added token follows, the run is not cut and needs no cut:
    the added token is split out first, so the run ends its part for both patterns, which then
    take it whole (:func:`gap_cuts` answers ``None`` there, not knowing whether the character
    starts one). The parts then encode at once, joined by the marker (:func:`encode_marked`).

    ``None`` (:class:`GapCuts`' way then): the text holds the marker, a tab, ``\\r``, ``\\x0b``,
    ``\\x0c`` or a non-ASCII white space. Each pair is searched for only where ``str.find`` sees
    it (a text without wide gaps costs a few substring searches)."""

    __slots__ = ("_marker", "_pairs")

    def __init__(self, newline_ends: bool, added: Iterable[str], marker: str) -> None:
        tokens = sorted(added, key=len, reverse=True)
        if marker not in tokens or any(c in _WS_CHARS for t in tokens for c in t):
            raise ValueError("the marker must be an added token, and none may hold a white space")
        tail = f"(?=[^{_WS}])" + (f"(?!{'|'.join(map(re.escape, tokens))})" if tokens else "")
        self._marker = marker
        # (a run ending in a newline is no wide gap for Llama 3's and Qwen 2's patterns)
        pairs = ["\n ", "  "] if newline_ends else ["\n\n", "\n ", "  ", " \n"]
        self._pairs = [(p, re.compile(re.escape(p) + tail).sub, p[0] + marker + p[1]) for p in pairs]

    def __call__(self, text: str) -> str | None:
        if self._marker in text or (not text.isascii() and any(c in text for c in _NON_ASCII_WS)):
            return None
        for c in _OTHER_ASCII_WS:
            if c in text:
                return None
        for pair, sub, marked in self._pairs:
            if pair in text:
                text = sub(marked, text)
        return text


def encode_marked(plain: Any, marked: str, added: Set[str], marker_id: str) -> array[int]:
    """The ids of :class:`GapMarks`' text by ``plain`` (:func:`plain_pattern`'s encoding), less
    the marker's (``marker_id``: its id as a character). tiktoken's buffer is read as UTF-32
    (one character an id, ``surrogatepass``: ids up to 0x10FFFF) and the marker's character taken
    out by ``str.replace``: aligned by construction, in C, without a part list. The marker's id
    comes only from the markers: the text held none, and an added token (none holds a white space)
    cannot span one put between two white spaces. ``UnicodeEncodeError``: a lone surrogate;
    ``UnicodeDecodeError``: an id above 0x10FFFF."""
    buffer = plain._core_bpe.encode_to_tiktoken_buffer(marked, added)
    ids = codecs.utf_32_le_decode(buffer, "surrogatepass", True)[0]
    out = array("i")
    out.frombytes(codecs.utf_32_le_encode(ids.replace(marker_id, ""), "surrogatepass")[0])
    return out
