"""Real Redis for the shared-state tests (see tests/support/redis_server.py)."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from redis_server import PrivateRedis, fresh_prefix


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
