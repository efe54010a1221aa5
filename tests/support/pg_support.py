"""The real PostgreSQL the tests use (127.0.0.1:5432, user postgres, trust), a fresh database each.

``fresh_database()`` creates ``tp_test_<random>`` and drops it afterwards (``WITH (FORCE)``: a
gateway process a test killed may still hold a connection). ``in_schema`` gives a URL whose
connections work in their own schema, for a fresh, empty ledger per test inside one database.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import psycopg

ADMIN_URL = os.environ.get("TOKENPLANE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def database_url(name: str, *, host: str = "127.0.0.1", port: int = 5432) -> str:
    return f"postgresql://postgres@{host}:{port}/{name}"


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new empty database for the block; yields its name."""
    name = "tp_test_" + uuid.uuid4().hex[:12]
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}".encode())
    try:
        yield name
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


def in_schema(url: str, schema: str) -> str:
    """``url`` whose sessions use (and first create) ``schema``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}".encode())
    return f"{url}?options={quote(f'-c search_path={schema}')}"
