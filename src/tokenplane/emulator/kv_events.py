"""The emulator with the model's tokenizer and vLLM's KV events, for exact prefix routing.

``--tokenizer DIR``: prompts are tokenized as vLLM does (the gateway's
:class:`~tokenplane.gateway.tokenization.LocalTokenizer`: chat through the template without added
special tokens, text with them), so ``prompt_tokens`` and the prefix-cache blocks are real token
blocks (16 tokens, chained as :func:`~tokenplane.gateway.kv_events.chain_keys` chains them), and
``POST /tokenize`` answers as vLLM's does.

``--kv-events-endpoint tcp://HOST:PORT``: the engine's prefix cache is published as vLLM publishes
it: a ZMQ PUB socket CONNECTS to the endpoint (BINDS it when it has a wildcard, ``tcp://*:PORT``,
as vLLM does, so that several gateways can connect) and sends ``[topic, seq (8 bytes, big-endian),
msgpack KVEventBatch]``, with ``BlockStored`` (one per block, its parent's hash and its 16 token
ids) and ``BlockRemoved`` (one per evicted block), in the order the cache changed. As vLLM's
scheduler does (it takes the KV cache manager's events once per step and publishes them as one
batch), the batch goes out every engine step that changed the cache, as soon as the step is
planned: the engine's cache (:class:`JournaledKVCache`) notes each block it caches and evicts, so
an eviction is on the wire before the next request can be admitted (a timer that diffed the
cache every 10 ms of wall time let a gateway route on blocks evicted up to ten emulated steps
earlier).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec
from aiohttp import web

from tokenplane.gateway.kv_events import chain_keys
from tokenplane.sim.kvcache import KVCache

BLOCK = 16  # the emulator's engine block (instance.BLOCK_TOKENS)


class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = "GPU"


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


_encode = msgspec.msgpack.Encoder().encode


class JournaledKVCache(KVCache):
    """The engine's KV cache, noting in order each block it caches (``True, hash``) and evicts
    (``False, hash``): what vLLM's block pool queues as ``BlockStored`` / ``BlockRemoved``."""

    __slots__ = ("journal",)

    def __init__(self, total_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        super().__init__(total_blocks, block_size, prefix_caching=prefix_caching)
        self.journal: list[tuple[bool, int]] = []

    def register(self, h: int, nblocks: int) -> None:
        new = self.prefix_caching and h not in self.entries
        super().register(h, nblocks)
        if new:
            self.journal.append((True, h))

    def _evict(self, need: int) -> None:
        lru = self.lru
        head = list(itertools.islice(lru, need))  # every entry holds a block at least: the evicted
        before = len(lru)
        super()._evict(need)
        self.journal.extend((False, h) for h in head[: before - len(lru)])

    def take_journal(self) -> list[tuple[bool, int]]:
        journal, self.journal = self.journal, []
        return journal


class KvEventPublisher:
    """Publishes an engine's cache changes as vLLM's KV events (see the module docstring)."""

    def __init__(self, endpoint: str, topic: str = "kv", max_known: int = 1 << 20) -> None:
        import zmq

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        if "*" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._sock.bind(endpoint)  # as vLLM: a wildcard binds (several gateways connect)
        else:
            self._sock.connect(endpoint)
        self.topic = topic.encode()
        self.max_known = max_known
        self._known: dict[int, tuple[int | None, tuple[int, ...]]] = {}  # hash -> parent, ids
        self._published: set[int] = set()
        self._seq = 0
        self._kv: JournaledKVCache | None = None
        self.sent_stored = self.sent_removed = 0

    def note(self, ids: Sequence[int], hashes: Sequence[int]) -> None:
        """A prompt's blocks, before the engine may cache them (the events need their token ids)."""
        known = self._known
        parent: int | None = None
        for depth, h in enumerate(hashes):
            if h not in known:
                known[h] = (parent, tuple(ids[depth * BLOCK : (depth + 1) * BLOCK]))
            parent = h
        if len(known) > self.max_known:  # forget the oldest notes that were never cached
            for h in list(known)[: len(known) - self.max_known]:
                if h not in self._published:
                    del known[h]

    def _send(self, events: list[Any]) -> None:
        import zmq

        payload = _encode(_Batch(time.time(), events))
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart([self.topic, self._seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        self._seq += 1

    def publish(self, kv: JournaledKVCache) -> None:
        """Send what changed in ``kv`` since the last call, in order, as one batch (none if nothing
        did); a different cache than last time (the engine lost its cache) is ``AllBlocksCleared``."""
        events: list[Any] = []
        published = self._published
        if kv is not self._kv:
            if self._kv is not None:
                events.append(_Cleared())
                published.clear()
            self._kv = kv
        known = self._known
        for stored, h in kv.take_journal():
            if stored:
                note = known.get(h)
                if note is not None and h not in published:
                    events.append(_Stored([h], note[0], list(note[1]), BLOCK))
                    published.add(h)
                    self.sent_stored += 1
            elif h in published:
                events.append(_Removed([h]))
                published.discard(h)
                self.sent_removed += 1
        if events:
            self._send(events)

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()


class EmulatedTokenization:
    """The emulator's tokenizer (``None`` without ``--tokenizer``) and KV-event publisher."""

    def __init__(self, tokenizer: str | None, endpoint: str | None) -> None:
        from tokenplane.gateway.tokenization import LocalTokenizer

        self.tokenizer = LocalTokenizer(tokenizer) if tokenizer else None
        self.publisher = KvEventPublisher(endpoint) if endpoint else None

    def ids(self, body: Mapping[str, Any], chat: bool) -> list[int] | None:
        tok = self.tokenizer
        if tok is None:
            return None
        if chat:
            ids = tok.chat(body)
            return None if ids is None else list(ids)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return tok.text(prompt)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return list(prompt)
        return None

    def blocks(self, ids: Sequence[int]) -> tuple[int, ...]:
        hashes = tuple(chain_keys(ids, BLOCK))
        if self.publisher is not None:
            self.publisher.note(ids, hashes)
        return hashes


TOKENIZATION_KEY = web.AppKey("tokenization", EmulatedTokenization)


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize``: ``{"tokens", "count", "max_model_len"}``."""
    tok = request.app[TOKENIZATION_KEY]
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError as e:
        return web.json_response({"error": {"message": f"JSON decode error: {e}", "code": 400}}, status=400)
    chat = isinstance(body, dict) and "messages" in body
    ids = tok.ids(body, chat) if isinstance(body, dict) else None
    if ids is None:
        return web.json_response(
            {"error": {"message": "cannot tokenize this prompt", "code": 400}}, status=400
        )
    return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 32768})


async def run_publisher(app: web.Application, engine: Any) -> AsyncIterator[None]:
    """Publish ``engine``'s cache changes after every step it plans (its ``on_plan`` hook)."""
    tok = app.get(TOKENIZATION_KEY)
    pub = tok.publisher if tok is not None else None
    if pub is None:
        yield
        return
    engine.on_plan = lambda: pub.publish(engine.kv)
    try:
        yield
    finally:
        engine.on_plan = None
        pub.close()
