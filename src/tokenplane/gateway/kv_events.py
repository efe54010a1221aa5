"""Exact per-instance prefix-cache state from vLLM's KV events (ZMQ), for precise prefix routing.

vLLM started with ``--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
"endpoint":"tcp://127.0.0.1:5557","topic":"kv"}'`` CONNECTS a PUB socket to that endpoint and sends
one three-frame message per batch of cache changes: ``topic``, an 8-byte big-endian sequence number
and a msgpack payload. So the gateway BINDS a SUB socket per instance (one endpoint per instance:
a batch says nothing about who sent it). Given ``tcp://*:PORT`` vLLM binds instead; with
``kv_events: {connect: true}`` the gateway connects to it, and every gateway replica can subscribe
to the same instance. The payload is ``KVEventBatch`` encoded by msgspec as an
array ``[ts, events, data_parallel_rank?]``; each event is a map tagged ``type``:

* ``BlockStored``: ``block_hashes`` (one per full block, ints by default, bytes with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``), ``parent_block_hash`` (the block before the first one,
  None at the start of a prompt), ``token_ids`` (``len(block_hashes) * block_size`` of them),
  ``block_size``, ``lora_id``, ``medium`` (None or ``"GPU"`` for device memory; ``"CPU"``... for
  offload tiers) and optional fields newer versions add (ignored here);
* ``BlockRemoved``: ``block_hashes``, ``medium``;
* ``AllBlocksCleared``: the whole cache was reset.

Design: why token content, not vLLM's hashes. vLLM's block hash is ``H(parent, token_ids, extra)``
with a configurable algorithm (``--prefix-caching-hash-algo``: pickle- or CBOR-serialised sha256 or
xxhash) and a seed (fixed for sha256, random per process for xxhash unless ``PYTHONHASHSEED``), and
by default the event carries only its low 64 bits. Reproducing it in the gateway would couple us to
one vLLM version's serialisation. But every ``BlockStored`` carries the block's TOKEN IDS and its
parent's hash, so :class:`InstanceKvCache` recomputes its own chain key per block,
``content_key(parent's key, token_ids, lora_id)``, and keeps ``vLLM hash -> content key`` so that
``BlockRemoved`` (hashes only) can be applied. A request's token ids, chunked by the instance's
block size and chained the same way, are then matched exactly against each instance's set: the
answer is what vLLM will find in its prefix cache (up to a 64-bit collision), independent of the
hash algorithm, seed and version. What it needs is the request's token ids: the gateway works on
text, so precise mode applies where token ids are available (a ``prompt`` given as token ids, a
tokenizer the deployment configures, or vLLM's ``/tokenize``); the approximate character-block
index stays the default and the fallback.

State is bounded (``max_blocks`` per instance, oldest stores dropped first: an instance with a
bigger cache than the bound is under-reported, never over-reported except for the dropped blocks'
descendants, which stay until removed). Stale state is expired, not replayed (vLLM's optional
replay socket is not used): a gap in sequence numbers (the SUB socket dropped messages, so a
``BlockRemoved`` may be lost) or a sequence that starts again (the engine restarted with an empty
cache) drops the instance's whole state, counted in ``gaps`` / ``restarts``; it is rebuilt from the
events that follow. A gateway replica that starts late knows only the blocks stored after it
subscribed. Both under-report for a while (requests go to the least-loaded instance), and neither
reports a block the engine no longer holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from tokenplane.gateway.token_blocks import TokenBlocks

log = logging.getLogger(__name__)

DEFAULT_MAX_BLOCKS = 1 << 18
"""Per instance: 256 Ki blocks (4 Mi tokens at block size 16), about 40 MB at most."""

_DEVICE_MEDIA = frozenset({None, "GPU", "gpu"})

BlockHash = int | bytes


# -- the wire format (a mirror of vllm.distributed.kv_events, decoding only) ---------------------
class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[BlockHash] = []
    parent_block_hash: BlockHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[BlockHash] = []
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[msgspec.Raw]  # decoded one by one, so an event type we don't know is skipped
    data_parallel_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_event_decoder: msgspec.msgpack.Decoder[KvEvent] = msgspec.msgpack.Decoder(KvEvent)


def decode_batch(payload: bytes) -> tuple[float, list[KvEvent], int]:
    """``(ts, known events, events skipped as unknown)``; raises ``msgspec.DecodeError`` on garbage."""
    batch = _batch_decoder.decode(payload)
    events: list[KvEvent] = []
    skipped = 0
    for raw in batch.events:
        try:
            events.append(_event_decoder.decode(raw))
        except msgspec.ValidationError:
            skipped += 1
    return batch.ts, events, skipped


# -- content keys ---------------------------------------------------------------------------------
def content_key(parent: int | None, token_ids: Sequence[int], lora_id: int | None = None) -> int:
    """Chain key of one full block: covers every token before it (through ``parent``) and the LoRA.

    Python's hash of a tuple of ints is deterministic across processes (only str/bytes hashing is
    salted), and the gateway computes both sides, so nothing needs to match vLLM's own hashing.
    """
    return hash((parent if parent is not None else ("root", lora_id), tuple(token_ids)))


def chain_keys(token_ids: Sequence[int], block_size: int, lora_id: int | None = None) -> list[int]:
    """Content keys of every full block of a prompt's token ids (what vLLM can cache of it)."""
    keys: list[int] = []
    parent: int | None = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = content_key(parent, token_ids[start : start + block_size], lora_id)
        keys.append(parent)
    return keys


