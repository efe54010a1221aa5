"""A command's child processes, read from ``/proc``: what a test checks is gone once the command
that started them was stopped."""

from __future__ import annotations

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
