"""The workflow hints a request may carry and what is stripped before forwarding (the rules are in
:mod:`tokenplane.gateway.workflows`' docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenplane.core.workflow_hints import HEADER_PREFIX

HINT_HEADERS = tuple(HEADER_PREFIX + f for f in ("workflow-id", "step", "total-steps", "deadline-s"))
PRIORITY_HEADER = HEADER_PREFIX + "priority"
_HINT_BODY_KEYS = ("metadata", "nvext", "vllm_xargs")
_METADATA_KEYS = ("workflow_id", "step", "total_steps", "deadline_s", "priority")


def is_int_text(v: str) -> bool:
    v = v.strip()
    return v.lstrip("+-").isdigit()


def has_hints(headers: Mapping[str, str], body: Mapping[str, Any]) -> bool:
    """Whether the request carries any workflow hint at all (the cheap test of the hot path)."""
    for k in _HINT_BODY_KEYS:
        if k in body:
            return True
    for h in HINT_HEADERS:
        if h in headers:
            return True
    p = headers.get(PRIORITY_HEADER)
    return p is not None and is_int_text(p)


def strip_hints(body: dict[str, Any]) -> None:
    """Remove, in place, the hint fields an upstream would not understand (module docstring)."""
    body.pop("nvext", None)
    md = body.get("metadata")
    if isinstance(md, dict):
        rest = {k: v for k, v in md.items() if k not in _METADATA_KEYS}
        if rest:
            body["metadata"] = rest
        else:
            del body["metadata"]
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict) and isinstance(xargs.get("agentic_context"), dict):
        rest = {k: v for k, v in xargs.items() if k != "agentic_context"}
        if rest:
            body["vllm_xargs"] = rest
        else:
            del body["vllm_xargs"]
