"""A short, bounded run of ``bench/soak.py``: real gateway and emulator processes, mixed traffic and
seeded chaos (kills, crashes, stalls, errors, hangs, a gateway restart); every request must end in
an answer or a precise error, and what clients saw must match the workflow ledger. The long run is
the command (``python bench/soak.py --minutes 60 --json``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from child_processes import stop_with_sigterm

SOAK = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


def _soak(
    tmp_path: Path, seed: int, *extra: str, timeout: float
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """A 14 s soak at 4 rps with a fault every second, no fault-free baseline; its JSON and process."""
    args = [
        sys.executable,
        str(SOAK),
        "--seconds",
        "14",
        "--rps",
        "4",
        "--seed",
        str(seed),
        "--chaos-gap-s",
        "1",
        *extra,
        "--no-baseline",
        "--sample-s",
        "1",
        "--workdir",
        str(tmp_path),
        "--json",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc


def _why(out: dict[str, Any]) -> str:
    """What a failure must show in full (a dict message is cut short by pytest's repr), with the
    errors the processes logged (CI keeps no work folder)."""
    keys = ("lost_reasons", "lost_examples", "failed_outcomes", "outcomes", "chaos_schedule")
    logged = []
    for log in sorted(Path(out["workdir"]).glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if " ERROR " in line or line.startswith("Traceback"):
                logged.append(f"{log.name}: " + "\n".join(lines[i : i + 25]))
    return json.dumps({k: out.get(k) for k in keys}, indent=1) + "\n" + "\n".join(logged[:6])


def _nothing_lost(out: dict[str, Any]) -> None:
    assert all(e["end_t"] is not None for e in out["chaos_schedule"]), "a fault was never lifted"
    assert out["requests_sent"] > 20
    assert out["lost"] == 0, _why(out)
    assert out["terminal_outcomes"] == out["requests_sent"]
    assert out["ledger_mismatches"] == 0, _why(out) + json.dumps(out["ledger_mismatch_examples"])


def test_a_short_soak_with_chaos_loses_nothing(tmp_path: Path) -> None:
    # seed 88: a schedule with seven kinds of fault in 14 s, a gateway restart among them
    out, proc = _soak(tmp_path, 88, "--instances", "3", timeout=150)
    actions = {e["action"] for e in out["chaos_schedule"]}
    assert {"kill", "crash", "stall", "hang", "gateway_restart"} <= actions, actions
    _nothing_lost(out)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_short_soak_of_three_replicas_on_redis_and_postgres_loses_nothing(tmp_path: Path) -> None:
    """Three ``tokenplane serve`` replicas share a private Redis (state) and a fresh PostgreSQL
    database (ledger, through a TCP proxy); the chaos restarts a replica, restarts Redis and cuts
    PostgreSQL off, besides the instance faults. The ledger is read back through one replica."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    # seed 1425: a replica restart, a Redis restart and a PostgreSQL cut among seven faults in 14 s
    out, proc = _soak(tmp_path, 1425, "--replicas", "3", "--redis", "--postgres", timeout=180)
    actions = {e["action"] for e in out["chaos_schedule"]}
    assert {"gateway_restart", "redis_restart", "pg_cut", "kill", "crash"} <= actions, actions
    assert out["stack"]["redis_restarts"] == 1
    _nothing_lost(out)
    sampled = {lt["process"] for lt in out["gateway_lifetimes"]}  # RSS and fds per replica process
    assert len(sampled) >= 2 and sampled <= {f"chaos-replica-{i}" for i in range(3)}, sampled
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_soak_stopped_by_sigterm_stops_what_it_started(tmp_path: Path) -> None:
    """Its gateways and emulators run in sessions of their own: a SIGTERM to the soak alone used to
    leave them all running."""
    cmd = [sys.executable, str(SOAK), "--seconds", "60", "--rps", "2", "--seed", "3", "--instances", "2",
           "--no-baseline", "--workdir", str(tmp_path), "--json"]  # fmt: skip
    stopped = stop_with_sigterm(cmd, children_at_least=3)  # the gateway and two emulators
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "stopped before the end" in stopped.stderr
    assert stopped.left == []
