"""Client workflow hints → a :class:`WorkflowContext` and a priority, or a clear error value.

Where the hints come from, highest precedence first (each field is taken from the first source
that carries it, so a client may mix sources):

1. Headers ``x-tokenplane-workflow-id``, ``x-tokenplane-step``, ``x-tokenplane-total-steps``,
   ``x-tokenplane-deadline-s``, ``x-tokenplane-priority`` (names case-insensitive).
2. The request body's ``metadata`` object, same keys without the prefix and with underscores
   (``workflow_id``, ``step``, ``total_steps``, ``deadline_s``, ``priority``). OpenAI's
   ``metadata`` holds strings only, so numbers may arrive as strings; both are accepted.
3. vLLM's ``vllm_xargs.agentic_context``. vLLM types ``vllm_xargs`` as a flat
   ``dict[str, str | int | float]``, so a nested object cannot pass vLLM's own validation: the
   context is accepted as a JSON-encoded string (what a vLLM client can send) or as an object.
   *Assumption* (no public schema found): its fields are ours without prefix, with the aliases
   ``session_id`` for ``workflow_id``, ``step_index`` for ``step`` and ``expected_steps`` for
   ``total_steps``.
4. Dynamo's ``nvext``: ``nvext.agent_hints.priority`` (an integer, higher is more urgent, as here)
   and ``nvext.agent_hints.osl`` (expected output tokens), per Dynamo's agent-hints docs;
   ``nvext.agent_context.session_id`` (one agent run) is taken as the workflow id. Dynamo has no
   step count or deadline. ``latency_sensitivity`` and ``speculative_prefill`` are ignored.

Semantics:

* ``deadline_s`` is **seconds from now** (the remaining budget of the whole task), not a wall-clock
  time: the client's and the gateway's clocks never need to agree. It becomes an absolute
  ``WorkflowContext.deadline_s`` in the shell's clock: ``now + value``.
* ``step`` is 1-based; ``step <= total_steps`` when both are given. Step fields and the deadline
  need a workflow id (they describe a task).
* Priority: the tenant's priority is the base. A client may always *lower* it. It may raise it only
  when the tenant allows (``allow_priority_raise``), and then at most to ``max_priority``; a
  request above what is allowed is not an error (clients written for Dynamo send priorities
  routinely), it is capped and ``priority_capped`` says so.

Invalid values give a :class:`HintError` naming the field as the client wrote it and why, for the
gateway to map to a 400; nothing here raises on client input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from tokenplane.core.views import WorkflowContext

__all__ = [
    "HEADER_PREFIX",
    "MAX_WORKFLOW_ID_LENGTH",
    "HintError",
    "HintsResult",
    "WorkflowHints",
    "parse_workflow_hints",
]

HEADER_PREFIX = "x-tokenplane-"
MAX_WORKFLOW_ID_LENGTH = 256
MAX_STEPS = 1_000_000

MIN_DEADLINE_S = 0.001
"""A shorter deadline is refused as invalid input: no request can be served in under a
millisecond, and a subnormal one (5e-324) added to a clock reading changes nothing, so it would
pass as a deadline already met and then fail as unreachable (a 503 for what is bad input)."""

_Field = Literal["workflow_id", "step", "total_steps", "deadline_s", "priority"]
_FIELDS: tuple[_Field, ...] = ("workflow_id", "step", "total_steps", "deadline_s", "priority")
_VLLM_ALIASES: Mapping[str, _Field] = {
    "workflow_id": "workflow_id",
    "session_id": "workflow_id",
    "step": "step",
    "step_index": "step",
    "total_steps": "total_steps",
    "expected_steps": "total_steps",
    "deadline_s": "deadline_s",
    "priority": "priority",
}


class WorkflowHints(msgspec.Struct, frozen=True):
    """What the hints said, after validation and the tenant's priority rule."""

    workflow: WorkflowContext | None
    priority: int
    requested_priority: int | None = None
    priority_capped: bool = False
    expected_output_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return True


