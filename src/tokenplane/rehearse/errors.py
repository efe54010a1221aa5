"""Errors of the rehearsal: a run the live shell cannot reproduce, or a live side that failed."""

from __future__ import annotations


class RehearsalError(Exception):
    """A rehearsal that cannot run as asked (the message says why and what would)."""
