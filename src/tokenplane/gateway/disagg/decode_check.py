"""A decode answer checked for a failed KV load before the client sees any of it.

vLLM (0.32, ``kv_load_failure_policy: fail``, its default) fails a decode request whose KV cannot be
pulled with ``finish_reason: error``: a plain request answers 500 ``Internal server error``; a stream
answers 200, its role chunk, then an error event and ``[DONE]``. Either must not reach the client:
it means prefill again (:class:`~tokenplane.gateway.errors.KvTransferFailed`). So a decode attempt
that carries KV-transfer parameters reads its stream up to the first token (or the error) and
hands the relay a reply that replays those bytes first (:class:`Prefetched`); a plain answer is
checked by its status. Nothing is parsed once the first token came.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping

import aiohttp
import msgspec

from tokenplane.gateway.errors import KvTransferFailed, UpstreamTimeout, UpstreamUnavailable
from tokenplane.gateway.proxy import MAX_ERROR_BODY_BYTES, MAX_PENDING_EVENT_BYTES
from tokenplane.gateway.transports.base import Sink, UpstreamReply
from tokenplane.gateway.upstreams import Upstream

_decode = msgspec.json.Decoder().decode
_MORE, _TOKEN, _ERROR = 0, 1, 2


def _verdict(buf: bytes) -> int:
    """Whether the whole events in ``buf`` hold an error (before any token), a token, or neither."""
    for raw in buf.split(b"\n\n"):
        raw = raw.strip()
        if not raw.startswith(b"data:"):
            continue
        payload = raw[5:].strip()
        if payload == b"[DONE]":
            return _TOKEN  # an empty answer: nothing failed
        try:
            obj = _decode(payload)
        except msgspec.DecodeError:
            return _TOKEN  # malformed: the relay's own checks judge it
        if type(obj) is not dict:
            continue
        if "error" in obj:
            return _ERROR
        choices = obj.get("choices")
        if type(choices) is list and choices and type(choices[0]) is dict:
            c = choices[0]
            delta = c.get("delta")
            piece = delta.get("content") if type(delta) is dict else c.get("text")
            if piece or c.get("finish_reason") is not None:
                return _TOKEN
    return _MORE


class Prefetched:
    """An upstream reply whose first bytes were read already: it replays them, then reads on."""

    __slots__ = ("_head", "_inner")

    def __init__(self, inner: UpstreamReply, head: bytes) -> None:
        self._inner = inner
        self._head = head

    @property
    def status(self) -> int:
        return self._inner.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._inner.headers

    async def read(self) -> bytes:
        head, self._head = self._head, b""
        return head + await self._inner.read()

    async def read_some(self, n: int) -> bytes:
        head, self._head = self._head, b""
        return head[:n] if len(head) >= n else head + await self._inner.read_some(n - len(head))

    def readany(self) -> Awaitable[bytes]:
        head = self._head
        if not head:
            return self._inner.readany()
        self._head = b""
        done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        done.set_result(head)
        return done

    def limit_idle(self, idle_s: float) -> None:
        self._inner.limit_idle(idle_s)

    def park(self, sink: Sink) -> asyncio.Future[None] | None:
        return None if self._head else self._inner.park(sink)

    def unpark(self) -> None:
        self._inner.unpark()

    def release(self) -> None:
        self._inner.release()

    def close(self) -> None:
        self._inner.close()


def _failed(upstream: Upstream) -> KvTransferFailed:
    return KvTransferFailed(f"decode instance {upstream.id} could not load the prefilled KV cache")


async def check_plain(resp: UpstreamReply, upstream: Upstream) -> UpstreamReply:
    """A plain decode answer: 500 is vLLM's answer to a failed KV load."""
    if resp.status == 500:
        with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError):
            await resp.read_some(MAX_ERROR_BODY_BYTES)
        raise _failed(upstream)
    return resp


async def check_stream(resp: UpstreamReply, upstream: Upstream) -> UpstreamReply:
    """A streamed decode answer, read up to its first token: an error event before it means the KV
    load failed. Returns the reply to relay (the bytes read replayed first)."""
    if resp.status != 200:
        return await check_plain(resp, upstream)
    buf = b""
    while True:
        try:
            data = await resp.readany()
        except TimeoutError:
            raise UpstreamTimeout(f"instance {upstream.id} sent no token in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            why = type(exc).__name__
            raise UpstreamUnavailable(f"instance {upstream.id} broke the stream: {why}") from None
        if not data:
            return Prefetched(resp, buf)  # ended early: the relay says how
        buf += data
        end = buf.rfind(b"\n\n")
        verdict = _verdict(buf[:end]) if end >= 0 else _MORE
        if verdict == _ERROR:
            raise _failed(upstream)
        if verdict == _TOKEN or len(buf) > MAX_PENDING_EVENT_BYTES:
            return Prefetched(resp, buf)


__all__ = ["Prefetched", "check_plain", "check_stream"]
