"""Prompt rendering and prefix-block hashing, done once per request.

The gateway has no tokenizer for every model it fronts, so it approximates: a block is
``block_tokens * CHARS_PER_TOKEN`` characters of the canonically rendered prompt. Each block's
hash covers every character before it (a chain: each block is hashed with the previous link as
the seed), so two prompts share exactly their leading blocks' hashes, as a runtime's prefix cache
shares their leading KV blocks. Hashes are stable across processes and machines (XXH3-64, not
Python's salted ``hash``), so several gateway replicas, and the emulator, agree on them.

Why XXH3 rather than a cryptographic hash: this runs on every request in the gateway. A chain of
XXH3 calls costs ~0.2 µs a block (a 1,200-character prompt in ~5 µs), where BLAKE2b's
update-copy-digest cost ~1.3 µs a block. A crafted collision could only mis-steer prefix affinity
(a routing hint, never a correctness input), so collision resistance against an adversary is not
needed; accidental collisions are ~2^-63 per pair, as for any 63-bit id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from xxhash import xxh3_64_intdigest

CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_TOKENS = 16
ROUTING_BLOCK_TOKENS = 64
"""The gateway's block for its approximate prefix index (``core/routing/prefix_index.py``, used by
the prefix-affinity and weighted routers when no tokenizer is configured): coarser than an engine's
16-token KV block because the index is the gateway's largest structure that grows with traffic,
bounded by the instances' KV caches *in these blocks* (``Gateway.bound_prefix_indexes``), and it
costs a dict entry, a 63-bit int and an array slot per block: at 64 tokens, a quarter of that per
engine KV block. Routing loses little: affinity decides on shared prefixes of hundreds of tokens (a
system prompt, a conversation), and a ratio of matched blocks is as good at 64 tokens as at 16;
what it loses is prompts shorter than 64 tokens (~256 characters), which have no full block and so
route by load alone, and matches that end inside a block. The emulator keeps 16-token blocks for
its cache simulation, and the twin the traces' own block hashes."""


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    """A canonical text form of chat messages: role and content, in order, ChatML-like.

    Content given as a list of parts keeps only the text parts, in order.
    """
    out: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
            )
        else:
            text = "" if content is None else str(content)
        out.append(f"<|{m.get('role', 'user')}|>\n{text}\n")
    return "".join(out)


def approx_tokens(text: str) -> int:
    """Token count estimate for a prompt (about four characters a token for English and code)."""
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def block_hashes(text: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> tuple[int, ...]:
    """Chained 64-bit hashes of each full block of ``text``."""
    size = block_tokens * CHARS_PER_TOKEN
    if size <= 0:
        raise ValueError("block_tokens must be positive")
    data = text.encode("utf-8", "surrogatepass")
    out = []
    link = 0
    for pos in range(0, len(data) - size + 1, size):
        link = xxh3_64_intdigest(data[pos : pos + size], link) >> 1  # 63 bits: non-negative ids
        out.append(link)
    return tuple(out)
