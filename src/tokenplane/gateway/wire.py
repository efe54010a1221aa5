"""Typed shapes the gateway decodes from an instance's bytes.

They live apart from the modules that use them because those are compiled with mypyc in the
compiled build (``setup.py``), and mypyc keeps a union annotation such as ``_Usage | None`` from
msgspec, which then cannot decode into it; this module stays interpreted.
"""

from __future__ import annotations

import msgspec


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class UsageOnly(msgspec.Struct):
    """An OpenAI answer, of which only ``usage`` is read."""

    usage: Usage | None = None


decode_usage = msgspec.json.Decoder(UsageOnly).decode