# -- per-instance state ---------------------------------------------------------------------------
class InstanceKvCache:
    """The device-memory prefix cache of one instance, as its KV events describe it."""

    __slots__ = (
        "_blocks",
        "_keys",
        "block_size",
        "cleared",
        "decode_errors",
        "dropped",
        "gaps",
        "last_event_ts",
        "last_seq",
        "max_blocks",
        "removed",
        "restarts",
        "skipped",
        "stored",
        "unlinked",
    )

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks <= 0:
            raise ValueError("max_blocks must be positive")
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[BlockHash, int] = OrderedDict()  # vLLM hash -> content key
        self._keys: dict[int, int] = {}  # content key -> how many vLLM hashes hold it
        self.block_size = 0
        self.last_seq: int | None = None
        self.last_event_ts = 0.0
        self.stored = self.removed = self.cleared = self.dropped = 0
        self.gaps = self.decode_errors = self.skipped = self.unlinked = self.restarts = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def observe_seq(self, seq: int) -> None:
        """A gap (messages lost) or a sequence that starts again (the engine restarted) makes the
        state untrustworthy: it is dropped, and rebuilt from the events that follow."""
        last = self.last_seq
        if last is not None and (seq > last + 1 or seq <= last):
            if seq > last + 1:
                self.gaps += 1
            else:
                self.restarts += 1
            self.clear()
        self.last_seq = seq

    def clear(self) -> None:
        self._blocks.clear()
        self._keys.clear()

    def apply(self, events: Iterable[KvEvent], ts: float = 0.0) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                if event.medium in _DEVICE_MEDIA:
                    for h in event.block_hashes:
                        self._drop(h)
                        self.removed += 1
            else:
                self.clear()
                self.cleared += 1
        if ts > self.last_event_ts:
            self.last_event_ts = ts

    def _store(self, ev: BlockStored) -> None:
        if ev.medium not in _DEVICE_MEDIA or not ev.block_hashes:
            return
        n = len(ev.block_hashes)
        size = ev.block_size or (len(ev.token_ids) // n if len(ev.token_ids) % n == 0 else 0)
        if size <= 0 or len(ev.token_ids) != n * size:
            self.unlinked += n  # cannot tell which tokens belong to which block
            return
        self.block_size = size
        parent: int | None = None
        if ev.parent_block_hash is not None:
            parent = self._blocks.get(ev.parent_block_hash)
            if parent is None:  # parent evicted or never seen (gap, bound): no sound chain key
                self.unlinked += n
                return
        blocks, keys = self._blocks, self._keys
        for i, h in enumerate(ev.block_hashes):
            parent = content_key(parent, ev.token_ids[i * size : (i + 1) * size], ev.lora_id)
            old = blocks.get(h)
            if old is not None:
                if old == parent:
                    blocks.move_to_end(h)
                    continue
                self._drop(h)
            blocks[h] = parent
            keys[parent] = keys.get(parent, 0) + 1
            self.stored += 1
        while len(blocks) > self.max_blocks:
            self._drop(next(iter(blocks)))
            self.dropped += 1

    def _drop(self, h: BlockHash) -> None:
        key = self._blocks.pop(h, None)
        if key is None:
            return
        left = self._keys[key] - 1
        if left:
            self._keys[key] = left
        else:
            del self._keys[key]

    def match(self, keys: Sequence[int]) -> int:
        """How many leading blocks of a request (its :func:`chain_keys`) this cache holds."""
        n = 0
        for k in keys:
            if k not in self._keys:
                break
            n += 1
        return n


class KvEventsIndex:
    """Every subscribed instance's :class:`InstanceKvCache`; no I/O (the subscriber feeds it)."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.instances: dict[str, InstanceKvCache] = {}

    def cache(self, instance_id: str) -> InstanceKvCache:
        cache = self.instances.get(instance_id)
        if cache is None:
            cache = self.instances[instance_id] = InstanceKvCache(self.max_blocks)
        return cache

    def ingest(self, instance_id: str, frames: Sequence[bytes]) -> None:
        """Apply one ZMQ message: ``[topic, seq, payload]`` (or just ``[payload]``)."""
        cache = self.cache(instance_id)
        if len(frames) >= 3:
            cache.observe_seq(int.from_bytes(frames[-2], "big"))
        try:
            ts, events, skipped = decode_batch(frames[-1])
        except msgspec.DecodeError:
            cache.decode_errors += 1
            return
        cache.skipped += skipped
        cache.apply(events, ts)

    def match_tokens(
        self, token_ids: Sequence[int], lora_id: int | None = None, blocks: TokenBlocks | None = None
    ) -> dict[str, int]:
        """Cached leading TOKENS of a prompt per instance (0 omitted); exact, per its block size.
        ``blocks``: the same ids with their keys (hashed once per request, new blocks only)."""
        out: dict[str, int] = {}
        by_size: dict[int, list[int]] = {}
        for iid, cache in self.instances.items():
            size = cache.block_size
            if size <= 0 or not len(cache):
                continue
            keys = by_size.get(size)
            if keys is None:
                keys = by_size[size] = (
                    chain_keys(token_ids, size, lora_id) if blocks is None else blocks.keys(size, lora_id)
                )
            hit = cache.match(keys)
            if hit:
                out[iid] = hit * size
        return out

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {
            iid: {
                "blocks": len(c),
                "block_size": c.block_size,
                "stored": c.stored,
                "removed": c.removed,
                "cleared": c.cleared,
                "dropped": c.dropped,
                "gaps": c.gaps,
                "restarts": c.restarts,
                "decode_errors": c.decode_errors,
                "unlinked": c.unlinked,
                "last_event_ts": c.last_event_ts,
            }
            for iid, c in self.instances.items()
        }


# -- the ZMQ side ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KvEventsSource:
    instance_id: str
    endpoint: str
    topic: str = "kv"
    connect: bool = False  # the publisher binds (vLLM with tcp://*:PORT): several replicas subscribe


class KvEventsSubscriber:
    """One bound SUB socket and reader task per source, feeding a :class:`KvEventsIndex`.

    Needs ``pyzmq`` (the ``kv-events`` extra); :meth:`start` raises ``RuntimeError`` without it.
    """

    def __init__(self, sources: Sequence[KvEventsSource], index: KvEventsIndex | None = None) -> None:
        self.sources = list(sources)
        self.index = index if index is not None else KvEventsIndex()
        self._ctx: Any = None
        self._sockets: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.endpoints: dict[str, str] = {}  # instance id -> endpoint actually bound

    async def start(self) -> None:
        try:
            import zmq
            import zmq.asyncio
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise RuntimeError("kv_events needs pyzmq: pip install 'tokenplane[kv-events]'") from e
        self._ctx = zmq.asyncio.Context()
        try:
            for src in self.sources:
                sock = self._ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
                if src.connect:
                    sock.connect(src.endpoint)
                else:
                    sock.bind(src.endpoint)
                self._sockets.append(sock)
                self.endpoints[src.instance_id] = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
                self.index.cache(src.instance_id)
                self._tasks.append(
                    asyncio.create_task(
                        self._read(src.instance_id, sock), name=f"kv-events:{src.instance_id}"
                    )
                )
        except BaseException:
            await self.stop()
            raise

    async def _read(self, instance_id: str, sock: Any) -> None:
        ingest = self.index.ingest
        while True:
            frames = await sock.recv_multipart()
            try:
                ingest(instance_id, frames)
            except Exception:  # one bad message must not end the subscription
                log.exception("kv event from %s could not be applied", instance_id)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def wait_for(self, instance_id: str, predicate: Any, timeout: float = 5.0) -> bool:
        """Poll until ``predicate(cache)`` holds (tests and warm-up); False on timeout."""
        deadline = time.monotonic() + timeout
        cache = self.index.cache(instance_id)
        while not predicate(cache):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True


def sources_from_instances(instances: Iterable[Any]) -> list[KvEventsSource]:
    """Sources for the configured instances that have ``kv_events`` set."""
    out: list[KvEventsSource] = []
    for inst in instances:
        cfg = getattr(inst, "kv_events", None)
        if cfg is not None:
            out.append(KvEventsSource(inst.id, cfg.endpoint, cfg.topic, bool(getattr(cfg, "connect", False))))
    return out
