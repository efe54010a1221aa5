"""The encoder behind :class:`~.local.LocalTokenizer`: ``tiktoken`` where it gives exactly the ids
the ``tokenizers`` library gives for this ``tokenizer.json``, else ``tokenizers`` itself.

Why: ``tokenizers.Tokenizer.encode`` of each turn's new text was three quarters of the gateway's
CPU per conversation request; ``tiktoken``'s byte-level BPE is ~4x cheaper per token and, for the
byte-level BPE tokenizers most chat models ship (GPT-2 style, Llama 3, Qwen 2), gives the same ids.

When tiktoken runs a tokenizer (:func:`load_encoder`, ``encoder: auto``), all of these hold, else
the reason is recorded and ``tokenizers`` encodes:

- the model is a BPE without dropout, unknown token, byte fallback, continuing-subword prefix or
  end-of-word suffix, whose vocabulary is GPT-2's byte-to-unicode alphabet, and whose merges
  come in the order of the ids they make (tiktoken merges by the id of the result);
- no normalizer (or an empty sequence of them);
- the pre-tokenizer is ``ByteLevel(add_prefix_space=false, use_regex=true)`` (GPT-2's pattern), or
  ``Sequence[Split(Regex, Isolated), ByteLevel(...use_regex=false)]`` (Llama 3, Qwen 2: that pattern);
- the added tokens are plain: no ``lstrip``, ``rstrip`` or ``single_word``, all ``normalized``
  alike, none a prefix of another. They are tiktoken's special tokens, split out of the text
  first, leftmost (so leftmost-longest, as ``tokenizers`` splits them);
- the probe (:data:`PROBE`: prose, code, whitespace runs, unicode, digits, contractions, the added
  tokens embedded, and seeded random strings over all of these), and every vocabulary entry on its
  own, give identical ids through both. A mismatch anywhere keeps ``tokenizers``.

Where a text has no run of two or more white spaces before a non-space (most chat text), tiktoken
runs the pattern without its final lookahead (:mod:`.plain`: the same pieces, several times fewer
instructions); where it has some, and the pattern is GPT-2's, Llama 3's or Qwen 2's, the text is
cut before each such run's last white space (:func:`.plain.gap_cuts`), and the plain pattern
encodes the parts (the same ids again); the probe check covers all three.

Special tokens a text prompt gets (``add_special_tokens``, the post-processor's BOS) are taken
from what ``tokenizers`` adds around two probes; the probe check covers them too.
"""

from __future__ import annotations

import itertools
import json
import logging
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from tokenizers import Tokenizer

from tokenplane.gateway.tokenization.added import AddedTokens as AddedTokens
from tokenplane.gateway.tokenization.exactness import PROBE as PROBE
from tokenplane.gateway.tokenization.exactness import NotExact as NotExact
from tokenplane.gateway.tokenization.exactness import _byte_decoder, check_exact
from tokenplane.gateway.tokenization.plain import GPT2_PATTERN as GPT2_PATTERN
from tokenplane.gateway.tokenization.plain import (
    GapCuts,
    GapMarks,
    cut_flag,
    cut_marker,
    encode_cut,
    encode_marked,
    may_have_wide_gap,
    plain_pattern,
)

log = logging.getLogger(__name__)
assert array("i").itemsize == 4  # tiktoken's buffer is u32, read as int32 (ids < 2**31)

EncoderChoice = Literal["auto", "fastokens", "tiktoken", "hf"]


class Encoded(Protocol):
    """One encoding: its ids (a ``list``, or an ``array('i')`` from tiktoken), and where an added
    token's text lies in the input."""

    @property
    def ids(self) -> Sequence[int]: ...

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None: ...


