"""A command's child processes, read from ``/proc``, and a command stopped by SIGTERM: what a test
checks is gone once the command that started them was stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid...
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(proc.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@dataclass
class Stopped:
    returncode: int
    stderr: str
    started: set[int]  # the children seen before the signal
    left: list[int]  # those of them that outlived the command (killed since)


def stop_with_sigterm(cmd: list[str], children_at_least: int, *, after_s: float = 2.0) -> Stopped:
    """Run ``cmd`` until it has ``children_at_least`` children, ``after_s`` more, then SIGTERM it and
    wait for it to end. Children that outlive it are noted and killed (their process groups), so
    that a failing test leaves nothing running."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: set[int] = set()
    err = ""
    try:
        deadline = time.monotonic() + 60
        while len(started) < children_at_least:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            started |= children(proc.pid)
            time.sleep(0.1)
        time.sleep(after_s)
        assert proc.poll() is None, "the command ended before the signal"
        started |= children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = [pid for pid in started if alive(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return Stopped(proc.returncode, err, started, left)
