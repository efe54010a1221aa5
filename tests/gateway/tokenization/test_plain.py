"""Cut encoding (:func:`gap_cuts`, :func:`encode_cut`): the plain pattern on the parts of a text cut
before each wide gap's last white space gives the lookahead's pattern's ids on the whole text, for
every pattern the encoder cuts for (GPT-2's, Llama 3's, Qwen 2's)."""

from __future__ import annotations

import itertools
import json
from array import array
from pathlib import Path
from typing import Any

import pytest
import regex
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.gateway.tokenization.encoder import _added_tokens, _ranks
from tokenplane.gateway.tokenization.plain import (
    _WIDE_GAP,
    CUT_EXACT,
    GapCuts,
    GapMarks,
    cut_flag,
    cut_marker,
    encode_cut,
    encode_marked,
    gap_cuts,
    plain_pattern,
)

_GAPS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\x1c\x1d\x1e\x1f"
_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def _pieces(added: list[str]) -> st.SearchStrategy[str]:
    """Texts rich in what the patterns treat apart: white space runs, newlines after punctuation
    (Llama 3's `` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*`` takes them), digits, contractions, non-ASCII
    letters, single spaces between ASCII letters (the cuts), added tokens."""
    piece = st.one_of(
        st.text(alphabet=st.sampled_from(list(_GAPS)), min_size=1, max_size=5),
        st.sampled_from(["  ", "    ", "\n\n", "\n    ", " \n", "\r\n", ".\n\n", ". \n", "!\n", ":\n  "]),
        st.sampled_from(["a", "ab", "Word", " the", "x y", "a b c", " ab ", "'s", "'LL", "'t"]),
        st.sampled_from(["7", "123", "2026", " 42", "3.14", "é", "水", "Ωmega", "straße", "日本"]),
        st.sampled_from([".", ",", "!?", "()", "```", "-", " -", "#", "'", '"']),
        st.sampled_from(added) if added else st.just(""),
        st.text(max_size=3),
    )
    return st.lists(piece, max_size=24).map("".join)


@pytest.fixture(scope="module")
def encodings(tokenizer_dir: Path) -> dict[str, tuple[Any, Any, frozenset[str]]]:
    """For each pattern of :data:`CUT_EXACT`: the tiny tokenizer's vocabulary and added tokens
    as tiktoken encodings with that pattern and with its plain pattern."""
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    special = _added_tokens(spec)
    ranks = _ranks(spec["model"], special)
    out = {}
    for i, pattern in enumerate(sorted(CUT_EXACT)):
        plain = plain_pattern(pattern)
        assert plain is not None
        slow = tiktoken.Encoding(f"slow{i}", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)
        fast = tiktoken.Encoding(f"fast{i}", pat_str=plain, mergeable_ranks=ranks, special_tokens=special)
        out[pattern] = (slow, fast, frozenset(special))
    assert len(out) == 3
    return out


@pytest.mark.parametrize("which", range(3))
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_cut_encoding_is_the_lookahead_patterns(
    which: int, encodings: dict[str, tuple[Any, Any, frozenset[str]]], data: st.DataObject
) -> None:
    pattern = sorted(CUT_EXACT)[which]
    slow, fast, added = encodings[pattern]
    flag = cut_flag(pattern, added)
    assert flag is CUT_EXACT[pattern]
    text = data.draw(_pieces(sorted(added)))
    cuts = gap_cuts(text, flag, "".join(t[0] for t in added))
    want = slow.encode(text, allowed_special=added, disallowed_special=())
    if cuts is None:  # a wide gap before an added token: the encoder takes the lookahead's pattern
        return
    for start, end in itertools.pairwise([0, *cuts, len(text)]):
        assert start < end or not text
        part = _WIDE_GAP.search(text, start, end)  # (searched in the part alone: its end is the part's)
        assert part is None or (flag and text[part.end() - 2] in "\r\n")
    marker = cut_marker(slow._special_tokens)  # (joined by an added token, encoded at once)
    try:
        assert list(encode_cut(fast, text, cuts, added)) == want
        assert list(encode_cut(fast, text, cuts, added, marker)) == want
    except UnicodeEncodeError:  # (a lone surrogate: the encoder takes the whole-text path)
        pass


def test_where_a_text_is_cut() -> None:
    text = "One line here.\n\nThen  two spaces and\n    indented code.\n  \nx"
    assert gap_cuts(text, False, "<") == [15, 21, 40, 58]  # before the last white space of each
    assert gap_cuts(text, True, "<") == [21, 40]  # a run that ends in a newline is no wide gap
    assert gap_cuts("no gap at all, single spaces\nand one newline\n\n", False, "<") == []
    assert gap_cuts("a  <|im_end|>", False, "<") is None  # an added token may follow: not cut
    assert cut_flag(sorted(CUT_EXACT)[0], ["<|a b|>"]) is None
    assert cut_flag(r"\w+|\s+(?!\S)|\s+", ["<s>"]) is None


@pytest.mark.parametrize("pattern", sorted(CUT_EXACT))
@settings(max_examples=1500, deadline=None)
@given(text=_pieces([]))
def test_the_parts_plain_pieces_are_the_texts_lookahead_pieces(pattern: str, text: str) -> None:
    """The same, piece by piece (ids can agree where pieces do not: no merge across them), with
    the ``regex`` module (its ``\\s`` is tiktoken's: Unicode's White_Space)."""
    plain = plain_pattern(pattern)
    assert plain is not None
    cuts = gap_cuts(text, CUT_EXACT[pattern], "")
    assert cuts is not None
    parts = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
    assert [piece for part in parts for piece in regex.findall(plain, part)] == regex.findall(pattern, text)


