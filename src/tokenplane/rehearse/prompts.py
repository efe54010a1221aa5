"""Prompts whose prefix structure is the twin's: one request spec -> one prompt text.

The twin's request carries chained block ids (``block_hashes``, one per ``hash_block_tokens``
tokens). Live, each id becomes that many token ids drawn from the id alone, rendered four characters
a token as the emulator renders token ids (``emulator.protocol.render_token_ids``), so the gateway
and the emulator count ``prompt_tokens`` tokens and two prompts share exactly the blocks whose ids
they share. Tokens after the last full block are unique to the request (no cache can hold them in
the twin either).
"""

from __future__ import annotations

from functools import lru_cache

from xxhash import xxh3_64_intdigest

from tokenplane.emulator.protocol import render_token_ids
from tokenplane.sim.workloads.base import RequestSpec

_TAIL_SEED = 0x5EED_7A11


def _ids(seed: int, n: int) -> list[int]:
    """``n`` token ids (24 bits each) drawn from ``seed`` alone."""
    out = []
    for k in range(n):
        out.append(xxh3_64_intdigest(k.to_bytes(4, "little"), seed & 0xFFFF_FFFF_FFFF_FFFF) & 0xFFFFFF)
    return out


@lru_cache(maxsize=1 << 16)
def _block(block_id: int, tokens: int) -> str:
    return render_token_ids(_ids(block_id, tokens))


def prompt_text(spec: RequestSpec) -> str:
    """The prompt for ``spec``: ``spec.prompt_tokens`` tokens, blocks as the twin's ids say."""
    parts: list[str] = []
    hb = spec.hash_block_tokens
    used = 0
    for h in spec.block_hashes:
        if used + hb > spec.prompt_tokens:
            break
        parts.append(_block(h, hb))
        used += hb
    rest = spec.prompt_tokens - used
    if rest > 0:
        parts.append(render_token_ids(_ids(_TAIL_SEED ^ (spec.request_id * 0x9E37_79B9), rest)))
    return "".join(parts)
