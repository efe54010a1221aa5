"""The fake Kubernetes API server for pods (tests/support/kube_pods.py) as a fixture."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from kube_pods import FakePodApi


@pytest.fixture
async def pod_api(anyio_backend: str) -> AsyncIterator[FakePodApi]:
    api = FakePodApi()
    await api.start()
    try:
        yield api
    finally:
        await api.stop()
