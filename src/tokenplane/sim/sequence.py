"""One request inside a simulated engine (:class:`Seq`), the engine's limits
(:class:`EngineConfig`) and the callbacks an engine reports through.

A sequence moves WAITING -> PREFILL -> DECODE -> DONE; a recompute preemption sends it back to
WAITING with its generated tokens appended to the prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tokenplane.core.views import RequestInfo
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.workloads.base import RequestSpec


class StepTimes(Protocol):
    decode_kv_s_per_token: float
    prefill_s_per_pair: float

    def linear_time(self, num_tokens: int) -> float: ...


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_capacity_tokens: int = 400_000
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    static_batch_size: int = 32
    max_adapters: int = 0  # LoRA slots (0: no LoRA; requests' adapters are ignored)
    adapter_load_s: float = 0.0  # stall of the step that loads a missing adapter
    reserve_full_prompt: bool = True  # vLLM's scheduler_reserve_full_isl (see fleet_settings)

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.block_size, self.kv_capacity_tokens) <= 0:
            raise ValueError("engine limits must be positive")


WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3


class Seq:
    """One request inside an engine; mutable, private to the simulator."""

    __slots__ = (
        "computed",
        "ctx0",
        "epoch",
        "finish_step",
        "generated",
        "hashes",
        "hblock",
        "held",
        "info",
        "last_token_s",
        "nbh",
        "own",
        "own_held",
        "private",
        "prompt",
        "record",
        "remote",
        "residue",
        "sent_s",
        "spec",
        "state",
        "step0",
        "uid",
        "waiting_ahead",
    )

    def __init__(
        self, uid: int, spec: RequestSpec, info: RequestInfo, record: RequestRecord, bs: int
    ) -> None:
        self.uid = uid
        self.spec = spec
        self.info = info
        self.record = record
        self.prompt = spec.prompt_tokens
        hb = spec.hash_block_tokens
        usable = bool(spec.block_hashes) and hb >= bs and hb % bs == 0
        self.hashes = spec.block_hashes if usable else ()
        self.hblock = hb if usable else 1
        self.nbh = hb // bs if usable else 0
        self.computed = 0
        # Leading prompt tokens whose KV arrived from another instance (prefill/decode disaggregation,
        # sim.disagg): admitted as computed; blocks for them are already held in ``private``.
        self.remote = 0
        self.generated = 0
        self.held = 0
        # Its own full blocks past its content hashes, registered when it was preempted (prefix
        # caching keeps a preempted request's blocks cached, so its resume reuses those not evicted
        # since), and how many of them it holds now.
        self.own: tuple[int, ...] = ()
        self.own_held = 0
        self.private = 0
        self.state = WAITING
        self.epoch = 0
        self.step0 = 0
        self.ctx0 = 0
        self.finish_step = 0
        self.residue = 0
        self.last_token_s = 0.0
        self.sent_s = 0.0  # when it was submitted to its engine, and the queue it found there:
        self.waiting_ahead = 0  # its first token feeds the pool's TTFT model with both


FinishFn = Callable[[Seq, float], None]
TokenFn = Callable[[Seq, float], None]
ScheduleFn = Callable[[float, Callable[[float, object], None], object], None]


def _ignore_finish(seq: Seq, now: float) -> None:
    """An engine not yet bound to a fleet reports finishes nowhere."""
