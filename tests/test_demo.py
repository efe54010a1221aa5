"""The main job end to end: real emulator and gateway processes, the official openai client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from child_processes import alive, children

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
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenplane", "up", "--instances", "2", "--users", "2", "--tasks", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(started) < 3:  # two emulators and the gateway
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            started |= children(proc.pid)
            time.sleep(0.1)
        time.sleep(2.0)  # the users are under way
        assert proc.poll() is None, "up ended before the signal: give it more tasks"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        left = [pid for pid in started if alive(pid)]
        for pid in left:  # not to leave them running when the checks below fail
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM" in err
    assert left == []
