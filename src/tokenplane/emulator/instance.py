"""One emulated GPU instance: the twin's continuous-batching engine, run in real time.

:class:`EmulatedInstance` owns the engine, the real-time clock, the metrics and the in-flight
requests; the HTTP layer submits :class:`Pending` requests and awaits their tokens.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from tokenplane.core.views import RequestInfo
from tokenplane.emulator.faults import Faults
from tokenplane.emulator.kv_events import JournaledKVCache
from tokenplane.emulator.kv_transfer import KvTransfer, KvTransferConfig, KvTransferMetrics
from tokenplane.emulator.metrics import VllmMetrics
from tokenplane.emulator.realtime import RealtimeClock
from tokenplane.sim.catalog import Catalog, kv_capacity_tokens
from tokenplane.sim.engine import ContinuousEngine, EngineConfig, Seq, StepTimes
from tokenplane.sim.perf_model import StepTimeModel
from tokenplane.sim.records import InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.workloads.base import RequestSpec

BLOCK_TOKENS = 16  # prefix-hash block = engine block, so every full block of the prompt can hit


@dataclass(frozen=True, slots=True)
class EmulatorSettings:
    """What one emulated instance is: hardware, model, engine limits and pace.

    ``kv_capacity_tokens=None`` sizes the KV cache as vLLM would on ``tp`` x ``gpu`` at 90 % memory;
    ``fixed_step_s`` replaces the calibrated step-time model by a constant step (tests, demos);
    ``speed`` > 1 runs virtual time faster than the wall clock.
    """

    gpu: str = "H100"
    model: str = "llama-3-8b"
    served_model_name: str | None = None
    tp: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    kv_capacity_tokens: int | None = None
    speed: float = 1.0
    seed: int = 0
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    default_max_tokens: int = 256
    max_tokens_cap: int = 4096
    fixed_step_s: float | None = None
    instance_id: str = "emulated-0"
    lora_modules: tuple[str, ...] = ()  # LoRA adapters served as model names (vLLM's --lora-modules)
    max_loras: int = 1  # adapters resident at once (vLLM's --max-loras)
    lora_load_s: float = 0.05  # virtual seconds a missing adapter's load stalls the step
    kv_transfer: KvTransferConfig | None = None  # vLLM's --kv-transfer-config (P/D disaggregation)

    tokenizer: str | None = None  # a tokenizer folder: prompts tokenized as vLLM does (emulator.kv_events)
    kv_events_endpoint: str | None = None  # publish the prefix cache as vLLM's KV events (ZMQ)

    def __post_init__(self) -> None:
        if self.tp < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("tp, max_num_seqs and max_num_batched_tokens must be >= 1")
        if not self.speed > 0:
            raise ValueError("speed must be positive")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < BLOCK_TOKENS:
            raise ValueError(f"kv_capacity_tokens must be at least {BLOCK_TOKENS}")
        if self.fixed_step_s is not None and not self.fixed_step_s > 0:
            raise ValueError("fixed_step_s must be positive")
        if self.max_loras < 1 or self.lora_load_s < 0:
            raise ValueError("max_loras must be >= 1 and lora_load_s >= 0")
        if self.default_max_tokens < 1 or self.max_tokens_cap < 1:
            raise ValueError("default_max_tokens and max_tokens_cap must be >= 1")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


class FixedStepTimes:
    """Every engine step costs ``dt`` seconds, whatever its batch."""

    def __init__(self, dt: float) -> None:
        self.dt = dt
        self.decode_kv_s_per_token = 0.0
        self.prefill_s_per_pair = 0.0

    def linear_time(self, num_tokens: int) -> float:
        return self.dt


class ScaledStepTimes:
    """A step-time model slowed down by ``factor`` (the ``slow_factor`` fault)."""

    def __init__(self, base: StepTimes, factor: float = 1.0) -> None:
        self.base = base
        self.factor = 1.0
        self.decode_kv_s_per_token = base.decode_kv_s_per_token
        self.prefill_s_per_pair = base.prefill_s_per_pair
        self.set_factor(factor)

    def set_factor(self, factor: float) -> None:
        self.factor = factor
        self.decode_kv_s_per_token = self.base.decode_kv_s_per_token * factor
        self.prefill_s_per_pair = self.base.prefill_s_per_pair * factor

    def linear_time(self, num_tokens: int) -> float:
        return self.base.linear_time(num_tokens) * self.factor


class _Engine(ContinuousEngine):
    """The twin's engine plus observation hooks (no behaviour change): two that vLLM's metrics
    need, and one after each step is planned (vLLM publishes its KV events once a step)."""

    on_admit: Callable[[Seq], None]
    on_preempt: Callable[[Seq], None]
    on_plan: Callable[[], None] | None = None

    def _plan(self, now: float) -> None:
        super()._plan(now)
        if self.on_plan is not None:
            self.on_plan()

    def _plan_step(self, now: float, force: bool = False) -> bool:
        before = set(self.prefilling)
        planned = super()._plan_step(now, force)
        if planned:
            for seq, _ in self._batch:
                if seq.uid not in before:
                    self.on_admit(seq)
        return planned

    def _preempt_newest(self, now: float) -> None:
        seq = self.running[next(reversed(self.running))]
        super()._preempt_newest(now)
        self.on_preempt(seq)


class Pending:
    """One request inside the instance, as its HTTP handler sees it."""

    __slots__ = (
        "cached_tokens",
        "external_tokens",
        "finish_reason",
        "finished",
        "first_token_s",
        "last_token_s",
        "n",
        "output_tokens",
        "prompt_tokens",
        "request_id",
        "seq",
        "waiter",
    )

    def __init__(self, request_id: str, prompt_tokens: int, output_tokens: int, finish_reason: str) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.finish_reason = finish_reason
        self.n = 0
        self.cached_tokens = 0
        self.external_tokens = 0  # prompt tokens whose KV a connector pulled in (P/D decode)
        self.finished = False
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.waiter: asyncio.Future[None] | None = None
        self.seq: Seq | None = None

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until a token arrives or the request finishes (returns at once if already finished)."""
        if self.finished:
            return
        w = self.waiter = asyncio.get_running_loop().create_future()
        try:
            await w
        finally:
            self.waiter = None


