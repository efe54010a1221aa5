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
ids, parents before children) and ``BlockRemoved``. The engine (the twin's) has no eviction hook,
so the publisher diffs the cache's blocks against what it has published, every ``interval_s``
(10 ms of wall time) after a step: an event lags the engine by at most that.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec
from aiohttp import web

from tokenplane.gateway.kv_events import chain_keys

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


class KvEventPublisher:
    """Publishes an engine's cached blocks as vLLM's KV events (see the module docstring)."""

    def __init__(
        self, endpoint: str, topic: str = "kv", interval_s: float = 0.01, max_known: int = 1 << 20
    ) -> None:
        import zmq

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        if "*" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._sock.bind(endpoint)  # as vLLM: a wildcard binds (several gateways connect)
        else:
            self._sock.connect(endpoint)
        self.topic = topic.encode()
        self.interval_s = interval_s
        self.max_known = max_known
        self._known: dict[int, tuple[int | None, tuple[int, ...], int]] = {}  # hash -> parent, ids, depth
        self._published: set[int] = set()
        self._seq = 0
        self._kv: object | None = None
        self.sent_stored = self.sent_removed = 0

    def note(self, ids: Sequence[int], hashes: Sequence[int]) -> None:
        """A prompt's blocks, before the engine may cache them (the events need their token ids)."""
        known = self._known
        parent: int | None = None
        for depth, h in enumerate(hashes):
            if h not in known:
                known[h] = (parent, tuple(ids[depth * BLOCK : (depth + 1) * BLOCK]), depth)
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

    def publish(self, kv: Any) -> None:
        """Send what changed in ``kv`` (the engine's :class:`~tokenplane.sim.kvcache.KVCache`)."""
        entries: Mapping[int, Any] = kv.entries
        events: list[Any] = []
        if kv is not self._kv:
            if self._kv is not None:
                events.append(_Cleared())
                self._published.clear()
            self._kv = kv
        published = self._published
        gone = [h for h in published if h not in entries]
        if gone:
            events.append(_Removed(gone))
            published.difference_update(gone)
            self.sent_removed += len(gone)
        known = self._known
        new = [h for h in entries if h not in published and h in known]
        new.sort(key=lambda h: known[h][2])  # parents first
        for h in new:
            parent, ids, _ = known[h]
            events.append(_Stored([h], parent, list(ids), BLOCK))
            published.add(h)
        self.sent_stored += len(new)
        if events:
            self._send(events)

    async def run(self, engine: Any) -> None:
        steps = -1
        while True:
            await asyncio.sleep(self.interval_s)
            now_steps = engine.record.steps
            if now_steps != steps or engine.kv is not self._kv:
                steps = now_steps
                self.publish(engine.kv)

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
    tok = app.get(TOKENIZATION_KEY)
    pub = tok.publisher if tok is not None else None
    if pub is None:
        yield
        return
    task = asyncio.create_task(pub.run(engine), name="kv-events-publisher")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pub.close()
