"""vLLM KV events: decoding, exact per-instance state, and a real ZMQ PUB -> SUB pair on loopback."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import msgspec
import pytest
from ports import free_port

from tokenplane.gateway.config import InstanceConfig, KvEventsConfig
from tokenplane.gateway.kv_events import (
    InstanceKvCache,
    KvEventsIndex,
    KvEventsSource,
    KvEventsSubscriber,
    chain_keys,
    decode_batch,
    sources_from_instances,
)

zmq = pytest.importorskip("zmq")


# What vLLM (vllm/distributed/kv_events.py) puts on the wire: the batch as an array, events as maps
# tagged "type" with every field present; written here independently of the module under test.
class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None
    extra_keys: Any = None


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[Any]
    medium: str | None = "GPU"


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _Future(msgspec.Struct, tag="SomethingNew"):
    x: int = 1


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


_enc = msgspec.msgpack.Encoder()
BS = 4


def payload(*events: Any, ts: float = 1.0) -> bytes:
    return _enc.encode(_Batch(ts, list(events)))


def stored(hashes: list[Any], tokens: list[int], parent: Any = None) -> _Stored:
    return _Stored(hashes, parent, tokens, BS)


PROMPT = list(range(100, 112))  # three blocks of 4


def test_decode_matches_vllm_layout_and_skips_unknown_events() -> None:
    ts, events, skipped = decode_batch(payload(stored([1], PROMPT[:4]), _Future(), _Cleared(), ts=2.5))
    assert ts == 2.5 and skipped == 1
    assert [type(e).__name__ for e in events] == ["BlockStored", "AllBlocksCleared"]


def test_store_remove_clear_and_exact_match() -> None:
    index = KvEventsIndex()
    index.ingest("a", [payload(stored([1, 2], PROMPT[:8]))])
    index.ingest("a", [payload(stored([3], PROMPT[8:12], parent=2))])  # continues the chain
    index.ingest("b", [payload(stored([9], PROMPT[:4]))])
    assert index.match_tokens(PROMPT) == {"a": 12, "b": 4}
    assert index.match_tokens([*PROMPT[:4], 0, 0, 0, 0]) == {"a": 4, "b": 4}
    assert index.match_tokens([7, *PROMPT[1:]]) == {}  # first block differs: nothing after counts
    assert index.match_tokens(PROMPT[:3]) == {}  # no full block

    index.ingest("a", [payload(_Removed([2]))])
    assert index.match_tokens(PROMPT) == {"a": 4, "b": 4}  # block 3 is unreachable without block 2
    index.ingest("a", [payload(_Removed([1], medium="CPU"))])  # another tier: the device copy stays
    assert index.match_tokens(PROMPT)["a"] == 4
    index.ingest("b", [payload(_Cleared())])
    assert index.match_tokens(PROMPT) == {"a": 4}
    snap = index.snapshot()
    assert snap["a"]["blocks"] == 2 and snap["a"]["removed"] == 1 and snap["b"]["cleared"] == 1


def test_byte_hashes_lora_and_offload_tiers() -> None:
    index = KvEventsIndex()
    index.ingest("a", [payload(stored([b"\x01" * 32], PROMPT[:4]))])
    lora = _Stored([b"\x02" * 32], None, PROMPT[4:8], BS, lora_id=3)
    cpu = _Stored([5], None, PROMPT[8:12], BS, medium="CPU")
    index.ingest("b", [payload(lora, cpu)])
    assert index.match_tokens(PROMPT) == {"a": 4}
    assert index.match_tokens(PROMPT[4:8], lora_id=3) == {"b": 4}
    assert len(index.cache("b")) == 1


def test_unknown_parent_gaps_and_garbage_are_counted_not_fatal() -> None:
    index = KvEventsIndex()
    index.ingest("a", [b"kv", (0).to_bytes(8, "big"), payload(stored([2], PROMPT[4:8], parent=1))])
    index.ingest("a", [b"kv", (5).to_bytes(8, "big"), b"\xc1 not msgpack"])
    c = index.cache("a")
    assert len(c) == 0 and c.unlinked == 1 and c.gaps == 1 and c.decode_errors == 1


def test_a_gap_or_a_restarted_sequence_expires_the_state() -> None:
    """A lost message may have been a BlockRemoved, and a restarted engine has an empty cache:
    either way the instance's state is dropped and rebuilt from the events that follow."""
    index = KvEventsIndex()

    def send(seq: int, *events: Any) -> None:
        index.ingest("a", [b"kv", seq.to_bytes(8, "big"), payload(*events)])

    send(0, stored([1, 2], PROMPT[:8]))
    send(1, stored([3], PROMPT[8:12], parent=2))
    assert index.match_tokens(PROMPT) == {"a": 12}
    send(3, stored([9], [5] * BS))  # seq 2 lost: what it said is unknown
    c = index.cache("a")
    assert index.match_tokens(PROMPT) == {} and c.gaps == 1 and len(c) == 1
    send(4, stored([1, 2], PROMPT[:8]))
    assert index.match_tokens(PROMPT) == {"a": 8}
    send(0, stored([7], PROMPT[:4]))  # the engine restarted: its sequence starts again
    assert index.match_tokens(PROMPT) == {"a": 4} and c.restarts == 1 and len(c) == 1
    assert index.snapshot()["a"]["restarts"] == 1


