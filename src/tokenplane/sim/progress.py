"""A progress bar in simulated seconds for long twin runs; a no-op when off or not on a terminal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = ["ProgressReporter", "progress_bar"]

#: Wall seconds between two redraw requests; updates in between only store the value.
_MIN_INTERVAL_S = 0.1


class ProgressReporter(Protocol):
    def update(self, sim_time_s: float) -> None: ...


class _NullProgress:
    """Costs one method call per update."""

    __slots__ = ()

    def update(self, sim_time_s: float) -> None:
        return None


class _RichProgress:
    __slots__ = ("_last_wall", "_progress", "_task", "latest_s")

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task
        self._last_wall = 0.0
        self.latest_s = 0.0

    def update(self, sim_time_s: float) -> None:
        self.latest_s = sim_time_s
        now = time.monotonic()
        if now - self._last_wall >= _MIN_INTERVAL_S:
            self._last_wall = now
            self._progress.update(self._task, completed=sim_time_s)

    def flush(self) -> None:
        self._progress.update(self._task, completed=self.latest_s)


@contextmanager
def progress_bar(
    total_s: float | None, enabled: bool, *, console: Console | None = None, description: str = "simulating"
) -> Iterator[ProgressReporter]:
    """Yield an object whose ``update(sim_time_s)`` moves a bar of simulated seconds out of ``total_s``.

    When ``enabled`` is false, or the console is not a terminal, the object does nothing.
    ``total_s=None`` shows an open-ended bar. Redraws are throttled to about ten a second.
    """
    if not enabled:
        yield _NullProgress()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = console if console is not None else Console(stderr=True)
    if not console.is_terminal:
        yield _NullProgress()
        return
    total_text = "?" if total_s is None else f"{total_s:,.0f}"
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} / " + total_text + " sim s"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total_s)
        reporter = _RichProgress(progress, task)
        try:
            yield reporter
        finally:
            reporter.flush()
