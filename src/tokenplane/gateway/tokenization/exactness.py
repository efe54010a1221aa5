"""The guard that keeps tiktoken and fastokens exact (see :mod:`.encoder`, :mod:`.fast`): a probe of
texts and every vocabulary entry, encoded by both libraries; any difference keeps ``tokenizers``."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

if TYPE_CHECKING:
    from tokenplane.gateway.tokenization.encoder import Encoder


class NotExact(Exception):
    """tiktoken cannot run this tokenizer exactly; the message says why."""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode map, inverted: the character a byte-level vocabulary writes a byte as."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


PROBE: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog. It's 4:30pm; they'll say we've won, I'd think.",
    "DON'T SHOUT! I'M here, YOU'RE there, we'LL see. O'Brien's cat's toy.",
    'def f(x: int) -> dict[str, int]:\n    """Doc."""\n    return {"a": x ** 2, \'b\': [1, 2, 3]}\n',
    '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
    '{"model": "llama-3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}',
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%' ORDER BY id DESC;",
    "    indented\n        more\n\n\n\ttabs\t\tand  spaces   \n \n  \r\n\r\nend   ",
    "   ",
    "\n",
    " leading and trailing ",
    "1 12 123 1234 12345 123456789012345 3.14159 -2.5e-10 1,000,000 0x1F 2026-12-03T12:08:10Z",
    "naïve café résumé Ångström façade über straße Ελληνικά Русский текст",
    "日本語のテキストと中文文本，한국어 텍스트。全角：ＡＢＣ１２３",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ and symbols © ® ™ € £ ¥ § ¶ • … — –",
    "عربي עברית हिन्दी ไทย e\u0301 a\u0308 \u200b zero\u200dwidth \ufeffbom",
    "ALLCAPS camelCase snake_case kebab-case PascalCase __dunder__ $var @decorator #tag",
    "!!!??? ... ,,, ;;; ::: --- *** ___ === ~~~ ``` ''' \"\"\" <<< >>> ||| &&& %%%",
    "https://example.com/path?q=1&r=two#frag user@example.org C:\\Windows\\system32",
    "'s 's 't 're 've 'm 'll 'd ' s' x's'",
)


def _probe_texts(added: Mapping[str, int]) -> list[str]:
    texts = list(PROBE)
    for token in sorted(added):
        texts += [
            token,
            f"{token}{token}",
            f"a{token}b",
            f" {token} ",
            f"\n{token}\nuser\nHello{token}\n",
            f"{token[:-1]} {token[1:]}",
        ]
    if added:
        joined = "".join(f"{t}x\n" for t in sorted(added))
        texts.append(f"{joined}{PROBE[0]}{joined}")
    # seeded random strings over every kind of character above, added tokens among them
    rng = random.Random(16)
    alphabet = sorted(set("".join(PROBE)))
    pieces = [*alphabet, " ", "  ", "\n", "\n\n", "\t", *sorted(added), "'s", "'ll", "123", "the"]
    for _ in range(400):
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))))
    return texts


def check_probe(hf: Tokenizer, encoder: Encoder, added: Mapping[str, int]) -> None:
    """Raise :class:`NotExact` unless both give the same ids for every probe text, with and
    without special tokens."""
    for text in _probe_texts(added):
        want = hf.encode(text, add_special_tokens=False).ids
        if list(encoder.encode(text).ids) != want:
            raise NotExact(f"ids differ from tokenizers' on the probe {text[:40]!r}")
        if encoder.encode_text(text) != hf.encode(text, add_special_tokens=True).ids:
            raise NotExact(f"ids with special tokens differ from tokenizers' on the probe {text[:40]!r}")


def check_exact(hf: Tokenizer, encoder: Encoder, encoding: Any, spec: Mapping[str, Any],
                added: Mapping[str, int]) -> None:  # fmt: skip
    """:func:`check_probe`, and every vocabulary entry as one pre-token through tiktoken."""
    check_probe(hf, encoder, added)
    # each vocabulary entry as one pre-token: tiktoken merges any pair whose concatenation is in
    # the vocabulary, tokenizers only the listed merges; a token two merges can reach shows here
    model = hf.model
    dec = _byte_decoder()
    single = encoding._encode_single_piece
    for token in spec["model"]["vocab"]:
        if token in added or len(token) == 1:
            continue
        if single(bytes(dec[ch] for ch in token)) != [t.id for t in model.tokenize(token)]:
            raise NotExact(f"vocabulary entry {token!r} merges differently")
