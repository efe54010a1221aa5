"""A short, bounded run of ``bench/soak.py``: real gateway and emulator processes, mixed traffic and
seeded chaos (kills, crashes, stalls, errors, hangs, a gateway restart); every request must end in
an answer or a precise error, and what clients saw must match the workflow ledger. The long run is
the command (``python bench/soak.py --minutes 60 --json``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


def test_a_short_soak_with_chaos_loses_nothing(tmp_path: Path) -> None:
    args = [
        sys.executable,
        str(SOAK),
        "--seconds",
        "14",
        "--rps",
        "4",
        "--seed",
        "88",  # a schedule with seven kinds of fault in 14 s, a gateway restart among them
        "--instances",
        "3",
        "--chaos-gap-s",
        "1",
        "--no-baseline",
        "--sample-s",
        "1",
        "--workdir",
        str(tmp_path),
        "--json",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=150)
    assert proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["requests_sent"] > 20
    actions = {e["action"] for e in out["chaos_schedule"]}
    assert {"kill", "crash", "stall", "hang", "gateway_restart"} <= actions, actions
    assert all(e["end_t"] is not None for e in out["chaos_schedule"]), "a fault was never lifted"
    assert out["lost"] == 0, out
    assert out["terminal_outcomes"] == out["requests_sent"]
    assert out["ledger_mismatches"] == 0, out["ledger_mismatch_examples"]
    assert proc.returncode == 0, proc.stderr[-3000:]
