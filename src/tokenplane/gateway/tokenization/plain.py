"""tiktoken's pattern without its lookahead, where that splits a text the same way.

GPT-2's, Llama 3's and Qwen 2's pre-tokenizer patterns end in ``\\s+(?!\\S)|\\s+``; the lookahead
sends tiktoken's regex engine (``fancy_regex``) to its backtracking VM for the whole pattern, which
was ~80 % of an encode's instructions. Without it the pattern runs as one automaton, and gives the
same pieces on any text with no run of two or more white spaces before a non-space
(:func:`plain_pattern` says why); :func:`may_have_wide_gap` tells, cheaply, which texts may have one
(those go to the pattern with its lookahead, :class:`~.encoder.TiktokenEncoder`).
"""

from __future__ import annotations

import re

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
