"""Versioned schema migrations for the PostgreSQL ledger.

The migrations are the files ``tokenplane/ledger/migrations/NNNN_name.sql``, applied in the order
of their number, each in its own transaction, and recorded in ``ledger_migrations`` (version, name,
when). A migration already recorded is never run again, so a file, once released, is never edited:
a change is a new file. Several replicas starting at once serialise on a transaction-level advisory
lock, so each migration runs exactly once however many open the database together.
"""

from __future__ import annotations

import re
from importlib import resources

import psycopg

__all__ = ["MIGRATIONS_LOCK", "Migration", "applied_versions", "apply_migrations", "migrations"]

MIGRATIONS_LOCK = 0x746B6E706C6E6D67
"""The advisory lock key the migration runner holds (``tknplnmg`` in ASCII)."""

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS ledger_migrations (
    version INTEGER NOT NULL PRIMARY KEY,
    name VARCHAR(200) NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


class Migration:
    __slots__ = ("name", "sql", "version")

    def __init__(self, version: int, name: str, sql: str) -> None:
        self.version = version
        self.name = name
        self.sql = sql


def migrations() -> list[Migration]:
    """The migrations shipped in the package, in order; numbering must run 1, 2, 3... without gaps."""
    out = []
    for entry in resources.files("tokenplane.ledger").joinpath("migrations").iterdir():
        m = _NAME.match(entry.name)
        if m is None:
            continue
        out.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    out.sort(key=lambda m: m.version)
    for i, mig in enumerate(out, start=1):
        if mig.version != i:
            raise RuntimeError(f"ledger migrations: expected version {i}, found {mig.version} ({mig.name})")
    return out


def applied_versions(conn: psycopg.Connection) -> list[int]:
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('ledger_migrations') IS NOT NULL")
        row = cur.fetchone()
        if row is None or not row[0]:
            return []
        cur.execute("SELECT version FROM ledger_migrations ORDER BY version")
        return [int(r[0]) for r in cur.fetchall()]


def apply_migrations(conn: psycopg.Connection) -> list[int]:
    """Bring the connection's schema (its ``search_path``) up to date; returns the versions applied now.

    ``conn`` must be in autocommit mode: each migration gets its own transaction.
    """
    applied_now: list[int] = []
    for m in migrations():
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATIONS_LOCK,))
            cur.execute(_CREATE_TABLE)
            cur.execute("SELECT 1 FROM ledger_migrations WHERE version = %s", (m.version,))
            if cur.fetchone() is not None:
                continue
            cur.execute(m.sql.encode())  # several statements: simple query protocol, no parameters
            cur.execute("INSERT INTO ledger_migrations (version, name) VALUES (%s, %s)", (m.version, m.name))
            applied_now.append(m.version)
    return applied_now
