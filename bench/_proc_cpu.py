"""A process's CPU time from ``/proc``, for the benches that measure the gateway from outside:
one process, or a process and its descendants (``serve --workers``' supervisor and workers)."""

from __future__ import annotations

import contextlib
import os


def proc_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process (all its threads), from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        s = f.read()
    fields = s[s.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    out: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            kids = []
        out += kids
        frontier += kids
    return out


def cpu_s(pids: list[int], *, tree: bool = False) -> float:
    """CPU seconds of ``pids`` summed (with every descendant's if ``tree``); a process that just
    exited counts nothing."""
    if tree:
        pids = [p for top in pids for p in (top, *descendants(top))]
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += proc_cpu_s(pid)
    return total
