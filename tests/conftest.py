"""Fixtures for every test folder: the machine's real Redis under a fresh key prefix, and a private
``redis-server`` a test may kill (tests/support/redis_server.py). Tests never fake Redis."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from redis_server import PrivateRedis, fresh_prefix


@pytest.fixture
def key_prefix() -> Iterator[str]:
    with fresh_prefix() as prefix:
        yield prefix


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis()
    server.start()
    yield server
    with contextlib.suppress(Exception):
        server.kill()
