"""How a sequence leaves a :class:`~tokenplane.sim.engine.ContinuousEngine` other than by
finishing: released (its KV blocks freed), preempted (vLLM's recompute preemption), aborted (its
client went away) or lost with the whole instance."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from tokenplane.sim.kvcache import KVCache
from tokenplane.sim.lora import AdapterSlots
from tokenplane.sim.records import InstanceRecord
from tokenplane.sim.sequence import DECODE, DONE, WAITING, Seq


class SeqRelease:
    """Mixin of :class:`~tokenplane.sim.engine.ContinuousEngine`; the engine's slots hold the state."""

    bs: int
    kv: KVCache
    lora: AdapterSlots | None
    record: InstanceRecord
    waiting: deque[Seq]
    running: dict[int, Seq]
    prefilling: dict[int, Seq]
    dec_heap: list[tuple[int, int, int, Seq]]
    residues: list[int]
    n_dec: int
    sum_ctx: int
    dsteps: int
    outstanding_tokens: int
    version: int
    busy: bool
    busy_since: float
    index: int
    changed: set[int]
    _in_run: bool
    _run_n: int
    _run_dropped: int
    _batch: list[tuple[Seq, int]]

    if TYPE_CHECKING:

        def _completed_steps(self, now: float) -> int: ...

    def fail_all(self, now: float) -> list[Seq]:
        """The instance is lost: every request in it fails and its KV cache is gone."""
        lost = [*self.running.values(), *self.waiting]
        done_steps = self._completed_steps(now) if self._in_run else 0
        for seq in lost:
            if seq.state == DECODE:  # count what it streamed before the loss
                seq.generated += self.dsteps + done_steps - seq.step0
            seq.state = DONE
            seq.epoch += 1
        self.running.clear()
        self.prefilling.clear()
        self.waiting.clear()
        self.dec_heap.clear()
        self.residues = [0] * self.bs
        self.n_dec = self.sum_ctx = 0
        self.outstanding_tokens = 0
        self.kv = KVCache(self.kv.total_blocks, self.bs, prefix_caching=self.kv.prefix_caching)
        if self.lora is not None:
            self.lora.clear()
        self.version += 1
        if self.busy:
            self.busy = False
            self.record.busy_s += now - self.busy_since
        self._in_run = False
        self._batch = []
        self.changed.add(self.index)
        return lost

    def abort(self, seq: Seq, now: float) -> bool:
        """Drop a request (its client went away); False if it already finished."""
        if seq.state == DONE:
            return False
        if seq.state == WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                return False
            if seq.private:  # blocks reserved for a KV transfer
                self.kv.release_private(seq.private)
                seq.private = 0
        else:
            inflight = int(seq.state == DECODE and self.busy and not self._in_run)
            if inflight:
                self._run_n -= 1
            elif seq.state == DECODE and self._in_run:
                # The planned run keeps its timing; its end must not advance this sequence.
                self._run_dropped += 1
            self._release(seq, inflight)
        seq.state = DONE
        self.outstanding_tokens -= seq.spec.prompt_tokens + seq.info.max_output_tokens
        self.changed.add(self.index)
        if not self.running and not self.waiting and self.busy:
            self.version += 1  # cancel the planned step; nothing is left to run
            self.busy = False
            self.record.busy_s += now - self.busy_since
        return True

    def _release(self, seq: Seq, inflight: int = 0, park: tuple[int, ...] = ()) -> None:
        """Free what ``seq`` holds; ``inflight=1`` when a planned step already allocated for it.
        ``park``: its own full blocks to keep cached (a preemption), in chain order."""
        kv = self.kv
        if seq.state == DECODE:
            ctx = seq.ctx0 + (self.dsteps - seq.step0)
            private = -(-(ctx + inflight) // self.bs) - seq.held * seq.nbh - seq.own_held
            self.residues[seq.residue] -= 1
            self.n_dec -= 1
            self.sum_ctx -= ctx
            seq.generated += self.dsteps - seq.step0
        else:
            private = seq.private
        kv.release_private(private)
        # Deepest first, as vLLM frees a request's blocks: its leading blocks are evicted last.
        kv.park(park)
        kv.release(seq.own[: seq.own_held])
        if seq.held:
            kv.release(seq.hashes[: seq.held])
        seq.private = 0
        seq.held = 0
        seq.own_held = 0
        seq.epoch += 1
        if self.running.pop(seq.uid, None) is not None and self.lora is not None and seq.spec.adapter:
            self.lora.release(seq.spec.adapter)
        self.prefilling.pop(seq.uid, None)

    def _own_blocks(self, seq: Seq) -> tuple[int, ...]:
        """Ids of ``seq``'s full blocks past its content hashes (its prompt's rest and what it
        generated), when prefix caching is on and its content hashes are all cached: vLLM hashes
        every full block of a request, so a preempted one finds its own blocks again on resume
        unless they were evicted meanwhile. The ids are unique to the sequence and the block index."""
        if not self.kv.prefix_caching or seq.held < len(seq.hashes):
            return ()
        ctx = seq.ctx0 + (self.dsteps - seq.step0) if seq.state == DECODE else seq.computed
        base = len(seq.hashes) * seq.nbh
        return tuple(hash((-7, seq.uid, k)) for k in range(base, ctx // self.bs))

    def _preempt_newest(self, now: float) -> None:
        uid = next(reversed(self.running))
        seq = self.running[uid]
        if seq.state == DECODE:
            seq.last_token_s = now  # preemption happens at a step boundary, when it last emitted
        own = self._own_blocks(seq)
        self._release(seq, park=own[seq.own_held :])
        seq.own = own
        seq.prompt = seq.spec.prompt_tokens + seq.generated
        seq.computed = 0
        seq.remote = 0  # its transferred KV is gone with the blocks: recompute it here
        seq.state = WAITING
        seq.record.preemptions += 1
        self.waiting.appendleft(seq)