def test_bounded_oldest_dropped_first() -> None:
    cache = InstanceKvCache(max_blocks=2)
    for i in range(5):
        _, events, _ = decode_batch(payload(stored([i], [i] * BS)))
        cache.apply(events)
    assert len(cache) == 2 and cache.dropped == 3
    assert cache.match(chain_keys([4] * BS, BS)) == 1
    assert cache.match(chain_keys([0] * BS, BS)) == 0


def test_config_and_sources() -> None:
    inst = InstanceConfig(
        id="i1", url="http://x", model="m", kv_events=KvEventsConfig(endpoint="tcp://127.0.0.1:5557")
    )
    plain = InstanceConfig(id="i2", url="http://y", model="m")
    assert sources_from_instances([inst, plain]) == [KvEventsSource("i1", "tcp://127.0.0.1:5557", "kv")]
    with pytest.raises(ValueError, match="ZMQ endpoint"):
        KvEventsConfig(endpoint="http://nope")


@pytest.mark.anyio
async def test_real_zmq_pub_sub_on_loopback() -> None:
    endpoints = {"a": f"tcp://127.0.0.1:{free_port()}", "b": f"tcp://127.0.0.1:{free_port()}"}
    sub = KvEventsSubscriber([KvEventsSource(i, ep, "kv") for i, ep in endpoints.items()])
    await sub.start()
    ctx = zmq.Context()
    pubs = {}
    try:
        for iid, ep in endpoints.items():  # like vLLM: the publisher connects to the bound endpoint
            pubs[iid] = ctx.socket(zmq.PUB)
            pubs[iid].setsockopt(zmq.LINGER, 0)
            pubs[iid].connect(ep)
        seqs = dict.fromkeys(endpoints, 0)  # each publisher numbers its own messages, as vLLM's do

        def send(iid: str, data: bytes, topic: bytes = b"kv") -> None:
            pubs[iid].send_multipart([topic, seqs[iid].to_bytes(8, "big"), data])
            seqs[iid] += 1

        # PUB/SUB joins asynchronously ("slow joiner"): resend a harmless batch until one lands
        for _ in range(200):
            send("a", payload(stored([1], PROMPT[:4])))
            send("b", payload(stored([7], PROMPT[:4])))
            await asyncio.sleep(0.01)
            if len(sub.index.cache("a")) and len(sub.index.cache("b")):
                break
        send("a", payload(stored([2, 3], PROMPT[4:12], parent=1)))
        send("b", payload(stored([8], PROMPT[:4])), topic=b"other")  # not our topic: filtered
        assert await sub.wait_for("a", lambda c: len(c) == 3)
        assert sub.index.match_tokens(PROMPT) == {"a": 12, "b": 4}

        send("a", payload(_Removed([3])))
        assert await sub.wait_for("a", lambda c: len(c) == 2)
        assert sub.index.match_tokens(PROMPT)["a"] == 8
        send("a", b"garbage")  # the reader survives a bad message
        send("a", payload(_Cleared()))
        assert await sub.wait_for("a", lambda c: len(c) == 0)
        assert sub.index.cache("a").decode_errors == 1
        assert sub.endpoints == endpoints
    finally:
        for p in pubs.values():
            p.close(linger=0)
        ctx.term()
        await sub.stop()


