"""Real Redis for the shared-state tests (see tests/support/redis_server.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