class Encoder(Protocol):
    name: str
    """``"tiktoken"`` or ``"hf"``."""

    def encode(self, text: str) -> Encoded:
        """Without special tokens (as vLLM's chat route); ``token_to_chars`` answers at least for
        the added tokens."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """With the special tokens the post-processor adds (as vLLM's completions route)."""
        ...


class HfEncoder:
    """The ``tokenizers`` library as is."""

    name = "hf"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> Encoded:
        enc: Encoded = self.tokenizer.encode(text, add_special_tokens=False)
        return enc

    def encode_text(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=True).ids
        return ids


class TiktokenEncoder:
    """tiktoken, with the added tokens as its special tokens: it splits them out first, leftmost,
    as ``tokenizers`` does; leftmost-first is leftmost-longest because no added token is a prefix
    of another (else :func:`build_tiktoken` refuses).

    ``plain``: the same encoding with :func:`plain_pattern`'s pattern, used for a text without a
    :data:`_WIDE_GAP` (the same ids, checked on the probe too); its ids come as one buffer, read
    into an ``array('i')`` without a Python int per id. ``cut`` (:func:`~.plain.cut_flag`): a text
    with wide gaps is cut (:class:`~.plain.GapCuts`) and its parts encoded with ``plain``."""

    name = "tiktoken"

    def __init__(
        self,
        encoding: Any,
        added: Mapping[str, int],
        prefix: Sequence[int] = (),
        suffix: Sequence[int] = (),
        plain: Any = None,
        cut: bool | None = None,
    ) -> None:
        self._encoding = encoding
        self._plain = plain
        self._cut = cut if plain is not None else None
        self._gaps = None if self._cut is None else GapCuts(self._cut, "".join({t[0] for t in added}))
        self._marker = cut_marker(added)
        self._marks: GapMarks | None = None  # (the cuts as markers in the text, in C: ASCII spacing)
        if self._cut is not None and self._marker is not None and max(added.values()) <= 0x10FFFF:
            token = self._marker[0]  # the same added token encode_cut joins parts with
            self._marks, self._marker_id = GapMarks(self._cut, added, token), chr(added[token])
        self._added = frozenset(added)
        self._located = AddedTokens(added)
        self._prefix = list(prefix)
        self._suffix = list(suffix)

    def _ids(self, text: str) -> Sequence[int]:
        plain = self._plain
        if plain is not None:
            try:
                marks = self._marks
                marked = marks(text) if marks is not None else None
                if marked is not None and len(marked) != len(text):
                    return encode_marked(plain, marked, self._added, self._marker_id)
                gaps = self._gaps
                cuts = [] if marked is not None else gaps(text) if gaps is not None else None
                if cuts:
                    return encode_cut(plain, text, cuts, self._added, self._marker)
                if cuts is not None or not may_have_wide_gap(text):
                    out = array("i")
                    out.frombytes(
                        memoryview(plain._core_bpe.encode_to_tiktoken_buffer(text, self._added)).cast("B")
                    )
                    return out
            except UnicodeError:  # lone surrogates: Encoding.encode's fix-up, below
                pass
        ids: list[int] = self._encoding.encode(text, allowed_special=self._added, disallowed_special=())
        return ids

    def encode(self, text: str) -> Encoded:
        return self._located.pieces(self._ids(text), text)

    def encode_text(self, text: str) -> list[int]:
        ids = self._ids(text)
        return [*self._prefix, *ids, *self._suffix]


# -- building a tiktoken Encoding from tokenizer.json ---------------------------------------------


def _pattern(pre: Any) -> str:
    """The regex a pre-tokenizer splits with, if tiktoken can split the same way."""
    if not isinstance(pre, dict):
        raise NotExact("no byte-level pre-tokenizer")
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space"):
            raise NotExact("ByteLevel pre-tokenizer with add_prefix_space")
        if pre.get("use_regex", True) is not True:
            raise NotExact("ByteLevel pre-tokenizer without its regex and without a Split before it")
        return GPT2_PATTERN
    if kind == "Sequence":
        steps = pre.get("pretokenizers")
        if not isinstance(steps, list) or len(steps) != 2:
            raise NotExact("a pre-tokenizer sequence other than [Split, ByteLevel]")
        split, byte_level = steps
        if not (
            isinstance(split, dict)
            and split.get("type") == "Split"
            and split.get("behavior") == "Isolated"
            and not split.get("invert")
            and isinstance(split.get("pattern"), dict)
            and isinstance(split["pattern"].get("Regex"), str)
        ):
            raise NotExact("a pre-tokenizer sequence whose first step is not Split(Regex, Isolated)")
        if not (
            isinstance(byte_level, dict)
            and byte_level.get("type") == "ByteLevel"
            and not byte_level.get("add_prefix_space")
            and byte_level.get("use_regex") is False
        ):
            raise NotExact("a pre-tokenizer sequence whose second step is not ByteLevel(use_regex=false)")
        pattern: str = split["pattern"]["Regex"]
        return pattern
    raise NotExact(f"pre-tokenizer {kind}")


def _added_tokens(spec: Mapping[str, Any]) -> dict[str, int]:
    added: dict[str, int] = {}
    normalized: set[bool] = set()
    for t in spec.get("added_tokens") or ():
        content = t.get("content")
        if not isinstance(content, str) or not content:
            raise NotExact("an added token without content")
        for flag in ("lstrip", "rstrip", "single_word"):
            if t.get(flag):
                raise NotExact(f"added token {content!r} has {flag}")
        normalized.add(bool(t.get("normalized")))
        added[content] = int(t["id"])
    if len(normalized) > 1:
        raise NotExact("added tokens both normalized and not (split in two passes)")
    ordered = sorted(added)
    for a, b in itertools.pairwise(ordered):
        if b.startswith(a):  # tiktoken matches them leftmost-first, tokenizers leftmost-longest
            raise NotExact(f"added token {a!r} is a prefix of {b!r}")
    return added


def _ranks(model: Mapping[str, Any], added: Mapping[str, int]) -> dict[bytes, int]:
    """The vocabulary as tiktoken's mergeable ranks, less the added tokens: an added token's id
    then comes out of tiktoken only where its text was split out (what :class:`~.added.Pieces` counts
    on), which is where ``tokenizers`` gives it too if no merge makes it (checked)."""
    if model.get("type") != "BPE":
        raise NotExact(f"model {model.get('type')}, not BPE")
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise NotExact(f"BPE with {key}")
    if model.get("byte_fallback"):
        raise NotExact("BPE with byte_fallback")
    dec = _byte_decoder()
    ranks: dict[bytes, int] = {}
    vocab: Mapping[str, int] = model.get("vocab") or {}
    added_ids = set(added.values())
    for token, i in vocab.items():
        if i in added_ids:
            continue
        try:
            ranks[bytes(dec[ch] for ch in token)] = int(i)
        except KeyError:
            raise NotExact(f"vocabulary entry {token!r} is not byte-level") from None
    if any(bytes([b]) not in ranks for b in range(256)):
        raise NotExact("the vocabulary lacks some of the 256 bytes")
    last = -1
    for merge in model.get("merges") or ():
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        made = vocab.get(a + b)
        if made is None:
            raise NotExact(f"merge {a!r} {b!r} makes no vocabulary entry")
        if made <= last:
            raise NotExact("the merges are not in the order of the ids they make")
        if made in added_ids:
            raise NotExact(f"added token {a + b!r} is made by a merge")
        last = made
    return ranks


def _specials_around(hf: Tokenizer) -> tuple[list[int], list[int]]:
    """What the post-processor adds before and after a single text (``add_special_tokens``)."""
    found: list[tuple[list[int], list[int]]] = []
    for probe in ("hello world", "x = 1\n"):
        bare = hf.encode(probe, add_special_tokens=False).ids
        full = hf.encode(probe, add_special_tokens=True).ids
        for at in range(len(full) - len(bare) + 1):
            if full[at : at + len(bare)] == bare:
                found.append((full[:at], full[at + len(bare) :]))
                break
        else:
            raise NotExact("the post-processor changes the text's own ids")
    if found[0] != found[1]:
        raise NotExact("the post-processor adds different tokens to different texts")
    return found[0]


def build_tiktoken(hf: Tokenizer, spec: Mapping[str, Any]) -> TiktokenEncoder:
    """A tiktoken encoder for ``spec`` (``tokenizer.json``), checked against ``hf``; raises
    :class:`NotExact` with the reason where it would not give the same ids."""
    try:
        import tiktoken
    except ImportError:
        raise NotExact("tiktoken is not installed") from None
    normalizer = spec.get("normalizer")
    if normalizer is not None and not (
        normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")
    ):
        raise NotExact(f"normalizer {normalizer.get('type')}")
    pattern = _pattern(spec.get("pre_tokenizer"))
    added = _added_tokens(spec)
    ranks = _ranks(spec.get("model") or {}, added)
    try:
        encoding = tiktoken.Encoding(
            "tokenplane", pat_str=pattern, mergeable_ranks=ranks, special_tokens=added
        )
    except Exception as exc:  # tiktoken's regex engine refused the pattern
        raise NotExact(f"tiktoken refused the tokenizer: {exc}") from None
    plain: Any = None
    plain_pat = plain_pattern(pattern)
    if plain_pat is not None:
        try:
            plain = tiktoken.Encoding(
                "tokenplane-plain", pat_str=plain_pat, mergeable_ranks=ranks, special_tokens=added
            )
        except Exception:  # (refused: the lookahead's pattern alone then)
            plain = None
    prefix, suffix = _specials_around(hf)
    encoder = TiktokenEncoder(encoding, added, prefix, suffix, plain, cut_flag(pattern, added))
    check_exact(hf, encoder, encoding, spec, added)
    return encoder


def load_encoder(
    hf: Tokenizer, tokenizer_file: Path, choice: EncoderChoice = "auto"
) -> tuple[Encoder, str | None]:
    """The encoder to use and, where ``auto`` could not use the fastest (fastokens, then tiktoken:
    :mod:`.fast`), why. ``fastokens`` or ``tiktoken`` asked for and not exact raises
    :class:`NotExact`."""
    if choice == "hf":
        return HfEncoder(hf), "encoder: hf configured"
    spec = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    reasons: list[str] = []
    if choice in ("auto", "fastokens"):
        from tokenplane.gateway.tokenization.fast import build_fastokens

        # _added_tokens' rules hold for fastokens too: its added tokens are found by plain text
        # match (AddedTokens), which gives tokenizers' offsets only for such tokens
        try:
            fast = build_fastokens(hf, tokenizer_file, _added_tokens(spec))
            log.info("tokenizer %s: fastokens encodes (tokenizers' ids on the probe)", tokenizer_file)
            return fast, None
        except NotExact as exc:
            if choice == "fastokens":
                raise
            reasons.append(f"fastokens: {exc}")
    try:
        encoder = build_tiktoken(hf, spec)
        log.info("tokenizer %s: tiktoken encodes (the same ids as tokenizers on the probe)", tokenizer_file)
        return encoder, "; ".join(reasons) or None
    except NotExact as exc:
        if choice == "tiktoken":
            raise
        reasons.append(f"tiktoken: {exc}")
        log.info("tokenizer %s: tokenizers encodes (%s)", tokenizer_file, "; ".join(reasons))
        return HfEncoder(hf), "; ".join(reasons)
