"""Errors raised by the ledger.

Hierarchy::

    LedgerError
    ├── InvalidLedgerRecord   an attempt or outcome with impossible values (negative tokens, bad outcome)
    └── LedgerUnavailable     the backing database cannot be opened or written
        └── LedgerBufferFull  the database is away and the write queue is full: the write is dropped

A workflow another tenant owns, or one that does not exist, is not an error: reads return ``None``.
A constructor handed an impossible argument (``max_batch < 1``) raises a plain ``ValueError``.
"""


class LedgerError(Exception):
    """Base of every error the ledger raises."""


class InvalidLedgerRecord(LedgerError, ValueError):
    """An attempt or an outcome that cannot be recorded; the message names the field."""


class LedgerUnavailable(LedgerError):
    """The backing store failed (cannot open the file, disk full, locked past the timeout)."""


class LedgerBufferFull(LedgerUnavailable):
    """A write dropped: the store is unreachable and ``max_buffered`` writes are already queued."""
