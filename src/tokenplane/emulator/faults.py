"""Fault injection: plain data the server consults on every request.

``POST /admin/faults`` merges a :class:`FaultUpdate` into the instance's :class:`Faults`;
``{"clear": true}`` resets everything first (other fields in the same body then apply). Counted
faults (``error_count``, ``die_count``, ``hang_count``) are consumed one per request; ``null`` (the
default) means every request until cleared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field


class FaultUpdate(BaseModel):
    """Body of ``POST /admin/faults``; unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", strict=True)

    clear: bool = False
    die_after_tokens: int | None = Field(default=None, ge=0)
    die_count: int | None = Field(default=None, ge=1)
    exit_process: bool | None = None
    stall: bool | None = None
    """With ``die_after_tokens``: stop sending and hold the connection open (a hung sequence) instead of
    cutting it."""
    slow_factor: float | None = Field(default=None, gt=0)
    error_status: int | None = Field(default=None, ge=400, le=599)
    error_count: int | None = Field(default=None, ge=1)
    hang: bool | None = None
    hang_count: int | None = Field(default=None, ge=1)
    unhealthy: bool | None = None
    kv_lost: bool | None = None
    """P/D prefill role: the engine no longer holds the KV it handed over (decode pulls fail)."""
    exit_after_handover: bool | None = None
    """P/D prefill role: the process exits right after it answers a prefill (the KV is gone)."""


class DieFault(NamedTuple):
    """After ``tokens`` tokens: cut the connection, end the whole process, or go silent (``stall``)."""

    tokens: int
    exit_process: bool
    stall: bool


@dataclass(slots=True)
class Faults:
    die_after_tokens: int | None = None
    die_count: int | None = None
    exit_process: bool = False
    stall: bool = False
    slow_factor: float = 1.0
    error_status: int | None = None
    error_count: int | None = None
    hang: bool = False
    hang_count: int | None = None
    unhealthy: bool = False
    kv_lost: bool = False
    exit_after_handover: bool = False

    def apply(self, update: FaultUpdate) -> None:
        if update.clear:
            self.clear()
        fields = update.model_fields_set - {"clear"}
        if "die_after_tokens" in fields:
            self.die_after_tokens = update.die_after_tokens
            self.die_count = update.die_count
            self.exit_process = bool(update.exit_process)
            self.stall = bool(update.stall)
        if "error_status" in fields:
            self.error_status = update.error_status
            self.error_count = update.error_count
        if "hang" in fields:
            self.hang = bool(update.hang)
            self.hang_count = update.hang_count
        if update.slow_factor is not None:
            self.slow_factor = update.slow_factor
        if update.unhealthy is not None:
            self.unhealthy = update.unhealthy
        if update.kv_lost is not None:
            self.kv_lost = update.kv_lost
        if update.exit_after_handover is not None:
            self.exit_after_handover = update.exit_after_handover
        # Counts and flags given alone adjust the fault already set.
        if "die_count" in fields and "die_after_tokens" not in fields:
            self.die_count = update.die_count
        if "exit_process" in fields and "die_after_tokens" not in fields:
            self.exit_process = bool(update.exit_process)
        if "stall" in fields and "die_after_tokens" not in fields:
            self.stall = bool(update.stall)
        if "error_count" in fields and "error_status" not in fields:
            self.error_count = update.error_count
        if "hang_count" in fields and "hang" not in fields:
            self.hang_count = update.hang_count

    def clear(self) -> None:
        self.die_after_tokens = None
        self.die_count = None
        self.exit_process = False
        self.stall = False
        self.slow_factor = 1.0
        self.error_status = None
        self.error_count = None
        self.hang = False
        self.hang_count = None
        self.unhealthy = False
        self.kv_lost = False
        self.exit_after_handover = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    # -- consumed by the server, once per serving request -------------------------------------
    def take_error(self) -> int | None:
        """The status this request must answer with, or None."""
        status = self.error_status
        if status is None:
            return None
        if self.error_count is not None:
            self.error_count -= 1
            if self.error_count <= 0:
                self.error_status = None
                self.error_count = None
        return status

    def take_hang(self) -> bool:
        if not self.hang:
            return False
        if self.hang_count is not None:
            self.hang_count -= 1
            if self.hang_count <= 0:
                self.hang = False
                self.hang_count = None
        return True

    def take_die(self) -> DieFault | None:
        """How this request's answer must end early, else None."""
        n = self.die_after_tokens
        if n is None:
            return None
        die = DieFault(n, self.exit_process, self.stall)
        if self.die_count is not None:
            self.die_count -= 1
            if self.die_count <= 0:
                self.die_after_tokens = None
                self.die_count = None
                self.exit_process = False
                self.stall = False
        return die
