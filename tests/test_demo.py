"""The main job end to end: real emulator and gateway processes, the official openai client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from child_processes import stop_with_sigterm

from tokenplane.demo import run_demo


def test_demo_routes_tasks_by_prefix_and_spreads_users(tmp_path: Path) -> None:
    result = asyncio.run(run_demo(instances=2, users=6, steps=3, speed=4.0, workdir=tmp_path))
    assert result.errors == 0
    assert result.requests == 18 and result.tasks_completed == 6
    assert result.route_reasons.get("prefix_match", 0) >= 6
    assert sum(result.route_reasons.values()) == 18
    # later steps of a task reuse its growing prefix on the instance that holds it
    assert result.cached_tokens > 0.5 * result.prompt_tokens
    served = [info.get("requests", 0) for info in result.per_instance.values()]
    assert len(served) == 2 and all(n > 0 for n in served), served
    assert result.ttft_p50_s is not None and result.ttft_p50_s > 0


def test_up_command_ends_by_itself_with_a_summary(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenplane",
            "up",
            "--instances",
            "2",
            "--users",
            "4",
            "--steps",
            "2",
            "--speed",
            "4",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "routing decisions by reason" in proc.stdout
    data = json.loads((tmp_path / "up.json").read_text())
    assert data["requests"] == 8 and data["errors"] == 0


def test_up_stopped_by_sigterm_stops_the_fleet_it_started() -> None:
    """Each emulator and the gateway run in a session of their own: a SIGTERM to ``tokenplane up``
    (a supervisor, ``timeout``, ``kill``) used to end it and leave them all running."""
    cmd = [sys.executable, "-m", "tokenplane", "up", "--instances", "2", "--users", "2", "--tasks", "50"]
    stopped = stop_with_sigterm(cmd, children_at_least=3)  # two emulators and the gateway
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "stopped by SIGTERM" in stopped.stderr
    assert stopped.left == []