_FIRSTS = ["<", "<[", "é<", "<?", "a<", "日"]


@pytest.mark.parametrize("newline_ends", [False, True])
@pytest.mark.parametrize("firsts", _FIRSTS)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_gap_cuts_in_c_are_gap_cuts(newline_ends: bool, firsts: str, data: st.DataObject) -> None:
    """:class:`GapCuts` (bytes translated to classes, searched in C) finds what :func:`gap_cuts`
    finds, ``None`` included: on ASCII and non-ASCII texts, with and without non-ASCII white
    spaces, added tokens whose first character is ``?`` or not ASCII, runs ending in newlines."""
    added = ["<|im_end|>", "<[x]>", "é!", "<?>", "a!", "日本"]
    some = st.text(alphabet=_GAPS + "ab<?é日", max_size=30)
    text = data.draw(_pieces([t for t in added if t[0] in firsts]) | some)
    assert GapCuts(newline_ends, firsts)(text) == gap_cuts(text, newline_ends, firsts)


def test_gap_cuts_in_c_on_paragraphs() -> None:
    text = "One line here.\n\nThen  two spaces and\n    indented code.\n  \nx"
    assert GapCuts(False, "<")(text) == [15, 21, 40, 58]
    assert GapCuts(True, "<")(text) == [21, 40]
    assert GapCuts(False, "<")("a  <|im_end|>") is None
    assert GapCuts(False, "<")("no gap\n\n") == []
    assert GapCuts(False, "<")("caf\xe9  au lait\n\nx") == [5, 14]  # (non-ASCII: written "?")
    assert GapCuts(False, "<")("nbsp\xa0 here  x") == [5, 11]  # (a non-ASCII white space: gap_cuts)
    with pytest.raises(ValueError):
        GapCuts(False, " <")


@pytest.mark.parametrize("which", range(3))
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_marked_encoding_is_the_lookahead_patterns(
    which: int, encodings: dict[str, tuple[Any, Any, frozenset[str]]], data: st.DataObject
) -> None:
    """:class:`GapMarks` then :func:`encode_marked`: the lookahead's pattern's ids, runs before an
    added token (left whole) included; ``None`` only for the texts it leaves to :class:`GapCuts`."""
    pattern = sorted(CUT_EXACT)[which]
    slow, fast, added = encodings[pattern]
    flag = cut_flag(pattern, added)
    assert flag is not None
    marker = min(added)
    marks = GapMarks(flag, added, marker)
    text = data.draw(_pieces(sorted(added)) | st.text(alphabet=" \n\t.a<", max_size=30))
    marked = marks(text)
    if marked is None:
        assert marker in text or any(c in text for c in _GAPS if c not in " \n\x1c\x1d\x1e\x1f")
        return
    assert marked.replace(marker, "") == text.replace(marker, "")
    want = slow.encode(text, allowed_special=added, disallowed_special=())
    try:
        got = encode_marked(fast, marked, added, chr(slow._special_tokens[marker]))
    except UnicodeEncodeError:  # (a lone surrogate: the encoder takes the whole-text path)
        return
    assert list(got) == want
    cuts = gap_cuts(text, flag, "")  # (told of no added token: every run is cut)
    assert cuts is not None  # a marker where gap_cuts cuts, but before an added token
    assert marked.count(marker) == sum(not text.startswith(tuple(added), q + 1) for q in cuts)


def test_where_markers_go() -> None:
    added = ["<|im_end|>", "</s>"]
    text = "One line here.\n\nThen  two spaces and\n    indented code.\n  \nx"
    want = "One line here.\n</s>\nThen </s> two spaces and\n   </s> indented code.\n  </s>\nx"
    assert GapMarks(False, added, "</s>")(text) == want
    assert GapMarks(True, added, "</s>")(text) == want.replace("\n</s>\n", "\n\n").replace(" </s>\n", " \n")
    assert GapMarks(False, added, "</s>")("a  <|im_end|>b  <x") == "a  <|im_end|>b </s> <x"
    assert GapMarks(False, added, "</s>")("a  b</s>") is None  # (the marker in the text)
    assert GapMarks(False, added, "</s>")("a\t\tb") is None  # (tabs: GapCuts' way)
    assert GapMarks(False, added, "</s>")("a\u3000 b") is None
    assert GapMarks(False, added, "</s>")("é  b") == "é </s> b"
    with pytest.raises(ValueError):
        GapMarks(False, ["<a b>"], "<a b>")


class _Buffer:
    """tiktoken's plain encoding, faked: its buffer of ids, whatever the text."""

    def __init__(self, ids: list[int]) -> None:
        self._core_bpe = self
        self.ids = ids

    def encode_to_tiktoken_buffer(self, text: str, added: Any) -> memoryview:
        return memoryview(array("I", self.ids))


def test_the_markers_ids_come_out_aligned() -> None:
    """Every id the marker's is taken out, none else: ids in the surrogates' range and ids whose
    bytes hold the marker's (misaligned) stay."""
    ids = [300, 256, 1, 0xD800, 1, 0xDFFF, 65537, 1, 0x10FFFF]  # 300, 256: bytes 2c 01 00 00 00 01
    got = encode_marked(_Buffer(ids), "", frozenset(), chr(1))
    assert list(got) == [300, 256, 0xD800, 0xDFFF, 65537, 0x10FFFF]
    with pytest.raises(UnicodeDecodeError):
        encode_marked(_Buffer([0x110000]), "", frozenset(), chr(1))
