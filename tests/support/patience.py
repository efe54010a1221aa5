"""A test deadline that a frozen machine does not use up.

Under load these 2-core machines have been seen frozen for 10-30 s at a time: every process at once,
vmstat's own 1 s samples skipping. A wall-clock deadline can pass during such a freeze while the
system under test made no progress either, and the test fails for nothing. `Patience` counts each
gap between two polls as at most `step_cap_s`, so a freeze costs one step; a predicate that is
slow on its own (a scrape that times out) still uses the budget up.
"""

from __future__ import annotations

import time


class Patience:
    def __init__(self, timeout_s: float, step_cap_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self.step_cap_s = step_cap_s
        self.used_s = 0.0
        self._last = time.monotonic()

    def spent(self) -> bool:
        """Charge the time since the last call (at most one step) and say whether the budget is gone."""
        now = time.monotonic()
        self.used_s += min(now - self._last, self.step_cap_s)
        self._last = now
        return self.used_s > self.timeout_s
