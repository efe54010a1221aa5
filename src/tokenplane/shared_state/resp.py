"""The request path's own Redis connection: one pipelined connection, hiredis's parser and packer.

Why not the ``redis`` package's client here (it does everything else: pub/sub, pings, lease
renewals): per command it costs about as much CPU as the gateway's whole request path does
without Redis (``bench/replicas.py``), which would make the Redis backend cost several times the
memory backend per request. This connection does only what the request path needs: ``EVALSHA``
of the backend's scripts (loaded with ``SCRIPT LOAD`` on connect), the part of each command that is
the same for every request encoded once (:func:`hiredis.pack_command`), replies read with
:class:`hiredis.Reader`. Commands from every
request in flight share the one connection: those written in the same event-loop iteration go out
in one write, and the replies come back in order (Redis answers a connection's commands in the
order they came), so each request costs one pipelined round trip and no connection of its own.

Commands whose reply nobody waits for (:meth:`RespConnection.send`: a request's end) go with
``CLIENT REPLY SKIP`` (Redis sends no reply, so this process neither wakes up for it nor reads it)
and wait up to :data:`SEND_DELAY_S` for the next command's write, so that at a steady load a
request's end and the next request's acquire leave in one write: each of the gateway's writes to
a loopback socket costs it the kernel's whole delivery of the segment, as much CPU as a tenth of
the request path.

Failure: a reply slower than ``timeout_s`` (checked by one timer, not one per call), a reset or a
refused connection fails every call in flight with :class:`BackendUnavailable` and closes the
connection; the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import hiredis

from tokenplane.shared_state.errors import BackendUnavailable

Arg = str | int | float | bytes
SEND_DELAY_S = 0.002
"""How long a command sent without waiting for its reply may wait for company (see above)."""
_SKIP = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$4\r\nSKIP\r\n"


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: RespConnection) -> None:
        self.owner = owner
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.owner._proto is not self:  # a connection given up on: its replies match nothing
            return
        reader = self.reader
        reader.feed(data)
        waiters = self.owner.waiters
        while True:
            reply = reader.gets()
            if reply is False:
                return
            if not waiters:
                continue
            fut = waiters.popleft()[1]
            if fut is not None and not fut.done():
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.lost(BackendUnavailable(f"connection to Redis lost: {exc or 'closed'}"))


class RespConnection:
    """A lazily opened, pipelined connection to the Redis at ``url`` (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float, scripts: Sequence[str] = ()) -> None:
        self.url = url
        self.scripts = tuple(scripts)
        self.timeout_s = timeout_s
        self.waiters: collections.deque[tuple[float, asyncio.Future[Any] | None]] = collections.deque()
        self._proto: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._later: asyncio.TimerHandle | None = None  # a flush for sent commands only
        # the loop of the latest connection: asking asyncio for it costs a getpid() system call
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.TimerHandle | None = None

    # -- connection -----------------------------------------------------------------------------
    async def _connect(self) -> _Protocol:
        loop = self._loop = asyncio.get_running_loop()
        u = urlparse(self.url)
        proto = _Protocol(self)
        try:
            if u.scheme == "unix":
                coro = loop.create_unix_connection(lambda: proto, u.path)
            else:
                coro = loop.create_connection(lambda: proto, u.hostname or "127.0.0.1", u.port or 6379)
            await asyncio.wait_for(coro, self.timeout_s)
        except (OSError, TimeoutError) as exc:
            raise BackendUnavailable(f"cannot connect to Redis: {exc}") from exc
        setup: list[tuple[Arg, ...]] = []
        if u.password:
            auth: tuple[Arg, ...] = ("AUTH", unquote(u.password))
            setup.append(("AUTH", unquote(u.username), unquote(u.password)) if u.username else auth)
        db = (u.path or "/0").lstrip("/")
        if u.scheme != "unix" and db and db != "0":
            setup.append(("SELECT", int(db)))
        # loaded up front, so that a reply nobody waits for (send) is never NOSCRIPT
        setup += [("SCRIPT", "LOAD", script) for script in self.scripts]
        self._proto = proto
        for command in setup:
            reply = await self._call(command)
            if isinstance(reply, hiredis.ReplyError):
                self.close()
                raise BackendUnavailable(f"Redis refused {command[0]!r}: {reply}")
        return proto

    def lost(self, exc: BackendUnavailable) -> None:
        self._proto = None
        waiters, self.waiters = self.waiters, collections.deque()
        for _, fut in waiters:
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        self._out = []
        if self._later is not None:
            self._later.cancel()
            self._later = None

    def close(self) -> None:
        proto = self._proto
        if proto is not None and proto.transport is not None:
            proto.transport.close()
        self.lost(BackendUnavailable("connection closed"))
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        return loop if loop is not None else asyncio.get_running_loop()

    # -- commands -------------------------------------------------------------------------------
    def _write(self, command: Sequence[Arg], fut: asyncio.Future[Any] | None) -> None:
        self._write_raw(hiredis.pack_command(tuple(command)), fut)  # type: ignore[arg-type]

    def _write_raw(self, data: bytes, fut: asyncio.Future[Any] | None) -> None:
        self._out.append(data)
        self.waiters.append((time.monotonic(), fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._running_loop().call_soon(self._flush)
        if self._watchdog is None:
            self._watchdog = self._running_loop().call_later(self.timeout_s, self._check)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._later is not None:
            self._later.cancel()
            self._later = None
        out, self._out = self._out, []
        proto = self._proto
        if out and proto is not None and proto.transport is not None:
            proto.transport.write(b"".join(out))

    def _check(self) -> None:
        """One timer for every call in flight: the oldest reply is overdue, the connection is."""
        self._watchdog = None
        if not self.waiters:
            return
        age = time.monotonic() - self.waiters[0][0]
        if age >= self.timeout_s:
            proto = self._proto
            self.lost(BackendUnavailable(f"Redis did not answer within {self.timeout_s} s"))
            if proto is not None and proto.transport is not None:
                proto.transport.abort()
            return
        self._watchdog = self._running_loop().call_later(self.timeout_s - age, self._check)

    async def _call(self, command: Sequence[Arg]) -> Any:
        fut: asyncio.Future[Any] = self._running_loop().create_future()
        self._write(command, fut)
        return await fut

    async def _ready(self) -> None:
        if self._proto is not None:
            return
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._connecting)

    def prepare(self, script: str, keys: Sequence[Arg], args: Sequence[Arg], n_more: int) -> bytes:
        """The encoded head of ``EVALSHA script keys args`` followed by ``n_more`` arguments given
        per call (:meth:`run`, :meth:`send`): what is the same for every call is encoded once."""
        sha = hashlib.sha1(script.encode()).hexdigest()
        head: bytes = hiredis.pack_command(("EVALSHA", sha, len(keys), *keys, *args))  # type: ignore[arg-type]
        count = 3 + len(keys) + len(args) + n_more
        return b"*%d\r\n" % count + head[head.index(b"\r\n") + 2 :]

    def _encode(self, head: bytes, more: Sequence[bytes]) -> bytes:
        return head + b"".join(b"$%d\r\n%s\r\n" % (len(m), m) for m in more)

    async def run(self, head: bytes, more: Sequence[bytes]) -> Any:
        """Run a prepared script command with its last arguments; its reply."""
        if self._proto is None:
            await self._ready()
        fut: asyncio.Future[Any] = self._running_loop().create_future()
        self._write_raw(self._encode(head, more), fut)
        reply = await fut
        if isinstance(reply, hiredis.ReplyError):
            # NOSCRIPT (a SCRIPT FLUSH): a new connection loads the scripts again
            self.close()
            raise BackendUnavailable(f"Redis script failed: {reply}")
        return reply

    def send(self, head: bytes, more: Sequence[bytes]) -> None:
        """Run a prepared script command without a reply, written with the next command or within
        :data:`SEND_DELAY_S`; nothing when not connected."""
        if self._proto is None:
            return
        self._out.append(_SKIP + self._encode(head, more))
        if not self._flush_scheduled and self._later is None:
            self._later = self._running_loop().call_later(SEND_DELAY_S, self._flush)
