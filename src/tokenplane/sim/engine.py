"""A vLLM-like serving instance in virtual time: continuous batching over a paged KV cache.

Each engine step batches one token for every decoding sequence plus prefill chunks, under
``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens (chunked prefill). A waiting
request is admitted FCFS when a slot, token budget and KV blocks are free; its prompt's leading
cached blocks are reused (prefix caching), so only the rest is prefilled. When a decode step needs
a block and none is free, the newest running sequence is preempted and later recomputed (vLLM's
recompute preemption). Step time comes from a :class:`StepTimeModel`.

The engine is split by concept: :mod:`~tokenplane.sim.sequence` holds the request (:class:`Seq`) and
the limits (:class:`EngineConfig`), :mod:`~tokenplane.sim.decode_run` the closed-form runs of
decode-only steps (what keeps simulated time cheap in wall time) and
:mod:`~tokenplane.sim.seq_release` how a sequence leaves other than by finishing.
"""

from __future__ import annotations

import heapq
from collections import deque

import msgspec

from tokenplane.core.ttft import PoolTtft, free_kv_bytes
from tokenplane.core.views import InstanceView
from tokenplane.sim.decode_run import DecodeRuns
from tokenplane.sim.kvcache import KVCache
from tokenplane.sim.lora import AdapterSlots
from tokenplane.sim.records import InstanceRecord, TbtHistogram
from tokenplane.sim.seq_release import SeqRelease
from tokenplane.sim.sequence import DECODE as DECODE
from tokenplane.sim.sequence import DONE as DONE
from tokenplane.sim.sequence import PREFILL as PREFILL
from tokenplane.sim.sequence import WAITING as WAITING
from tokenplane.sim.sequence import EngineConfig as EngineConfig
from tokenplane.sim.sequence import FinishFn as FinishFn
from tokenplane.sim.sequence import ScheduleFn as ScheduleFn
from tokenplane.sim.sequence import Seq as Seq
from tokenplane.sim.sequence import StepTimes as StepTimes
from tokenplane.sim.sequence import TokenFn as TokenFn
from tokenplane.sim.sequence import _ignore_finish as _ignore_finish
from tokenplane.sim.workloads.base import RequestSpec

_replace = msgspec.structs.replace
_NO_ADAPTERS: frozenset[str] = frozenset()


class EngineWiring:
    """What either engine (this one, the static baseline's
    :class:`~tokenplane.sim.static_engine.StaticEngine`) shares with the fleet that drives it: where
    state changes and finished sequences go, and busy time. A mixin without ``__slots__``, like the others.
    """

    index: int
    changed: set[int]
    _on_finish: FinishFn
    record: InstanceRecord
    busy: bool
    busy_since: float

    def bind(self, index: int, changed: set[int], on_finish: FinishFn | None = None) -> None:
        """Report state changes as ``index`` into the fleet's shared ``changed`` set, and finished
        sequences to ``on_finish`` when given (the fleet that owns the engine)."""
        self.index = index
        self.changed = changed
        changed.add(index)
        if on_finish is not None:
            self._on_finish = on_finish

    def busy_seconds(self, now: float) -> float:
        return self.record.busy_s + (now - self.busy_since if self.busy else 0.0)


