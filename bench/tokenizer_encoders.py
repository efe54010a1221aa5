"""The local tokenizer's encoders side by side in one run: ids against ``tokenizers`` and process
time per text, on chat-like texts laid out in paragraphs, words one space apart, and random unicode.

Each encoder is what ``models[].tokenizer.encoder`` selects (``hf``: the ``tokenizers`` library;
``tiktoken``; ``fastokens``), loaded through :class:`~tokenplane.gateway.tokenization.LocalTokenizer`
with its exactness check. The texts are generated with a fixed seed; half of them are compared with
``tokenizers``' ids, the other half (unseen by any cache) are timed, encoders interleaved per text
so that machine noise falls on all of them alike. Usage::

    python tests/support/tiny_tokenizer.py /tmp/tok32k 32000
    python bench/tokenizer_encoders.py --tokenizer /tmp/tok32k [--texts 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_inproc import _paragraphs, _words

from tokenplane.gateway.tokenization import LocalTokenizer

ENCODERS = ("hf", "tiktoken", "fastokens")
_UNICODE = "abcdefghij KLMNOP \n\n\t  éüß中文字😀 .,;:!?()[]{}<>'\"0123456789-_=+"


def texts(kind: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    if kind == "unicode":
        return ["".join(rng.choice(_UNICODE) for _ in range(rng.randint(50, 1500))) for _ in range(n)]
    make = _paragraphs if kind == "paragraphs" else _words
    return [make(rng, 180) for _ in range(n)]


def run(folder: Path, n: int, seed: int) -> dict[str, Any]:
    loaded = {}
    for name in ENCODERS:
        try:
            loaded[name] = LocalTokenizer(folder, encoder=name)  # type: ignore[arg-type]
        except Exception as exc:  # not exact for this tokenizer, or not installed
            print(f"{name}: not used ({exc})", file=sys.stderr)
    hf = loaded["hf"].tokenizer
    out: dict[str, Any] = {}
    for kind in ("paragraphs", "words", "unicode"):
        sample = texts(kind, n, seed)
        checked, timed = sample[: n // 2], sample[n // 2 :]
        want = [hf.encode(t, add_special_tokens=False).ids for t in checked]
        spent = dict.fromkeys(loaded, 0.0)
        for t in timed:
            for name, tok in loaded.items():
                c0 = time.process_time()
                tok.encoder.encode(t)
                spent[name] += time.process_time() - c0
        out[kind] = {
            "chars_per_text": round(sum(map(len, timed)) / len(timed)),
            **{
                name: {
                    "mismatches": sum(
                        list(tok.encoder.encode(t).ids) != w for t, w in zip(checked, want, strict=True)
                    ),
                    "us_per_text": round(spent[name] / len(timed) * 1e6, 1),
                }
                for name, tok in loaded.items()
            },
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", type=Path, required=True, help="a folder with tokenizer.json")
    p.add_argument("--texts", type=int, default=600, help="texts per kind (half checked, half timed)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    out = run(a.tokenizer, a.texts, a.seed)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for kind, row in out.items():
        cells = [
            f"{name} {v['us_per_text']} us ({v['mismatches']} differ)"
            for name, v in row.items()
            if name in ENCODERS
        ]
        print(f"{kind:10s} {row['chars_per_text']:5d} chars: " + " | ".join(cells))


if __name__ == "__main__":
    main()
