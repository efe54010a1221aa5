"""Typed shapes the gateway decodes: from an instance's bytes, and from a client's where a route
takes a fixed body.

They live apart from the modules that use them because those are compiled with mypyc in the
compiled build (``setup.py``), and mypyc keeps a union annotation such as ``Usage | None`` from
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


class OutcomeBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/workflows/{id}/outcome``."""

    outcome: str


decode_outcome = msgspec.json.Decoder(OutcomeBody).decode
