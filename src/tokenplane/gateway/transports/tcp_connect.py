"""Opening a TCP connection to an instance, with a deadline that a stalled event loop does not break.

``asyncio.wait_for(loop.create_connection(...), t)`` fails when this process's loop did not get to
finish the connection within ``t``, even where the kernel completed the handshake in microseconds.
On a busy machine a loop stalled for seconds then reports every instance it was connecting to as
unreachable at once and marks them down: with two CPU vLLM instances and the gateway on 2 busy cores,
35 of a burst's 38 requests failed with 502 that way, both instances taken out. Here the deadline
applies to the handshake itself: when the timer fires, the socket is asked whether it connected,
and one that did is used. An instance that never answers the handshake still times out.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

Address = tuple[Any, ...]


def connected(sock: socket.socket) -> bool:
    """The handshake finished, in the kernel, whether or not this loop has seen it yet."""
    try:
        sock.getpeername()
    except OSError:  # ENOTCONN: still connecting, or refused
        return False
    return True


async def _addresses(
    loop: asyncio.AbstractEventLoop, host: str, port: int, timeout_s: float | None
) -> list[tuple[int, int, int, Address]]:
    """``(family, type, proto, address)`` to try in order. An IP literal skips the resolver (as
    ``create_connection`` does: no thread hop per new connection)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{host} not resolved within {timeout_s:g} s") from None
        return [(family, kind, proto, address) for family, kind, proto, _, address in infos]
    if ip.version == 4:
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, (host, port))]
    return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, (host, port, 0, 0))]


async def _handshake(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, address: Address, deadline: float | None
) -> None:
    left = None if deadline is None else max(0.0, deadline - loop.time())
    try:
        await asyncio.wait_for(loop.sock_connect(sock, address), left)
    except TimeoutError:
        if not connected(sock):
            raise


async def open_tcp(
    loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol, host: str, port: int, timeout_s: float | None
) -> None:
    """Connect ``protocol`` to ``(host, port)``: each resolved address in turn until one answers,
    all within ``timeout_s`` (resolution included). Raises ``OSError``: the last address's error, or
    ``TimeoutError`` naming what did not finish in time (the resolution or the handshake)."""
    deadline = None if timeout_s is None else loop.time() + timeout_s
    candidates = await _addresses(loop, host, port, timeout_s)
    if not candidates:
        raise OSError(f"{host} resolved to no address")
    error: OSError | None = None
    for family, kind, proto, address in candidates:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await _handshake(loop, sock, address, deadline)
            await loop.create_connection(lambda: protocol, sock=sock)
            return
        except TimeoutError as exc:
            sock.close()
            # The deadline's own (no errno), named; the OS's ETIMEDOUT keeps its message.
            error = exc if exc.errno is not None else TimeoutError(f"no handshake within {timeout_s:g} s")
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    assert error is not None
    raise error
