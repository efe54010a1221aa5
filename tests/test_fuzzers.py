"""The fuzzers' bounded run in CI: each harness under libFuzzer (atheris) for 10,000 inputs or one
minute, with a fixed seed, from its own seed corpus, in a subprocess; a crash (an exception or a
broken property) fails the test with libFuzzer's report, the traceback and the input.
``TOKENPLANE_FUZZ_SECONDS`` shortens or lengthens it (a quick local run: 5); the long runs, with a
fresh seed each, are ``python fuzz/run.py --seconds 600 TARGET``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

RUN = Path(__file__).resolve().parents[1] / "fuzz" / "run.py"
SECONDS = int(os.environ.get("TOKENPLANE_FUZZ_SECONDS", "60"))
RUNS = 10_000
"""With a fixed seed, the same inputs each time (up to SECONDS): CI's run catches regressions and
never a new discovery, which the long campaigns by command make."""


@pytest.mark.parametrize("target", ["request_parser", "sse_scanner"])
def test_a_short_fuzz_run_finds_no_crash(target: str, tmp_path: Path) -> None:
    repeatable = ["--seed", "1", "--runs", str(RUNS)]
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN),
            target,
            "--seconds",
            str(SECONDS),
            "--workdir",
            str(tmp_path),
            "--json",
            *repeatable,
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
    )
    assert proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert not out["crashed"], (out.get("input_base64"), out.get("log_tail"))
    assert out["executions"] > 20 and out["coverage_edges"] > 0, out
    assert proc.returncode == 0