class ContinuousEngine(DecodeRuns, SeqRelease, EngineWiring):
    """One instance: owns its queue, batch and KV cache; the fleet drives it through events."""

    # Slots make the hot attribute reads cheap (more than 30 instance attributes do not fit a
    # shared-key instance dict); the mixins have no ``__slots__``, so instances keep a ``__dict__``
    # and subclasses and tests may add attributes.
    __slots__ = (
        "_batch",
        "_in_run",
        "_on_finish",
        "_run_a",
        "_run_b",
        "_run_c",
        "_run_dropped",
        "_run_k",
        "_run_n",
        "_run_start",
        "_schedule",
        "_schedule_late",
        "_step_dt",
        "_view_template",
        "bs",
        "busy",
        "busy_since",
        "capacity_tokens",
        "cfg",
        "changed",
        "dec_heap",
        "dsteps",
        "id",
        "index",
        "kv",
        "kv_bytes_per_token",
        "lora",
        "model",
        "n_dec",
        "on_token",
        "outstanding_tokens",
        "prefilling",
        "ready",
        "record",
        "residues",
        "running",
        "slow",
        "sum_ctx",
        "tbt",
        "ttft",
        "version",
        "waiting",
        "weights",
    )

    def __init__(
        self,
        instance_id: str,
        config: EngineConfig,
        step_times: StepTimes,
        *,
        schedule: ScheduleFn,
        on_finish: FinishFn | None = None,
        record: InstanceRecord,
        tbt: TbtHistogram,
        schedule_late: ScheduleFn | None = None,
        on_token: TokenFn | None = None,
        kv_bytes_per_token: int = 0,
        ttft: PoolTtft | None = None,
    ) -> None:
        self.id = instance_id
        # The view's seven-axis fields, as the gateway fills them: ``hbm_free_bytes`` from the free
        # KV cache (:func:`~tokenplane.core.ttft.free_kv_bytes`), ``predicted_ttft_s`` from the
        # pool's observed TTFT (the fleet shares one :class:`PoolTtft` per model; fed here at each
        # sequence's first token).
        self.kv_bytes_per_token = kv_bytes_per_token
        self.ttft = ttft if ttft is not None else PoolTtft()
        self.cfg = config
        self.model = step_times
        # Real-time use (the emulator) needs every token as it is produced: then the engine steps
        # one iteration at a time and reports each token through ``on_token``.
        self.on_token = on_token
        self.bs = config.block_size
        self.kv = KVCache(
            max(1, config.kv_capacity_tokens // config.block_size),
            config.block_size,
            prefix_caching=config.enable_prefix_caching,
        )
        self._schedule = schedule
        self._schedule_late = schedule_late or schedule
        self._on_finish: FinishFn = on_finish or _ignore_finish
        self.record = record
        self.tbt = tbt
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}  # admission order; newest last
        self.prefilling: dict[int, Seq] = {}
        self.dec_heap: list[tuple[int, int, int, Seq]] = []
        self.residues = [0] * self.bs
        self.n_dec = 0
        self.sum_ctx = 0
        self.dsteps = 0
        self.outstanding_tokens = 0
        self.version = 0
        self.busy = False
        self.busy_since = 0.0
        # the step or run in flight
        self._batch: list[tuple[Seq, int]] = []
        self._run_start = 0.0
        self._run_k = 0
        self._run_n = 0
        self._run_a = 0.0
        self._run_b = 0.0
        self._run_dropped = 0
        self.slow = 1.0  # step-time multiplier: a degraded GPU (thermal throttling, bad HBM, noisy host)
        self.ready = True  # accepts new work (false while lost, draining or warming up)
        self.weights = "warm"  # model-weight readiness (warm, warming, cold); set by the lifecycle
        self._run_c = 0
        self._step_dt = 0.0
        self._in_run = False
        self.index = 0
        self.changed: set[int] = set()
        self.capacity_tokens = self.kv.total_blocks * self.bs
        self.lora = AdapterSlots(config.max_adapters, config.adapter_load_s) if config.max_adapters else None
        self._view_template = InstanceView(
            instance_id=self.id,
            model=record.model,
            gpu=record.gpu,
            kv_capacity_tokens=self.capacity_tokens,
            price_per_hour=record.price_per_hour,
        )

    # -- public interface ----------------------------------------------------------------------
    def fits(self, spec: RequestSpec) -> bool:
        total = spec.prompt_tokens + spec.output_tokens
        if self.cfg.max_model_len is not None and total > self.cfg.max_model_len:
            return False
        return total <= self.capacity_tokens

    def submit(self, seq: Seq, now: float) -> None:
        if not self.kv.prefix_caching:
            seq.hashes, seq.nbh, seq.hblock = (), 0, 1
        seq.sent_s = now
        seq.waiting_ahead = len(self.waiting)
        self.waiting.append(seq)
        self.outstanding_tokens += seq.spec.prompt_tokens + seq.info.max_output_tokens
        self.changed.add(self.index)
        if not self.busy:
            # Plan from an event queued behind everything already due now, so that requests
            # arriving at the same instant share the first step.
            self._start_busy(now)
            self.version += 1
            self._schedule_late(now, self._wake, self.version)
        elif self._in_run and len(self.running) < self.cfg.max_num_seqs:
            self._interrupt(now)

    def set_slow(self, factor: float, now: float) -> None:
        """Multiply step times by ``factor`` from the next step boundary on."""
        self.slow = factor
        if self.busy and self._in_run:
            self._interrupt(now, force=True)

    def view(self) -> InstanceView:
        # Views are rebuilt at every state change the router may see: copy the fields that never
        # change from a template (cheaper than building all of them, labels' factory included).
        running, waiting = len(self.running), len(self.waiting)
        usage = self.kv.usage
        weights = self.weights
        return _replace(
            self._view_template,
            ready=self.ready,
            outstanding_requests=running + waiting,
            outstanding_tokens=self.outstanding_tokens,
            running=running,
            waiting=waiting,
            kv_usage=usage,
            weights=weights,
            hbm_free_bytes=free_kv_bytes(self.capacity_tokens, usage, self.kv_bytes_per_token),
            predicted_ttft_s=self.ttft.view_ttft_s(waiting, weights),
            adapters=self.lora.view if self.lora is not None else _NO_ADAPTERS,
        )

    def cached_prefix_tokens(self, spec: RequestSpec) -> int:
        """Leading prompt tokens of ``spec`` this engine's prefix cache holds now (what a prefill
        would reuse): the exact figure the gateway reads from vLLM's KV events."""
        hb = spec.hash_block_tokens
        hashes = spec.block_hashes
        if not hashes or hb < self.bs or hb % self.bs:
            return 0
        return self.kv.match(hashes, (spec.prompt_tokens - 1) // hb) * hb

    # -- KV helpers ----------------------------------------------------------------------------
    # -- planning ------------------------------------------------------------------------------
    def _start_busy(self, now: float) -> None:
        self.busy = True
        self.busy_since = now

    def _plan(self, now: float) -> None:
        self.changed.add(self.index)
        self.version += 1
        can_prefill = self.prefilling or (self.waiting and len(self.running) < self.cfg.max_num_seqs)
        if can_prefill and self._plan_step(now):
            return
        if self.n_dec:
            if self.on_token is None:
                self._plan_run(now)
            else:
                self._plan_step(now, force=True)
            return
        if self.waiting or self.prefilling:  # stuck on KV with nothing decoding: make room
            self._plan_step(now, force=True)
            return
        self.busy = False
        self.record.busy_s += now - self.busy_since

    def _plan_step(self, now: float, force: bool = False) -> bool:
        """Plan one mixed step; False when it would only decode (then a run is cheaper)."""
        kv, bs, cfg = self.kv, self.bs, self.cfg
        need_dec = self.residues[(-self.dsteps) % bs]  # _dec_blocks(1), inlined: once per step
        while need_dec > kv.available and self.running:
            self._preempt_newest(now)
            need_dec = self.residues[(-self.dsteps) % bs]
        budget = cfg.max_num_batched_tokens - self.n_dec
        batch: list[tuple[Seq, int]] = []
        pairs = 0
        if not kv.allocate(need_dec):  # pragma: no cover - guarded by the loop above
            raise RuntimeError("decode blocks unavailable after preemption")
        for seq in self.prefilling.values():  # the loop leaves ``prefilling`` as it is
            if budget <= 0:
                break
            p = seq.computed
            c = min(seq.prompt - p, budget)
            need = -(-(p + c) // bs) - seq.held * seq.nbh - seq.own_held - seq.private
            if not kv.allocate(need):
                break
            seq.private += need
            batch.append((seq, c))
            budget -= c
            pairs += c * p + c * (c + 1) // 2
        waiting = self.waiting
        lora = self.lora
        stall = 0.0  # adapter loads this step
        while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = waiting[0]
            adapter = seq.spec.adapter if lora is not None else None
            if adapter and lora is not None and not lora.can_admit(adapter):
                break  # every slot is used by running requests: wait (FCFS)
            n = m = 0
            if seq.hashes:
                n = kv.match(seq.hashes, (seq.prompt - 1) // seq.hblock)
                if n:
                    kv.acquire(seq.hashes[:n])
            if seq.own and n == len(seq.hashes):  # its own blocks that survived a preemption
                m = kv.match(seq.own, (seq.prompt - 1) // bs - n * seq.nbh)
                kv.acquire(seq.own[:m])
            hit = n * seq.hblock + m * bs
            if seq.remote:  # its KV arrived from a prefill instance: only the rest is computed
                hit = seq.remote
            c = min(seq.prompt - hit, budget)
            held = n * seq.nbh + m + seq.private
            need = -(-(hit + c) // bs) - held
            # vLLM's scheduler_reserve_full_isl: admitted only if its whole prompt fits now.
            full = -(-seq.prompt // bs) - held if cfg.reserve_full_prompt else 0
            if full > kv.available or not kv.allocate(need):
                kv.release(seq.hashes[:n])
                kv.release(seq.own[:m])
                break
            waiting.popleft()
            if adapter and lora is not None:
                loads = lora.loads
                stall += lora.admit(adapter)
                self.record.adapter_loads += lora.loads - loads
            seq.held, seq.own_held = n, m
            seq.private += need  # 0 before, unless blocks were reserved for a KV transfer
            seq.computed = hit
            seq.state = PREFILL
            self.running[seq.uid] = seq
            self.prefilling[seq.uid] = seq
            rec = seq.record
            if rec.scheduled_s is None:
                rec.scheduled_s = now
                rec.prefix_hit_tokens = hit
            batch.append((seq, c))
            budget -= c
            pairs += c * hit + c * (c + 1) // 2
        if not batch and (not force or not self.n_dec):
            kv.release_private(need_dec)
            if not force:
                return False
            if self.running:
                self._preempt_newest(now)
                return self._plan_step(now, force=True)
            # Nothing runs, nothing is reclaimable and the head still does not fit: cannot happen
            # for requests that passed fits(); fail loudly rather than spin.
            raise RuntimeError(f"{self.id}: head request cannot be scheduled on an empty engine")
        num_tokens = cfg.max_num_batched_tokens - budget  # decoders plus every chunk in the batch
        model = self.model
        dt = model.linear_time(num_tokens) + model.decode_kv_s_per_token * self.sum_ctx
        dt = (dt + model.prefill_s_per_pair * pairs) * self.slow + stall
        self._batch = batch
        self._run_n = self.n_dec
        self._step_dt = dt
        self._in_run = False
        self._schedule(now + dt, self._end_step, self.version)
        return True

    # -- event handlers ------------------------------------------------------------------------
    def _wake(self, now: float, version: object) -> None:
        if version == self.version:
            self._plan(now)

    def _end_step(self, now: float, version: object) -> None:
        if version != self.version:
            return
        self.dsteps += 1
        self.sum_ctx += self._run_n
        self.record.steps += 1
        if self._run_n:
            self.tbt.add(self._step_dt, self._run_n)
            if self.on_token is not None:
                emit = self.on_token
                for seq in list(self.running.values()):
                    if seq.state == DECODE and seq.step0 < self.dsteps:
                        emit(seq, now)
        kv = self.kv
        for seq, c in self._batch:
            if seq.state != PREFILL:  # aborted while the step ran
                continue
            seq.computed += c
            if seq.hashes:
                upto = min(len(seq.hashes), seq.computed // seq.hblock)
                nbh = seq.nbh
                for h in seq.hashes[seq.held : upto]:
                    kv.register(h, nbh)
                    seq.private -= nbh
                if upto > seq.held:
                    seq.held = upto
            if seq.computed >= seq.prompt:
                del self.prefilling[seq.uid]
                # The step that completes a prefill samples a token; after a recompute
                # preemption that is the request's next token, not its first.
                seq.generated += 1
                if seq.generated == 1:  # this attempt's first token (not one after a preemption)
                    self.ttft.observe(now - seq.sent_s, seq.waiting_ahead, now=now)
                if seq.record.first_token_s is None:
                    seq.record.first_token_s = now
                else:
                    self.tbt.add(now - seq.last_token_s, 1)
                if self.on_token is not None:
                    self.on_token(seq, now)
                if seq.generated >= seq.spec.output_tokens:
                    self._finish(seq, now)
                    continue
                seq.state = DECODE
                seq.step0 = self.dsteps
                seq.ctx0 = seq.computed
                seq.finish_step = self.dsteps + seq.spec.output_tokens - seq.generated
                seq.residue = (seq.ctx0 - self.dsteps) % self.bs
                self.residues[seq.residue] += 1
                self.n_dec += 1
                self.sum_ctx += seq.ctx0
                heapq.heappush(self.dec_heap, (seq.finish_step, seq.epoch, seq.uid, seq))
        self._batch = []
        self._finish_due(now)
        self._plan(now)

    def _finish_due(self, now: float) -> None:
        heap = self.dec_heap
        while heap and heap[0][0] <= self.dsteps:
            _, epoch, _, seq = heapq.heappop(heap)
            if seq.epoch != epoch or seq.state != DECODE:
                continue
            self._finish(seq, now)

    def _finish(self, seq: Seq, now: float) -> None:
        self._release(seq)
        seq.state = DONE
        self.outstanding_tokens -= seq.spec.prompt_tokens + seq.info.max_output_tokens
        self.changed.add(self.index)
        self._on_finish(seq, now)
