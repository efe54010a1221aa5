"""Token-by-token mode (what the real-time emulator uses) and aborts."""

from __future__ import annotations

from tokenplane.core.views import RequestInfo
from tokenplane.sim.engine import ContinuousEngine, EngineConfig, Seq
from tokenplane.sim.kernel import EventLoop
from tokenplane.sim.records import InstanceRecord, RequestRecord, TbtHistogram
from tokenplane.sim.workloads.base import RequestSpec


class ConstModel:
    decode_kv_s_per_token = 0.0
    prefill_s_per_pair = 0.0

    def linear_time(self, num_tokens: int) -> float:
        return 0.01


def _engine(loop: EventLoop, tokens: list[tuple[int, float]], done: list[int], kv: int = 4096):
    def on_token(seq: Seq, now: float) -> None:
        tokens.append((seq.uid, round(now, 9)))

    def on_finish(seq: Seq, now: float) -> None:
        done.append(seq.uid)

    return ContinuousEngine(
        "e0",
        EngineConfig(kv_capacity_tokens=kv, block_size=16),
        ConstModel(),
        schedule=loop.schedule,
        on_finish=on_finish,
        record=InstanceRecord("e0", "gpu", "m", 1.0),
        tbt=TbtHistogram(),
        on_token=on_token,
    )


def _seq(uid: int, prompt: int, output: int, hashes: tuple[int, ...] = ()) -> Seq:
    spec = RequestSpec(uid, 0.0, prompt, output, block_hashes=hashes, hash_block_tokens=16)
    info = RequestInfo(str(uid), "m", prompt, output)
    return Seq(uid, spec, info, RequestRecord(uid, "t", 0.0, prompt, output), 16)


def test_every_token_is_reported_at_its_step() -> None:
    loop = EventLoop()
    tokens: list[tuple[int, float]] = []
    done: list[int] = []
    engine = _engine(loop, tokens, done)
    engine.submit(_seq(1, 40, 5), 0.0)
    engine.submit(_seq(2, 40, 3), 0.0)
    loop.run()
    assert [t for u, t in tokens if u == 1] == [0.01, 0.02, 0.03, 0.04, 0.05]
    assert [t for u, t in tokens if u == 2] == [0.01, 0.02, 0.03]
    assert done == [2, 1]


def test_abort_mid_decode_frees_everything_and_stops_tokens() -> None:
    loop = EventLoop()
    tokens: list[tuple[int, float]] = []
    done: list[int] = []
    engine = _engine(loop, tokens, done)
    a, b = _seq(1, 40, 50, hashes=(11, 12)), _seq(2, 33, 50)
    engine.submit(a, 0.0)
    engine.submit(b, 0.0)
    loop.run(until=0.055)  # mid-step: a and b have 5 tokens each
    assert engine.abort(a, 0.055)
    assert not engine.abort(a, 0.056)
    loop.run()
    assert max(t for u, t in tokens if u == 1) <= 0.05
    assert len([1 for u, _ in tokens if u == 2]) == 50
    assert done == [2]
    kv = engine.kv
    kv.check()
    assert kv.used_private == 0 and kv.referenced_cached == 0
    assert not engine.busy and engine.outstanding_tokens == 0


def test_abort_while_waiting_and_last_request_idles_the_engine() -> None:
    loop = EventLoop()
    tokens: list[tuple[int, float]] = []
    done: list[int] = []
    engine = _engine(loop, tokens, done)
    a = _seq(1, 40, 50)
    engine.submit(a, 0.0)
    assert engine.abort(a, 0.0)  # still waiting: never scheduled
    loop.run()
    assert tokens == [] and done == [] and not engine.busy
    engine.kv.check()
