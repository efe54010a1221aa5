"""Closed-form decode runs: the part of :class:`~tokenplane.sim.engine.ContinuousEngine` that
plans many decode-only steps at once.

Speed: simulated time must not cost wall time per token. While the batch is only decoding, its
composition cannot change until the next sequence finishes, the KV cache runs out or a request
arrives, so the engine plans the whole run of ``k`` steps at once: step ``j`` costs
``A + B * (C + j * n)`` (``n`` decoders, ``C`` tokens of context), which sums in closed form, and
the blocks the run allocates are counted per residue class of context length modulo the block
size. An arrival interrupts a run at the next step boundary.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from tokenplane.sim.kvcache import KVCache
from tokenplane.sim.records import InstanceRecord, TbtHistogram
from tokenplane.sim.sequence import DECODE, ScheduleFn, Seq, StepTimes


class DecodeRuns:
    """Mixin of :class:`~tokenplane.sim.engine.ContinuousEngine`: plans, interrupts and ends runs
    of decode-only steps. It keeps no state of its own; the engine's slots hold it."""

    bs: int
    kv: KVCache
    model: StepTimes
    record: InstanceRecord
    tbt: TbtHistogram
    dec_heap: list[tuple[int, int, int, Seq]]
    residues: list[int]
    n_dec: int
    sum_ctx: int
    dsteps: int
    slow: float
    version: int
    _schedule: ScheduleFn
    _in_run: bool
    _run_start: float
    _run_k: int
    _run_n: int
    _run_a: float
    _run_b: float
    _run_c: int
    _run_dropped: int

    if TYPE_CHECKING:

        def _plan(self, now: float) -> None: ...
        def _plan_step(self, now: float, force: bool = False) -> bool: ...
        def _finish_due(self, now: float) -> None: ...

    def _dec_blocks(self, k: int) -> int:
        """Blocks the decoders need to advance ``k`` more steps.

        A decoder whose context ``c`` has ``q = c % bs`` needs a new block at step ``i`` when
        ``(q + i) % bs == 1``: every ``bs`` steps, plus once more in the last ``k % bs`` steps iff
        ``(-q) % bs < k % bs``. Decoders are counted per residue ``r = (c - dsteps) % bs``, which
        stays fixed as both advance together, so ``q = (dsteps + r) % bs``.
        """
        bs = self.bs
        full, rem = divmod(k, bs)
        total = self.n_dec * full
        if rem:
            # The residues ``(-j - dsteps) % bs`` for ``j < rem`` form a cyclic window of ``rem``
            # entries ending at ``(-dsteps) % bs``: sum it as one or two slices.
            residues = self.residues
            end = (-self.dsteps) % bs + 1
            start = end - rem
            if start >= 0:
                total += sum(residues[start:end])
            else:
                total += sum(residues[:end]) + sum(residues[start:])
        return total

    def _completed_steps(self, now: float) -> int:
        """Steps of the decode run in flight that have finished by ``now``."""
        lo, hi = 0, self._run_k  # largest m with run_time(m) <= elapsed
        elapsed = now - self._run_start
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._run_time(mid) <= elapsed:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _plan_run(self, now: float) -> None:
        heap = self.dec_heap
        while heap and (heap[0][3].epoch != heap[0][1] or heap[0][3].state != DECODE):
            heapq.heappop(heap)
        k = heap[0][0] - self.dsteps
        avail = self.kv.available
        # Each decoder needs at most k // bs + 1 blocks in k steps: skip the exact count when even
        # that bound fits (the common case; _end_run counts exactly what it allocates).
        if self.n_dec * (k // self.bs + 1) > avail and self._dec_blocks(k) > avail:
            lo, hi = 0, k  # largest j with need(j) <= avail
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._dec_blocks(mid) <= avail:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            if k == 0:
                self._plan_step(now, force=True)
                return
        n, c, slow, model = self.n_dec, self.sum_ctx, self.slow, self.model
        a = model.linear_time(n) * slow
        b = model.decode_kv_s_per_token * slow
        self._run_dropped = 0
        self._run_start = now
        self._run_k = k
        self._run_n = n
        self._run_a = a
        self._run_b = b
        self._run_c = c
        self._in_run = True
        self._schedule(now + self._run_time(k), self._end_run, self.version)

    def _run_time(self, m: int) -> float:
        b = self._run_b
        return m * self._run_a + b * (m * self._run_c + self._run_n * m * (m - 1) / 2)

    def _interrupt(self, now: float, force: bool = False) -> None:
        """An arrival during a decode run: stop the run at the step boundary after ``now``."""
        elapsed = now - self._run_start
        if elapsed <= 0:
            m = 0
        else:
            b = self._run_b
            qa = b * self._run_n / 2
            qb = self._run_a + b * self._run_c - qa
            if qa > 0:
                m = math.ceil((-qb + math.sqrt(qb * qb + 4 * qa * elapsed)) / (2 * qa))
            else:
                m = math.ceil(elapsed / qb)
            k = self._run_k
            m = 0 if m < 0 else (k if m > k else m)
            while m > 0 and self._run_time(m - 1) >= elapsed:
                m -= 1
            while m < k and self._run_time(m) < elapsed:
                m += 1
        if m >= self._run_k and not force:
            return
        self.version += 1
        self._run_k = m
        self._schedule(self._run_start + self._run_time(m), self._end_run, self.version)

    def _end_run(self, now: float, version: object) -> None:
        if version != self.version:
            return
        k, n = self._run_k, self._run_n
        live = n - self._run_dropped  # decoders still in the batch (aborts leave the timing as planned)
        self._in_run = False
        if k:
            if not self.kv.allocate(self._dec_blocks(k)):  # pragma: no cover - planned to fit
                raise RuntimeError("decode run overran the KV cache")
            a, b, c = self._run_a, self._run_b, self._run_c
            first = a + b * c
            last = a + b * (c + (k - 1) * n)
            if last <= first * 1.02 or k < 4:
                self.tbt.add((first + last) / 2, k * live)
            else:
                quarter = k // 4
                for i in range(4):
                    steps = quarter if i < 3 else k - 3 * quarter
                    mid = a + b * (c + (i * quarter + steps / 2) * n)
                    self.tbt.add(mid, steps * live)
            self.dsteps += k
            self.sum_ctx += live * k
            self.record.steps += k
            self._finish_due(now)
        self._plan(now)
