"""The ledger tests' PostgreSQL: one fresh database per test module (tests/support/pg_support.py)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from pg_support import database_url, fresh_database, in_schema


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """The module's database URL (created before its first test, dropped after its last)."""
    with fresh_database() as name:
        yield database_url(name)


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """A URL for an empty ledger: a fresh schema in the module's database."""
    return in_schema(pg_database, "t_" + uuid.uuid4().hex[:10])