@pytest.mark.anyio
async def test_replicas_connect_to_a_publisher_that_binds() -> None:
    """vLLM given ``tcp://*:PORT`` binds its PUB socket; two gateway replicas (``connect: true``)
    subscribe to it and both follow the instance's cache."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    inst = InstanceConfig(
        id="a",
        url="http://x",
        model="m",
        kv_events=KvEventsConfig(endpoint=f"tcp://127.0.0.1:{port}", connect=True),
    )
    replicas = [KvEventsSubscriber(sources_from_instances([inst])) for _ in range(2)]
    for r in replicas:
        await r.start()
    try:
        seq = 0
        for _ in range(200):  # until both have joined (slow joiner)
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload(stored([1], PROMPT[:4]))])
            seq += 1
            await asyncio.sleep(0.01)
            if all(len(r.index.cache("a")) for r in replicas):
                break
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload(stored([2, 3], PROMPT[4:12], parent=1))])
        for r in replicas:
            assert await r.wait_for("a", lambda c: len(c) == 3)
            assert r.index.match_tokens(PROMPT) == {"a": 12}
    finally:
        for r in replicas:
            await r.stop()
        pub.close(linger=0)
        ctx.term()


@pytest.mark.anyio
async def test_gateway_start_binds_and_stop_releases() -> None:
    from tokenplane.gateway.app import Gateway
    from tokenplane.gateway.config import GatewayConfig

    inst = {"id": "i1", "url": "http://127.0.0.1:9", "model": "m"}
    config = GatewayConfig.model_validate(
        {
            "models": [{"name": "m"}],
            "instances": [{**inst, "kv_events": {"endpoint": "tcp://127.0.0.1:*"}}, {**inst, "id": "i2"}],
        }
    )
    gw = Gateway(config)
    assert gw.kv_events is not None and [s.instance_id for s in gw.kv_events.sources] == ["i1"]
    await gw.start()
    try:
        bound = gw.kv_events.endpoints["i1"]
        assert bound.startswith("tcp://127.0.0.1:") and not bound.endswith("*")
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(bound)
        try:
            for _ in range(200):
                pub.send_multipart([b"kv", b"\0" * 8, payload(stored([1], PROMPT[:4]))])
                if await gw.kv_events.wait_for("i1", lambda c: len(c) == 1, timeout=0.02):
                    break
            assert gw.kv_events.index.match_tokens(PROMPT) == {"i1": 4}
        finally:
            pub.close(linger=0)
            ctx.term()
    finally:
        await gw.stop()
    assert not gw.kv_events._tasks
    assert (
        Gateway(GatewayConfig.model_validate({"models": [{"name": "m"}], "instances": [inst]})).kv_events
        is None
    )


@pytest.mark.anyio
async def test_precise_mode_routes_token_id_prompts_to_the_instance_that_reports_them(
    upstreams, names
) -> None:
    """Precise prefix routing: instance up-1 publishes (over real ZMQ) that it holds the first four
    16-token blocks of a prompt; a completion sent as token ids goes there, although the approximate
    index of a fresh gateway knows nothing and would pick the first instance (least loaded, lowest
    index); a prompt no instance holds falls back to that choice; the reasons are counted."""
    import aiohttp
    from aiohttp.test_utils import TestServer

    from tokenplane.gateway.app import GATEWAY_KEY, create_app
    from tokenplane.gateway.config import parse_config

    ups = await upstreams(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raw = names.gateway_config(ups, router="prefix-affinity")
    raw["instances"][1]["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{port}"}
    app = create_app(parse_config(raw))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    gw = app[GATEWAY_KEY]
    held = list(range(1000, 1064))  # four blocks of 16
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(f"tcp://127.0.0.1:{port}")
    block = _Stored([11, 12, 13, 14], None, held, 16)
    try:
        for _ in range(200):
            pub.send_multipart([b"kv", b"\0" * 8, payload(block)])
            if await gw.kv_events.wait_for(ups[1].name, lambda c: len(c) == 4, timeout=0.02):
                break
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {names.KEY}"}) as http:

            async def complete(prompt: list[int]) -> None:
                body = {"model": names.MODEL, "prompt": prompt, "max_tokens": 4}
                async with http.post(f"{server.make_url('/v1/completions')}", json=body) as r:
                    assert r.status == 200, await r.text()

            await complete([*held, 7, 8, 9, 10])
            assert [len(u.requests) for u in ups] == [0, 1]
            await complete(list(range(5000, 5072)))  # nobody holds it: least loaded, lowest index
            assert [len(u.requests) for u in ups] == [1, 1]
            await complete(held[:40])  # two full blocks held of 40 tokens: 32 / 40 > 0.5
            assert [len(u.requests) for u in ups] == [1, 2]
            async with http.get(f"{server.make_url('/metrics')}") as r:
                metrics = await r.text()
        assert 'reason="kv_cache_match"' in metrics and 'reason="kv_cache_miss_least_loaded"' in metrics
    finally:
        pub.close(linger=0)
        ctx.term()
        await server.close()