class EmulatedInstance:
    """Must be created inside the running loop that will serve it."""

    def __init__(self, settings: EmulatorSettings, catalog: Catalog | None = None) -> None:
        self.settings = settings
        self.faults = Faults()
        cat = catalog or Catalog.default()
        gpu = cat.gpu(settings.gpu)
        model = cat.model(settings.model)
        base: StepTimes
        if settings.fixed_step_s is not None:
            base = FixedStepTimes(settings.fixed_step_s)
        else:
            base = StepTimeModel(gpu, model, settings.tp)
        self.step_times = ScaledStepTimes(base)
        capacity = settings.kv_capacity_tokens
        if capacity is None:
            capacity = kv_capacity_tokens(gpu, model, settings.tp, block_size=BLOCK_TOKENS)
            if capacity <= 0:
                raise ValueError(f"{model.name} does not fit on {settings.tp} x {gpu.name}")
        self.max_model_len = min(settings.max_model_len or 32768, capacity)
        self.config = EngineConfig(
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            block_size=BLOCK_TOKENS,
            kv_capacity_tokens=capacity,
            enable_prefix_caching=settings.enable_prefix_caching,
            max_model_len=self.max_model_len,
            max_adapters=settings.max_loras if settings.lora_modules else 0,
            adapter_load_s=settings.lora_load_s,
        )
        self.clock = RealtimeClock(speed=settings.speed)
        self.metrics = VllmMetrics(
            settings.model_name,
            block_size=BLOCK_TOKENS,
            num_gpu_blocks=capacity // BLOCK_TOKENS,
            max_lora=settings.max_loras if settings.lora_modules else 0,
        )
        self.gpu_name = gpu.name
        self.model_spec_name = model.name
        self._reqs: dict[int, Pending] = {}
        self._uids = itertools.count(1)
        engine = _Engine(
            settings.instance_id,
            self.config,
            self.step_times,
            schedule=self.clock.schedule,
            on_finish=self._on_finish,
            record=InstanceRecord(settings.instance_id, gpu.name, model.name, gpu.price_per_hour),
            tbt=TbtHistogram(),
            on_token=self._on_token,
        )
        engine.on_admit = self._on_admit
        engine.on_preempt = self._on_preempt
        if settings.kv_events_endpoint:  # the events need each block the cache stores and evicts
            kv = engine.kv
            engine.kv = JournaledKVCache(kv.total_blocks, kv.block_size, prefix_caching=kv.prefix_caching)
        self.engine = engine
        self.kv_transfer: KvTransfer | None = None
        if settings.kv_transfer is not None:
            tm = KvTransferMetrics(self.metrics.registry, settings.model_name)
            self.kv_transfer = KvTransfer(settings.kv_transfer, tm, model.kv_bytes_per_token, BLOCK_TOKENS)

    # -- requests ------------------------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        block_hashes: tuple[int, ...],
        output_tokens: int,
        finish_reason: str,
        adapter: str | None = None,
        external_tokens: int = 0,
    ) -> Pending:
        now = self.clock.now()
        uid = next(self._uids)
        spec = RequestSpec(
            request_id=uid,
            arrival_s=now,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            block_hashes=block_hashes,
            hash_block_tokens=BLOCK_TOKENS,
            model=self.settings.model_name,
            max_output_tokens=output_tokens,
            adapter=adapter,
        )
        info = RequestInfo(
            request_id=request_id,
            model=self.settings.model_name,
            prompt_tokens=prompt_tokens,
            max_output_tokens=output_tokens,
            block_hashes=block_hashes,
            hash_block_tokens=BLOCK_TOKENS,
            arrival_s=now,
            adapter=adapter,
        )
        record = RequestRecord(uid, "default", now, prompt_tokens, output_tokens, instance_id=self.engine.id)
        seq = Seq(uid, spec, info, record, BLOCK_TOKENS)
        pending = Pending(request_id, prompt_tokens, output_tokens, finish_reason)
        pending.external_tokens = external_tokens
        pending.seq = seq
        self._reqs[uid] = pending
        self.engine.submit(seq, now)
        return pending

    def receive_kv(self, hashes: tuple[int, ...], tokens: int) -> int:
        """Blocks pulled from a prefill instance enter the prefix cache, unreferenced, as a finished
        request's would: the request submitted next finds them as hits. Returns the tokens cached
        (fewer when the cache is full; the engine then computes the rest, as vLLM recomputes)."""
        kv = self.engine.kv
        taken: list[int] = []
        for h in hashes[: tokens // BLOCK_TOKENS]:
            if h in kv.entries:
                kv.acquire((h,))
            elif kv.allocate(1):
                kv.register(h, 1)
            else:
                break
            taken.append(h)
        kv.release(taken)
        return len(taken) * BLOCK_TOKENS

    def fits(self, prompt_tokens: int, output_tokens: int) -> bool:
        return prompt_tokens + output_tokens <= self.max_model_len

    def abort(self, pending: Pending) -> bool:
        """Drop a request whose client went away; False when it had already finished."""
        seq = pending.seq
        if seq is None or pending.finished:
            return False
        self._reqs.pop(seq.uid, None)
        pending.finished = True
        pending.finish_reason = "abort"
        aborted = self.engine.abort(seq, self.clock.now())
        if aborted:
            self.metrics.success["abort"].inc()
        pending.wake()
        return aborted

    def set_slow_factor(self, factor: float) -> None:
        self.step_times.set_factor(factor)

    def refresh_gauges(self) -> None:
        e, m = self.engine, self.metrics
        m.running.set(len(e.running))
        m.waiting.set(len(e.waiting))
        m.kv_usage.set(e.kv.usage)
        if e.lora is not None:
            running = {s.spec.adapter for s in e.running.values() if s.spec.adapter}
            waiting = {s.spec.adapter for s in e.waiting if s.spec.adapter}
            m.set_lora(sorted(running), sorted(waiting), self.clock.now())

    def state(self) -> dict[str, object]:
        e = self.engine
        return {
            "instance_id": e.id,
            "model": self.settings.model_name,
            "gpu": self.gpu_name,
            "virtual_time_s": self.clock.now(),
            "speed": self.clock.speed,
            "running": len(e.running),
            "waiting": len(e.waiting),
            "kv_usage": e.kv.usage,
            "kv_capacity_tokens": e.capacity_tokens,
            "max_model_len": self.max_model_len,
            "in_flight": len(self._reqs),
            "steps": e.record.steps,
            "slow_factor": self.step_times.factor,
        }

    # -- engine callbacks (virtual times) ------------------------------------------------------
    def _on_admit(self, seq: Seq) -> None:
        if seq.record.preemptions:
            # vLLM records a preempted request's new lookup apart (``PrefixCacheStats.record(...,
            # preempted=True)``: ``preempted_queries`` / ``preempted_hits``), out of the
            # prefix-cache counters, and its ``cached_tokens`` stays what the first admission found
            return
        m = self.metrics
        m.prefix_queries.inc(seq.prompt)
        pending = self._reqs.get(seq.uid)
        # As vLLM counts them: KV a connector pulled in is an external hit, not a local one.
        external = min(seq.computed, pending.external_tokens) if pending is not None else 0
        if seq.computed > external:
            m.prefix_hits.inc(seq.computed - external)
        if self.kv_transfer is not None:
            self.kv_transfer.metrics.external_queries.inc(seq.prompt - (seq.computed - external))
            self.kv_transfer.metrics.external_hits.inc(external)
        if pending is not None:
            pending.cached_tokens = seq.computed

    def _on_preempt(self, seq: Seq) -> None:
        self.metrics.preemptions.inc()

    def _on_token(self, seq: Seq, now: float) -> None:
        pending = self._reqs.get(seq.uid)
        if pending is None:
            return
        m = self.metrics
        pending.n += 1
        m.generation_tokens.inc()
        if pending.first_token_s is None:
            pending.first_token_s = now
            m.prompt_tokens.inc(pending.prompt_tokens)
            m.ttft.observe(now - seq.spec.arrival_s)
        else:
            m.itl.observe(now - pending.last_token_s)
        pending.last_token_s = now
        pending.wake()

    def _on_finish(self, seq: Seq, now: float) -> None:
        pending = self._reqs.pop(seq.uid, None)
        if pending is None:
            return
        m = self.metrics
        rec = seq.record
        m.success[pending.finish_reason].inc()
        m.e2e.observe(now - seq.spec.arrival_s)
        if rec.scheduled_s is not None:
            m.queue.observe(rec.scheduled_s - seq.spec.arrival_s)
        pending.finished = True
        pending.wake()
