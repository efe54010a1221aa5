"""The in-process gateway benchmark still drives the real request path: it runs, every answer it
counts was a 200 (it exits with an error otherwise), and it reports a CPU figure. Nothing is timed
against a bound here; the figures are the benchmark's to print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gateway_inproc.py"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_gateway_inproc_serves_every_request_through_the_front(stream: bool) -> None:
    args = [sys.executable, str(BENCH), "--n", "200", "--warmup", "50", "--rounds", "1", "--json"]
    if stream:
        args += ["--stream", "--chunks", "8", "--concurrency", "16"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["kind"] == ("stream" if stream else "non-stream")
    assert out["cpu_ms_per_req"] > 0
