"""An opt-in heap trace for finding what grows in a long-running gateway (``bench/soak.py
--tracemalloc``).

With ``TOKENPLANE_TRACEMALLOC=DIR`` in its environment, ``tokenplane serve`` starts
:mod:`tracemalloc` (``TOKENPLANE_TRACEMALLOC_FRAMES`` frames a trace, default 1) and writes a
snapshot to ``DIR/heap-PID-N.snap`` each time it receives SIGUSR2; ``python -m
tokenplane.gateway.heap_trace A.snap B.snap`` prints what grew between two of them. Off by default:
tracing every allocation roughly doubles the gateway's CPU per request.

``TOKENPLANE_TRACEMALLOC_GC=1`` adds, at each SIGUSR2, ``heap-PID-N.gc.txt``: what the collector's
generations hold, then what a full collection frees (by type, with the exceptions and frames among
it), and pymalloc's arena statistics on the log (``sys._debugmallocstats``). It collects, so it
changes what it measures: for finding cyclic garbage, not for RSS curves. With
``TOKENPLANE_TRACEMALLOC_FRAMES=0`` nothing is traced (no snapshots), for those reports alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tracemalloc
from pathlib import Path

__all__ = ["ENV", "diff", "install"]

ENV = "TOKENPLANE_TRACEMALLOC"


def install(loop: asyncio.AbstractEventLoop) -> Path | None:
    """Start tracing and dump a snapshot on SIGUSR2 when :data:`ENV` names a folder."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    frames = int(os.environ.get(ENV + "_FRAMES", "1"))
    if frames > 0:
        tracemalloc.start(frames)
    count = [0]

    def dump() -> None:
        count[0] += 1
        path = out / f"heap-{os.getpid()}-{count[0]:03d}.snap"
        if os.environ.get(ENV + "_GC"):
            _gc_report(path.with_suffix(".gc.txt"))
        if not tracemalloc.is_tracing():
            return
        snap = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
        snap.dump(str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)  # a reader never sees half a file

    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGUSR2, dump)
    return out


def _gc_report(path: Path) -> None:
    """What the collector holds (per generation, the commonest types), then what a full collection
    frees (by type): cyclic garbage waiting in an old generation is memory held for nothing."""
    import gc
    from collections import Counter

    sys.stderr.flush()
    sys._debugmallocstats()  # pymalloc's arenas and pools, to the log
    lines = [f"count {gc.get_count()} threshold {gc.get_threshold()} frozen {gc.get_freeze_count()}"]
    for gen in range(3):
        objs = gc.get_objects(gen)
        kinds = Counter(type(o).__qualname__ for o in objs)
        lines.append(f"gen{gen}: {len(objs)} {kinds.most_common(12)}")
        del objs
    lines.append(f"stats {gc.get_stats()}")
    gc.set_debug(gc.DEBUG_SAVEALL)
    freed = gc.collect()
    garbage = list(gc.garbage)
    gc.garbage.clear()
    gc.set_debug(0)
    kinds = Counter(type(o).__qualname__ for o in garbage)
    lines.append(f"collect() freed {freed}: {kinds.most_common(25)}")
    held: Counter[str] = Counter()
    for o in garbage:
        for r in gc.get_referents(o):
            name = type(r).__qualname__
            if name in ("AttemptRecord", "WorkflowSummary"):
                held[f"{name} <- {type(o).__qualname__}"] += 1
    lines.append(f"held by garbage {held.most_common(10)}")
    frames = Counter(
        f"{o.f_code.co_filename.rsplit('/', 2)[-1]}:{o.f_code.co_name}"
        for o in garbage
        if type(o).__name__ == "frame"
    )
    lines.append(f"frames {frames.most_common(15)}")
    tbs = Counter(type(o).__qualname__ for o in garbage if isinstance(o, BaseException))
    lines.append(f"exceptions {tbs.most_common(10)}")
    for o in garbage:
        if isinstance(o, BaseException):
            lines.append(f"example exception {o!r}")
            break
    del garbage
    path.write_text("\n".join(lines) + "\n")


def diff(before: Path, after: Path, top: int = 15, key: str = "lineno") -> list[str]:
    """The ``top`` allocation sites that grew most from ``before`` to ``after``."""
    a = tracemalloc.Snapshot.load(str(before))
    b = tracemalloc.Snapshot.load(str(after))
    stats = b.compare_to(a, key)
    return [str(s) for s in stats[:top]]


if __name__ == "__main__":  # pragma: no cover - a diagnostic command
    key = sys.argv[3] if len(sys.argv) > 3 else "lineno"
    for line in diff(Path(sys.argv[1]), Path(sys.argv[2]), key=key):
        print(line)
