"""Static batching, the historical baseline (request-level batching, as before Orca and vLLM).

A batch of up to ``static_batch_size`` waiting requests starts only when the previous batch has
ended. Each member reserves KV for the maximum sequence length (``max_model_len``) up front, so
fewer fit; prompts are padded to the longest in the batch and prefilled together; the batch then
decodes until its longest output is done, every slot paying for a step whether or not its own
request has finished. Each request still streams: it finishes at its own last token.
"""

from __future__ import annotations

from collections import deque

from tokenplane.core.ttft import PoolTtft, free_kv_bytes
from tokenplane.core.views import InstanceView
from tokenplane.sim.engine import (
    EngineConfig,
    EngineWiring,
    FinishFn,
    ScheduleFn,
    Seq,
    StepTimes,
    _ignore_finish,
)
from tokenplane.sim.records import InstanceRecord, TbtHistogram
from tokenplane.sim.workloads.base import RequestSpec

DEFAULT_STATIC_MAX_LEN = 4096


class StaticEngine(EngineWiring):
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
        kv_bytes_per_token: int = 0,
        ttft: PoolTtft | None = None,
    ) -> None:
        self.id = instance_id
        self.kv_bytes_per_token = kv_bytes_per_token  # the view's seven-axis fields, as the
        self.ttft = ttft if ttft is not None else PoolTtft()  # continuous engine fills them
        self.cfg = config
        self.model = step_times
        self._schedule = schedule
        self._schedule_late = schedule_late or schedule
        self._on_finish: FinishFn = on_finish or _ignore_finish
        self.record = record
        self.tbt = tbt
        self.reserve = config.max_model_len or DEFAULT_STATIC_MAX_LEN
        self.slots = max(1, min(config.static_batch_size, config.kv_capacity_tokens // self.reserve))
        self.waiting: deque[Seq] = deque()
        self.batch: list[Seq] = []
        self._finishes: list[tuple[float, int, Seq]] = []
        self.busy = False
        self.busy_since = 0.0
        self.outstanding_tokens = 0
        self.index = 0
        self.changed: set[int] = set()

    def fits(self, spec: RequestSpec) -> bool:
        return spec.prompt_tokens + spec.output_tokens <= self.reserve

    def submit(self, seq: Seq, now: float) -> None:
        seq.sent_s = now
        seq.waiting_ahead = len(self.waiting)
        self.waiting.append(seq)
        self.outstanding_tokens += seq.spec.prompt_tokens + seq.info.max_output_tokens
        self.changed.add(self.index)
        if not self.busy:
            # Start from an event queued behind everything already due now, so that requests
            # arriving at the same instant share the first batch.
            self.busy = True
            self.busy_since = now
            self._schedule_late(now, self._end_batch, None)

    def view(self) -> InstanceView:
        rec = self.record
        in_batch = len(self.batch)
        waiting = len(self.waiting)
        usage = in_batch / self.slots
        return InstanceView(
            instance_id=self.id,
            model=rec.model,
            gpu=rec.gpu,
            outstanding_requests=in_batch + len(self.waiting),
            outstanding_tokens=self.outstanding_tokens,
            running=in_batch,
            waiting=waiting,
            kv_usage=usage,
            kv_capacity_tokens=self.cfg.kv_capacity_tokens,
            price_per_hour=rec.price_per_hour,
            hbm_free_bytes=free_kv_bytes(self.cfg.kv_capacity_tokens, usage, self.kv_bytes_per_token),
            predicted_ttft_s=self.ttft.view_ttft_s(waiting, "warm"),
        )

    def cached_prefix_tokens(self, spec: RequestSpec) -> int:
        """A static batcher keeps no prefix cache."""
        return 0

    def _start_batch(self, now: float) -> None:
        batch = [self.waiting.popleft() for _ in range(min(self.slots, len(self.waiting)))]
        self.batch = batch
        self.changed.add(self.index)
        if not batch:
            if self.busy:
                self.busy = False
                self.record.busy_s += now - self.busy_since
            return
        if not self.busy:
            self.busy = True
            self.busy_since = now
        model = self.model
        b = len(batch)
        max_p = max(s.spec.prompt_tokens for s in batch)
        max_o = max(s.spec.output_tokens for s in batch)
        prefill = model.linear_time(b * max_p) + model.prefill_s_per_pair * b * max_p * (max_p + 1) / 2
        a = model.linear_time(b)
        kv = model.decode_kv_s_per_token

        def decode_time(m: int) -> float:  # m padded decode steps of the whole batch
            return m * a + kv * b * (m * max_p + m * (m - 1) / 2)

        first = now + prefill
        finishes = []
        for seq in batch:
            rec = seq.record
            rec.scheduled_s = now
            rec.first_token_s = first
            self.ttft.observe(first - seq.sent_s, seq.waiting_ahead, now=first)  # known once the batch starts
            o = seq.spec.output_tokens
            if o > 1:
                self.tbt.add(decode_time(o - 1) / (o - 1), o - 1)
            finishes.append((first + decode_time(o - 1), seq.uid, seq))
        finishes.sort(key=lambda x: (x[0], x[1]))
        self._finishes = finishes
        self.record.steps += max_o
        self._schedule(first + decode_time(max_o - 1), self._end_batch, None)

    def _end_batch(self, now: float, _: object) -> None:
        finishes, self._finishes = self._finishes, []
        for t, _, seq in finishes:
            self.outstanding_tokens -= seq.spec.prompt_tokens + seq.info.max_output_tokens
            self._on_finish(seq, t)
        self._start_batch(now)
