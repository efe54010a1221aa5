"""``fastokens``: a Rust reimplementation of the ``tokenizers`` library's encode, run where it gives
exactly ``tokenizers``' ids for this ``tokenizer.json`` (checked at load, as tiktoken is).

Why: on chat text laid out in paragraphs, tiktoken's encode of each turn's new text was still most
of the tokenization cost (~436 k of ~543 k instructions a turn, with the cut search and marker
removal of :mod:`.plain` the rest); fastokens encodes the same texts several times faster
(``bench/tokenizer_encoders.py`` prints the figures side by side), and it reads ``tokenizer.json``
itself, so it is not limited to byte-level BPE as tiktoken is.

The guard (:func:`check_fast`): the probe of :mod:`.exactness` (with and without special tokens),
and the whole vocabulary decoded back to text, in chunks, through both libraries. A difference
anywhere keeps the next encoder (tiktoken, else ``tokenizers``) with the reason.

fastokens does not track character offsets, so where an added token lies (asked by the prefix
cache for one or two near the end) is found as for tiktoken (:class:`~.added.AddedTokens`). A text
it cannot take (a lone surrogate: not UTF-8) raises ``UnicodeEncodeError``, as ``tokenizers``
raises ``TypeError`` there: the request is routed approximately (``stages/tokenize.py``).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tokenplane.gateway.tokenization.added import AddedTokens
from tokenplane.gateway.tokenization.encoder import Encoded
from tokenplane.gateway.tokenization.exactness import NotExact, check_probe

_VOCAB_CHUNK = 256  # vocabulary entries per checked text
_BIG_ENDIAN = sys.byteorder == "big"  # (fastokens' flat buffer is little-endian)


class FastokensEncoder:
    name = "fastokens"

    def __init__(self, tokenizer: Any, added: Mapping[str, int]) -> None:
        self._tokenizer = tokenizer
        self._located = AddedTokens(added)

    def encode(self, text: str) -> Encoded:
        # the ids as one buffer of u32 (``encode_batch_flat``), read into an ``array('i')`` by
        # memcpy: ``encode(...).ids`` makes a Python int per id, and the prefix cache then packs
        # them into an array again (~85 k instructions for a 300-token turn, more than the encode)
        flat, _ = self._tokenizer.encode_batch_flat([text], add_special_tokens=False)
        ids = array("i")
        ids.frombytes(flat)
        if _BIG_ENDIAN:
            ids.byteswap()
        return self._located.pieces(ids, text)

    def encode_text(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=True).ids
        return ids


def _vocabulary_texts(hf: Tokenizer, added: Mapping[str, int]) -> list[str]:
    """The vocabulary decoded back to text, ``_VOCAB_CHUNK`` entries a text, space separated."""
    skip = set(added.values())
    ids = sorted(i for i in hf.get_vocab().values() if i not in skip)
    words = hf.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return [" ".join(words[k : k + _VOCAB_CHUNK]) for k in range(0, len(words), _VOCAB_CHUNK)]


def check_fast(hf: Tokenizer, encoder: FastokensEncoder, added: Mapping[str, int]) -> None:
    """Raise :class:`NotExact` unless fastokens gives ``tokenizers``' ids on the probe and on the
    vocabulary decoded to text."""
    check_probe(hf, encoder, added)
    for text in _vocabulary_texts(hf, added):
        if list(encoder.encode(text).ids) != hf.encode(text, add_special_tokens=False).ids:
            raise NotExact(f"ids differ from tokenizers' on vocabulary text {text[:40]!r}")


def build_fastokens(hf: Tokenizer, tokenizer_file: Path, added: Mapping[str, int]) -> FastokensEncoder:
    """fastokens for ``tokenizer_file``, checked against ``hf``; raises :class:`NotExact` with the
    reason where it is not installed, cannot load the file, or would not give the same ids."""
    try:
        import fastokens
    except ImportError:
        raise NotExact("fastokens is not installed") from None
    try:
        tokenizer = fastokens.Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # a tokenizer.json it does not support
        raise NotExact(f"fastokens refused the tokenizer: {exc}") from None
    encoder = FastokensEncoder(tokenizer, added)
    check_fast(hf, encoder, added)
    return encoder
