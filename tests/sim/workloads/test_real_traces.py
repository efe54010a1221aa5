"""Checks against the real public traces; skipped when the traces folder is not available."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from tokenplane.sim.workloads.azure import AzureTrace
from tokenplane.sim.workloads.mooncake import MooncakeTrace
from tokenplane.sim.workloads.servegen import ServeGenWorkload
from tokenplane.sim.workloads.traces import ENV_VAR, traces_dir

pytestmark = pytest.mark.traces


def _need(relpath: str) -> Path:
    folder = traces_dir()
    if folder is None or not folder.is_dir():
        pytest.skip(f"public traces folder not found: set {ENV_VAR} or provide ../shared/traces")
    path = folder / relpath
    if not path.exists():
        pytest.skip(f"{path} is missing from the traces folder")
    return path


def test_real_mooncake_trace() -> None:
    specs = list(MooncakeTrace(_need("mooncake/conversation_trace.jsonl")).arrivals())
    assert len(specs) == 12_031
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(specs))
    assert 3400 < specs[-1].arrival_s < 3600
    assert all(len(s.block_hashes) <= s.prompt_tokens // 512 for s in specs)


def test_real_azure_trace() -> None:
    specs = list(AzureTrace(_need("azure-2023/AzureLLMInferenceTrace_conv.csv")).arrivals())
    assert len(specs) == 19_366
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(specs))
    assert 3400 < specs[-1].arrival_s < 3600


def test_real_servegen_models() -> None:
    folder = _need("servegen/reason/deepseek-r1")
    w = ServeGenWorkload(folder, clients=[0, 1, 2], time_scale=1 / 24, seed=0)
    specs = list(w.arrivals())
    assert specs
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(specs))
    assert specs[-1].arrival_s <= 24 * 3600 / 24
