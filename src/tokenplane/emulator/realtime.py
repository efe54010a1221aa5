"""Drive the twin's virtual-time engine from the asyncio loop in real time.

Virtual seconds map to the loop clock by one fixed affine map taken at start:
``virtual = (loop.time() - t0) * speed``. An engine event due at virtual ``at`` is handed to
``loop.call_at(t0 + at / speed)`` and, when it fires, receives ``at`` itself (its ideal time), so a
late callback does not push every later step back: the schedule never drifts from the loop clock,
and when the loop falls behind it catches up. Arrivals read :meth:`RealtimeClock.now`, computed
from the loop clock on each call (never smaller than the last event handed to the engine, so the
engine never sees time run backwards; asyncio may run a timer up to one clock tick early).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class RealtimeClock:
    __slots__ = ("_last", "_loop", "speed", "t0")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, speed: float = 1.0) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self.speed = float(speed)
        self.t0 = self._loop.time()
        self._last = 0.0

    def now(self) -> float:
        """Current virtual time in seconds."""
        v = (self._loop.time() - self.t0) * self.speed
        if v < self._last:
            return self._last
        self._last = v
        return v

    def to_real(self, virtual_s: float) -> float:
        """Seconds of wall time that ``virtual_s`` virtual seconds take."""
        return virtual_s / self.speed

    def schedule(self, at: float, callback: Callable[[float, Any], None], arg: Any = None) -> None:
        """Run ``callback(at, arg)`` on the loop when virtual time reaches ``at``."""
        self._loop.call_at(self.t0 + at / self.speed, self._fire, at, callback, arg)

    def _fire(self, at: float, callback: Callable[[float, Any], None], arg: Any) -> None:
        if at > self._last:
            self._last = at
        else:
            at = self._last
        callback(at, arg)
