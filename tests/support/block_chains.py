"""Prompt-block hash chains for routing tests: each hash covers every block before it, as the shells
compute them (``tokenplane.core.prompt_hash``), with Python's ``hash`` standing in for XXH3."""

from __future__ import annotations


def chain(*blocks: int) -> tuple[int, ...]:
    out, h = [], 0
    for b in blocks:
        h = hash((h, b))
        out.append(h)
    return tuple(out)
