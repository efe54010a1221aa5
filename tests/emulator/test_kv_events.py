"""The emulator's KV events: the journal of the engine's cache, and a batch after every planned
step, so that what a subscriber holds is the engine's cache as of its last step (vLLM's cadence)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.emulator.kv_events import JournaledKVCache
from tokenplane.sim.kvcache import KVCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from ports import free_port
from tiny_model import sample_text
from tiny_tokenizer import make_tokenizer_folder

CHAINS = [[c * 100 + d for d in range(12)] for c in range(4)]
# (start a request on chain c with n blocks) or (finish the oldest running one)
OPS = st.lists(
    st.one_of(st.tuples(st.integers(0, 3), st.integers(1, 12)), st.none()), min_size=1, max_size=60
)


def _drive(kv: KVCache, ops: list[tuple[int, int] | None], check: Any = None) -> None:
    """Requests as the engine runs them: cached prefix acquired, the rest allocated and registered,
    all released when they finish (deepest first)."""
    running: list[list[int]] = []
    for op in ops:
        if op is None:
            if running:
                kv.release(running.pop(0))
        else:
            chain = CHAINS[op[0]][: op[1]]
            n = kv.match(chain, len(chain))
            kv.acquire(chain[:n])
            if not kv.allocate(len(chain) - n):
                kv.release(chain[:n])
            else:
                for h in chain[n:]:
                    kv.register(h, 1)
                running.append(chain)
        if check is not None:
            check()


@settings(max_examples=200, deadline=None)
@given(OPS, st.integers(2, 20))
def test_the_journal_replayed_is_the_cache_and_changes_nothing(
    ops: list[tuple[int, int] | None], blocks: int
) -> None:
    journaled, plain = JournaledKVCache(blocks, 16), KVCache(blocks, 16)
    replayed: set[int] = set()

    def check() -> None:
        for stored, h in journaled.take_journal():
            if stored:
                assert h not in replayed
                replayed.add(h)
            else:
                replayed.remove(h)
        assert replayed == set(journaled.entries)

    _drive(journaled, ops, check)
    _drive(plain, ops)
    assert journaled.entries == plain.entries and list(journaled.lru) == list(plain.lru)
    journaled.check()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer_folder(tmp_path_factory.mktemp("tok") / "tiny")


def test_every_planned_step_is_published_before_the_next(tokenizer_dir: Path) -> None:
    """After every step the engine plans (admissions, and the evictions they cause), what the
    publisher has sent is exactly the engine's cache; a subscriber that follows the stream ends
    with the engine's blocks, the evicted ones removed."""
    pytest.importorskip("zmq")
    from tokenplane.emulator import EmulatorSettings, instance_of, start_emulator
    from tokenplane.emulator.kv_events import TOKENIZATION_KEY
    from tokenplane.gateway.kv_events import KvEventsSource, KvEventsSubscriber

    async def main() -> None:
        import openai

        sub = KvEventsSubscriber([KvEventsSource("emu", f"tcp://127.0.0.1:{free_port()}")])
        await sub.start()
        settings = EmulatorSettings(
            speed=50.0, kv_capacity_tokens=320, max_model_len=320, tokenizer=str(tokenizer_dir),
            kv_events_endpoint=sub.endpoints["emu"],
        )  # fmt: skip
        runner, url = await start_emulator(settings)
        engine = instance_of(runner.app).engine
        pub = runner.app[TOKENIZATION_KEY].publisher
        assert pub is not None
        behind: list[int] = []
        publish = engine.on_plan

        def after_plan() -> None:
            publish()
            noted = {h for h in engine.kv.entries if h in pub._known}
            if pub._published != noted:
                behind.append(engine.record.steps)

        engine.on_plan = after_plan
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
        cache = sub.index.cache("emu")
        try:
            for i in range(200):  # PUB/SUB joins asynchronously: until the subscriber hears one
                warm = sample_text(30, seed=i)
                await client.completions.create(model="llama-3-8b", prompt=warm, max_tokens=1)
                await asyncio.sleep(0.02)
                if cache.stored:
                    break
            assert cache.stored
            prompts = [sample_text(60, seed=100 + i) for i in range(6)]  # ~5 blocks each: evictions
            await asyncio.gather(
                *(client.completions.create(model="llama-3-8b", prompt=p, max_tokens=40) for p in prompts)
            )
            for p in prompts[:3]:
                await client.completions.create(model="llama-3-8b", prompt=p, max_tokens=8)
            assert await sub.wait_for("emu", lambda c: set(c._keys) == set(engine.kv.entries))
            assert pub.sent_removed > 0 and cache.removed > 0 and not behind
            assert cache.gaps == cache.unlinked == 0
        finally:
            await client.close()
            await runner.cleanup()
            await sub.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