class HintError(msgspec.Struct, frozen=True):
    """An invalid hint: ``field`` as the client wrote it (a header name or a body path)."""

    field: str
    message: str
    status: int = 400

    @property
    def ok(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


HintsResult = WorkflowHints | HintError


class _Bad(Exception):
    """Internal: carries a HintError out of nested validation; never escapes this module."""

    def __init__(self, error: HintError) -> None:
        super().__init__(str(error))
        self.error = error


def _fail(field: str, message: str) -> _Bad:
    return _Bad(HintError(field, message))


def _as_mapping(value: Any, where: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _fail(where, f"must be an object, got {type(value).__name__}")
    return value


def _collect(
    headers: Mapping[str, str], body: Mapping[str, Any] | None
) -> tuple[dict[_Field, tuple[str, Any]], tuple[str, Any] | None]:
    """Per field, the first (where, raw value) by precedence; plus Dynamo's ``osl``."""
    found: dict[_Field, tuple[str, Any]] = {}
    lowered = {k.lower(): (k, v) for k, v in headers.items()}
    for f in _FIELDS:
        name = HEADER_PREFIX + f.replace("_", "-")
        if name in lowered:
            found[f] = (name, lowered[name][1])
    if body is None:
        return found, None
    metadata = _as_mapping(body.get("metadata"), "metadata")
    if metadata is not None:
        for f in _FIELDS:
            if f in metadata and metadata[f] is not None:
                found.setdefault(f, (f"metadata.{f}", metadata[f]))
    xargs = _as_mapping(body.get("vllm_xargs"), "vllm_xargs")
    if xargs is not None and xargs.get("agentic_context") is not None:
        raw = xargs["agentic_context"]
        where = "vllm_xargs.agentic_context"
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise _fail(where, f"is a string but not valid JSON ({exc.msg})") from None
        ctx = _as_mapping(raw, where) or {}
        for key, f in _VLLM_ALIASES.items():
            if key in ctx and ctx[key] is not None:
                found.setdefault(f, (f"{where}.{key}", ctx[key]))
    osl: tuple[str, Any] | None = None
    nvext = _as_mapping(body.get("nvext"), "nvext")
    if nvext is not None:
        hints = _as_mapping(nvext.get("agent_hints"), "nvext.agent_hints")
        if hints is not None:
            if hints.get("priority") is not None:
                found.setdefault("priority", ("nvext.agent_hints.priority", hints["priority"]))
            if hints.get("osl") is not None:
                osl = ("nvext.agent_hints.osl", hints["osl"])
        context = _as_mapping(nvext.get("agent_context"), "nvext.agent_context")
        if context is not None and context.get("session_id") is not None:
            found.setdefault("workflow_id", ("nvext.agent_context.session_id", context["session_id"]))
    return found, osl


def _int(where: str, raw: Any, *, lo: int, hi: int) -> int:
    value: int
    if isinstance(raw, bool):
        raise _fail(where, f"must be an integer, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        if not (math.isfinite(raw) and raw.is_integer()):
            raise _fail(where, f"must be an integer, got {raw!r}")
        value = int(raw)
    elif isinstance(raw, str):
        text = raw.strip()
        try:
            value = int(text, 10)
        except ValueError:
            raise _fail(where, f"must be an integer, got {raw!r}") from None
    else:
        raise _fail(where, f"must be an integer, got {type(raw).__name__}")
    if not lo <= value <= hi:
        raise _fail(where, f"must be between {lo} and {hi}, got {value}")
    return value


def _seconds(where: str, raw: Any) -> float:
    value: float
    if isinstance(raw, bool):
        raise _fail(where, f"must be a number of seconds, got {raw!r}")
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            raise _fail(where, f"must be a number of seconds, got {raw!r}") from None
    else:
        raise _fail(where, f"must be a number of seconds, got {type(raw).__name__}")
    if not math.isfinite(value) or value < MIN_DEADLINE_S:
        raise _fail(where, f"must be a finite number of seconds >= {MIN_DEADLINE_S} (from now), got {raw!r}")
    return value


def _workflow_id(where: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise _fail(where, f"must be a string, got {type(raw).__name__}")
    value = raw.strip()
    if not value:
        raise _fail(where, "must not be empty")
    if len(value) > MAX_WORKFLOW_ID_LENGTH:
        raise _fail(where, f"must be at most {MAX_WORKFLOW_ID_LENGTH} characters, got {len(value)}")
    if not value.isprintable():
        raise _fail(where, "must contain printable characters only")
    return value


def parse_workflow_hints(
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    *,
    now: float,
    base_priority: int = 0,
    allow_priority_raise: bool = False,
    max_priority: int | None = None,
    priority_bound: int = 1_000,
) -> HintsResult:
    """Parse and validate a request's workflow hints (see the module docstring for the rules).

    ``now`` is the shell's clock (the gateway's monotonic time, the twin's virtual time), used to
    turn the relative ``deadline_s`` into an absolute one. ``base_priority`` is the tenant's;
    ``allow_priority_raise`` and ``max_priority`` are the tenant's policy. Priorities outside
    ``[-priority_bound, priority_bound]`` are rejected as nonsense.
    """
    try:
        found, osl = _collect(headers, body)
        workflow: WorkflowContext | None = None
        if "workflow_id" in found:
            wid = _workflow_id(*found["workflow_id"])
            step = _int(*found["step"], lo=1, hi=MAX_STEPS) if "step" in found else 1
            total: int | None = None
            if "total_steps" in found:
                where, raw = found["total_steps"]
                total = _int(where, raw, lo=1, hi=MAX_STEPS)
                if step > total:
                    raise _fail(where, f"must be >= the step ({step}), got {total}")
            deadline = now + _seconds(*found["deadline_s"]) if "deadline_s" in found else None
            workflow = WorkflowContext(workflow_id=wid, step=step, total_steps=total, deadline_s=deadline)
        else:
            for f in ("step", "total_steps", "deadline_s"):
                if f in found:
                    raise _fail(found[f][0], "needs a workflow id (x-tokenplane-workflow-id)")
        requested: int | None = None
        priority = base_priority
        capped = False
        if "priority" in found:
            requested = _int(*found["priority"], lo=-priority_bound, hi=priority_bound)
            if requested <= base_priority:
                priority = requested
            elif allow_priority_raise:
                priority = (
                    requested if max_priority is None else max(base_priority, min(requested, max_priority))
                )
                capped = priority < requested
            else:
                capped = True
        expected_out = _int(*osl, lo=1, hi=10_000_000) if osl is not None else None
    except _Bad as bad:
        return bad.error
    return WorkflowHints(
        workflow=workflow,
        priority=priority,
        requested_priority=requested,
        priority_capped=capped,
        expected_output_tokens=expected_out,
    )
